"""Polls that learn (DESIGN 15): queries per task and the delay from a task's finish to the
wait's return, for the learned schedule against today's (``learn=False``), against the
reference gateway served in its own process.

Real life is scaled 10x down: tasks of 30-90 s run 3-9 s, the poll policy is PollPolicy()
divided by 10 (0.1 s, x1.15, up to 3 s), and tasks are submitted steadily at 20 a second
(2 a second in real life). The first ``--warm`` tasks teach the model and are not counted;
the next ``--tasks`` are. The promise (DESIGN 15): a finished task is seen within 15% of its
running time plus one initial interval, and never more than one max interval after it
finished, for every task at least as slow as the fastest that its model's window (the last 50
lessons) timed, seeing it running and then finished.
Targets: a median of at most 7 and a p95 of at most 10 queries per task, no task over the
promise; stretch, a mean of 5. Shapes: ``uniform`` (the issue's), ``longtail`` (lognormal),
``bimodal`` (30% fast, 70% slow) and ``slowdown`` (3x slower from the middle of the counted
tasks). Each task's true start and duration come from the gateway itself, after the run.

``--virtual`` measures the schedules alone on a virtual clock instead (no gateway, seconds):
PollPolicy() against fixed intervals on tasks of 5 s to 10 min (log-uniform), and the learned
schedule against today's on every shape, unscaled.

Run: python bench/polling.py [--quick] [--shape NAME|all] [--json]
     python bench/polling.py --virtual [--grid] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import httpx

from imggw_client import ImageRequest, PollPolicy, TaskStatus
from imggw_client._core import surfaces
from imggw_client._core.durations import WINDOW, DurationModel
from imggw_client._core.poll import LearnedWait, poll_interval
from imggw_client._core.wire import Reply, WireRequest

SCALE = 10.0
DEFAULT = PollPolicy()
SCALED = PollPolicy(
    initial_interval=DEFAULT.initial_interval / SCALE,
    max_interval=DEFAULT.max_interval / SCALE,
    multiplier=DEFAULT.multiplier,
)
SHAPES = ("uniform", "longtail", "bimodal", "slowdown")
KEY = "bench-key"
KIND = ("beta", "1k")
ENV_SHAPE, ENV_SLOW_FROM = "IMGGW_BENCH_SHAPE", "IMGGW_BENCH_SLOW_FROM"


def shape_duration(shape: str, index: int, slow_from: int, scale: float = 1.0) -> float:
    """The running time of task ``index`` (0-based), seconds at 10x speed times ``scale``: a
    function of the index alone, so that both schedules meet the same tasks."""
    rng = random.Random(f"{shape}/{index}")
    if shape == "longtail":
        seconds = 5.0 * math.exp(rng.gauss(0.0, 0.4))
    elif shape == "bimodal":
        seconds = rng.uniform(2.0, 3.0) if rng.random() < 0.3 else rng.uniform(7.0, 9.0)
    else:
        seconds = rng.uniform(3.0, 9.0)
        if shape == "slowdown" and index >= slow_from:
            seconds *= 3
    return seconds * scale


# ---------------------------------------------------------------------------- the gateway
# Served by _server.py in a child process as "polling:app": the module is imported there (not
# run) and ``app`` built on first access, from the environment this process passes down.


def _build_app() -> Any:
    from imggw_client.mock import MockGateway

    shape = os.environ.get(ENV_SHAPE, "uniform")
    slow_from = int(os.environ.get(ENV_SLOW_FROM, "0"))

    class ShapedGateway(MockGateway):
        # The reference gateway draws durations uniformly; each task's is replaced by its
        # shape's, by task id, once created.
        def _create(self, *args: Any) -> Any:
            task = super()._create(*args)
            task.duration = shape_duration(shape, int(task.id) - 1, slow_from)
            return task

    gateway = ShapedGateway(api_keys=[KEY], seed=1)
    inner = gateway.asgi()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        """The gateway, and ``GET /_bench/tasks``: every task's start (the gateway's monotonic
        clock, the same as the bench's on one machine) and running time."""
        if scope["type"] == "http" and scope["path"] == "/_bench/tasks":
            with gateway._lock:
                body = json.dumps(
                    {t.id: [t.created, t.duration] for t in gateway._tasks.values()}
                ).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await inner(scope, receive, send)

    return app


_APP: Any = None


def __getattr__(name: str) -> Any:
    global _APP
    if name != "app":
        raise AttributeError(name)
    if _APP is None:
        _APP = _build_app()
    return _APP


# ---------------------------------------------------------------------------- the waits


@dataclass
class Run:
    """What one schedule's run saw; times on this machine's monotonic clock."""

    learn: bool
    policy: PollPolicy
    model: DurationModel = field(default_factory=DurationModel)
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    started: dict[str, float] = field(default_factory=dict)  # task id -> submit sent
    returned: dict[str, float] = field(default_factory=dict)  # task id -> wait returned
    queries: dict[str, int] = field(default_factory=dict)
    taught: list[tuple[float, str, bool]] = field(default_factory=list)  # when, id, timed
    errors: int = 0


