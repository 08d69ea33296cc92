"""Polling efficiency on a virtual clock: task durations from 5 s to 10 min (log-uniform), our
PollPolicy (the core's own schedule) against fixed-interval polling at 0.5 s, 2 s and 6 +- 1.5 s.
Measures polls per task and detection delay (median, p95). Target: fewer polls than fixed 2 s,
with p95 detection delay at most 15% of the task's duration plus 1 s.

Run: python bench/polling.py [--tasks N] [--grid]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable

from imggw_client import PollPolicy
from imggw_client._core.poll import poll_interval

Schedule = Callable[[int, random.Random], float]


def durations(n: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [math.exp(rng.uniform(math.log(5), math.log(600))) for _ in range(n)]


def simulate(schedule: Schedule, tasks: list[float], seed: int = 2) -> dict[str, float]:
    """A wait queries at once, then after each interval, until it sees the task finished."""
    rng = random.Random(seed)
    polls, delays, slack = [], [], []
    for duration in tasks:
        now, n, count = 0.0, 0, 1
        while now < duration:
            now += schedule(n, rng)
            n += 1
            count += 1
        polls.append(count)
        delays.append(now - duration)
        slack.append((now - duration) / (0.15 * duration + 1.0))
    delays.sort()
    slack.sort()
    return {
        "polls_per_task": statistics.fmean(polls),
        "delay_median_s": statistics.median(delays),
        "delay_p95_s": delays[int(0.95 * len(delays))],
        "p95_of_delay_over_bound": slack[int(0.95 * len(slack))],
    }


def policy(p: PollPolicy) -> Schedule:
    return lambda n, rng: poll_interval(p, n, rng)


def fixed(seconds: float, jitter: float = 0.0) -> Schedule:
    return lambda n, rng: seconds + rng.uniform(-jitter, jitter)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--grid", action="store_true", help="search the policy space")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tasks = durations(args.tasks)
    contenders: dict[str, Schedule] = {
        "fixed 0.5 s": fixed(0.5),
        "fixed 2 s (baseline)": fixed(2.0),
        "fixed 6 +- 1.5 s": fixed(6.0, 1.5),
        f"default {PollPolicy()}": policy(PollPolicy()),
    }
    if args.grid:
        for initial in (0.5, 1.0, 2.0):
            for multiplier in (1.1, 1.15, 1.2, 1.3, 1.5):
                for cap in (10.0, 15.0, 30.0, 60.0):
                    p = PollPolicy(
                        initial_interval=initial, multiplier=multiplier, max_interval=cap
                    )
                    contenders[f"{initial:g}s x{multiplier:g} cap {cap:g}s"] = policy(p)
    results = {name: simulate(schedule, tasks) for name, schedule in contenders.items()}
    baseline = results["fixed 2 s (baseline)"]["polls_per_task"]
    for r in results.values():
        r["polls_vs_fixed_2s"] = r["polls_per_task"] / baseline
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(
        f"{args.tasks} tasks, durations 5 s to 10 min (log-uniform); bound = 0.15 x duration + 1 s"
    )
    print(f"{'schedule':<70}{'polls':>7}{'vs 2s':>7}{'median':>8}{'p95':>8}{'p95/bound':>10}")
    rows = (
        sorted(results.items(), key=lambda kv: kv[1]["polls_per_task"])
        if args.grid
        else results.items()
    )
    for name, r in rows:
        ok = r["p95_of_delay_over_bound"] <= 1.0 and r["polls_vs_fixed_2s"] < 1.0
        print(f"{name:<70}{r['polls_per_task']:>7.1f}{r['polls_vs_fixed_2s']:>6.2f}x"
              f"{r['delay_median_s']:>7.2f}s{r['delay_p95_s']:>7.2f}s{r['p95_of_delay_over_bound']:>9.2f}"
              f"{'  meets target' if ok else ''}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