class Wire:
    """A tiny async driver over the SDK's own wire helpers (surface B)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def _send(self, wire: WireRequest) -> Reply:
        response = await self.http.request(
            wire.method, wire.path, params=wire.params, headers=wire.headers, content=wire.body
        )
        return Reply(response.status_code, response.headers, response.content)

    async def submit(self, index: int) -> str:
        key = f"bench-{os.getpid()}-{time.monotonic_ns()}-{index}"
        request = ImageRequest(f"polling bench {index}", aspect_ratio="1:1", resolution="1k")
        reply = await self._send(surfaces.build_submit("beta", request, key))
        return surfaces.read_submit("beta", reply, key, time.monotonic()).task_id

    async def done(self, task_id: str) -> bool:
        reply = await self._send(surfaces.build_query("beta", task_id))
        task = surfaces.read_task("beta", reply, task_id, time.monotonic())
        if task.status is TaskStatus.FAILED:
            raise RuntimeError(f"task {task_id} failed")
        return task.status is TaskStatus.SUCCEEDED


# Once Client and AsyncClient take PollPolicy(learn=...), both waits below become
#     await client.wait(submission, timeout=...)
# on an AsyncClient(poll=PollPolicy(..., learn=run.learn)) whose http_client has an event hook
# counting GETs per task path; the rest of this file (the gateway, the ground truth from
# /_bench/tasks, the figures) stays as it is.


def teach(run: Run, plan: LearnedWait, now: float, task_id: str) -> None:
    """Lets the wait teach the model, noting whether it timed the task (saw it running)."""
    if plan.finished(now):
        run.taught.append((now, task_id, run.model.observations(KIND, now)[-1][0] > 0))


async def learned_wait(run: Run, wire: Wire, task_id: str) -> None:
    clock = time.monotonic
    plan = LearnedWait(run.policy, run.model, KIND, started=run.started[task_id], now=clock(),
                       rng=run.rng)  # fmt: skip
    await asyncio.sleep(plan.first_sleep(clock()))
    while True:
        sent = clock()
        finished = await wire.done(task_id)
        now = clock()
        run.queries[task_id] += 1
        if finished:
            run.returned[task_id] = now
            teach(run, plan, now, task_id)
            return
        await asyncio.sleep(plan.active(sent, now))


async def todays_wait(run: Run, wire: Wire, task_id: str) -> None:
    n = 0
    while True:
        finished = await wire.done(task_id)
        run.queries[task_id] += 1
        if finished:
            run.returned[task_id] = time.monotonic()
            return
        await asyncio.sleep(poll_interval(run.policy, n, run.rng))
        n += 1


async def drive(base: str, run: Run, total: int, rate: float) -> dict[str, list[float]]:
    """Submits ``total`` tasks at ``rate`` a second, waits for each, returns the gateway's
    record of every task: ``{id: [created, duration]}``."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits,
                                 timeout=30.0) as http:  # fmt: skip
        wire = Wire(http)
        wait = learned_wait if run.learn else todays_wait

        async def one(index: int) -> None:
            sent = time.monotonic()
            try:
                task_id = await wire.submit(index)
                run.started[task_id], run.queries[task_id] = sent, 0
                await wait(run, wire, task_id)
            except Exception:  # counted and shown: the figures leave such a task out
                run.errors += 1

        begin = time.monotonic()
        jobs = []
        for index in range(total):
            await asyncio.sleep(max(0.0, begin + index / rate - time.monotonic()))
            jobs.append(asyncio.create_task(one(index)))
        await asyncio.gather(*jobs)
        truth: dict[str, list[float]] = (await http.get("/_bench/tasks")).json()
        return truth


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def figures(run: Run, truth: dict[str, list[float]], warm: int) -> dict[str, Any]:
    """Queries and delays of the counted tasks, and who broke the promise."""
    policy = run.policy
    counted = sorted((t for t in truth if int(t) > warm and t in run.returned), key=int)
    queries = [run.queries[t] for t in counted]
    delays, over, over_covered = [], 0, 0
    taught = sorted(run.taught)
    for tid in counted:
        created, duration = truth[tid]
        delay = run.returned[tid] - (created + duration)
        delays.append(delay)
        if delay <= min(policy.initial_interval + (policy.multiplier - 1) * duration,
                        policy.max_interval):  # fmt: skip
            continue
        over += 1
        # Covered: at least as slow as the fastest task that the model's window (its last
        # WINDOW lessons) had timed when this one was submitted; today's: every task.
        window = [(t, timed) for when, t, timed in taught if when <= run.started[tid]][-WINDOW:]
        timed = [truth[t][1] for t, ran in window if ran]
        if not run.learn or not timed or duration >= min(timed):
            over_covered += 1
    return {
        "tasks": len(counted),
        "queries_p50": statistics.median(queries),
        "queries_p95": percentile(queries, 0.95),
        "queries_mean": round(statistics.fmean(queries), 2),
        "delay_p50_s": round(statistics.median(delays), 3),
        "delay_p95_s": round(percentile(delays, 0.95), 3),
        "over_promise": over,
        "over_promise_covered": over_covered,
        "errors": run.errors,
    }


def measure(shape: str, learn: bool, warm: int, tasks: int, rate: float) -> dict[str, Any]:
    from _common import serve

    os.environ[ENV_SHAPE] = shape
    os.environ[ENV_SLOW_FROM] = str(warm + tasks // 2)
    run = Run(learn=learn, policy=SCALED)
    with serve("polling:app") as base:
        truth = asyncio.run(drive(base, run, warm + tasks, rate))
    return figures(run, truth, warm)


# ---------------------------------------------------------------------------- virtual clock

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


def simulate_shape(shape: str, learn: bool, warm: int, tasks: int) -> dict[str, Any]:
    """The learned or today's schedule on a virtual clock, instant queries, real-life seconds:
    tasks submitted every 0.5 s, waits interleaved in time as on a gateway."""
    p, total = DEFAULT, warm + tasks
    run = Run(learn=learn, policy=p)
    truth = {str(i + 1): [i * 0.5, shape_duration(shape, i, warm + tasks // 2, SCALE)]
             for i in range(total)}  # fmt: skip
    events: list[tuple[float, int, str]] = []
    plans: dict[str, LearnedWait] = {}
    for tid, (created, _) in truth.items():
        run.started[tid], run.queries[tid] = created, 0
        events.append((created, 0, tid))
    heapq.heapify(events)
    while events:
        now, n, tid = heapq.heappop(events)
        created, duration = truth[tid]
        if n == 0 and learn:
            plans[tid] = LearnedWait(p, run.model, KIND, started=created, now=now, rng=run.rng)
            heapq.heappush(events, (now + plans[tid].first_sleep(now), 1, tid))
            continue
        run.queries[tid] += 1
        if now >= created + duration:
            run.returned[tid] = now
            if learn:
                teach(run, plans[tid], now, tid)
            continue
        sleep = plans[tid].active(now, now) if learn else poll_interval(p, n, run.rng)
        heapq.heappush(events, (now + sleep, n + 1, tid))
    return figures(run, truth, warm)


def virtual(args: argparse.Namespace) -> int:
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
    shaped = {
        f"{shape} {'learned' if learn else 'today'}": simulate_shape(shape, learn, 100, 2000)
        for shape in SHAPES
        for learn in (True, False)
    }
    if args.json:
        print(json.dumps({"fixed": results, "shapes": shaped}, indent=1))
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
    print("\n2,000 tasks of each shape (30-90 s scale, real seconds), every 0.5 s, instant queries")
    table(shaped, unit=1.0)
    return 0


# ---------------------------------------------------------------------------- report


def table(results: dict[str, dict[str, Any]], unit: float) -> None:
    print(f"{'run':<20}{'tasks':>6}{'q p50':>7}{'q p95':>7}{'q mean':>8}"
          f"{'delay p50':>11}{'delay p95':>11}{'over promise':>14}{'(covered)':>11}")  # fmt: skip
    for name, r in results.items():
        print(f"{name:<20}{r['tasks']:>6}{r['queries_p50']:>7g}{r['queries_p95']:>7g}"
              f"{r['queries_mean']:>8.2f}{r['delay_p50_s'] * unit:>10.2f}s"
              f"{r['delay_p95_s'] * unit:>10.2f}s{r['over_promise']:>14}"
              f"{r['over_promise_covered']:>11}"
              + (f"  errors {r['errors']}" if r["errors"] else ""))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="uniform", choices=(*SHAPES, "all"))
    parser.add_argument("--warm", type=int, default=200, help="tasks not counted [200]")
    parser.add_argument("--tasks", type=int, default=None,
                        help="tasks counted [200; --virtual: 5000]")  # fmt: skip
    parser.add_argument("--rate", type=float, default=20.0, help="submits per second [20]")
    parser.add_argument("--quick", action="store_true", help="100 + 60 tasks")
    parser.add_argument("--virtual", action="store_true", help="on a virtual clock")
    parser.add_argument("--grid", action="store_true", help="--virtual: search the policy space")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.virtual:
        args.tasks = args.tasks or 5000
        return virtual(args)
    warm, tasks = (100, 60) if args.quick else (args.warm, args.tasks or 200)
    shapes = SHAPES if args.shape == "all" else (args.shape,)
    results = {
        f"{shape} {'learned' if learn else 'today'}": measure(shape, learn, warm, tasks, args.rate)
        for shape in shapes
        for learn in (True, False)
    }
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{warm} + {tasks} tasks at {args.rate:g}/s against the reference gateway in its own "
          f"process, 10x scaled; seconds shown real-life (x{SCALE:g})")  # fmt: skip
    table(results, unit=SCALE)
    print("target: learned queries p50 <= 7, p95 <= 10, none over the promise (stretch: mean 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
