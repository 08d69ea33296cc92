"""Polls that learn (DESIGN 15, issue 21), through the SDK itself: one ``AsyncClient``'s
``submit`` and ``wait``, and ``run_batch``, against the reference gateway served in its own
process, the learned schedule (``PollPolicy(learn=True)``) against today's (``learn=False``)
in the same run, each on a fresh gateway.

Real life is scaled 10x down: tasks of 30-90 s run 3-9 s, the poll policy is PollPolicy()
divided by 10 (0.1 s, x1.15, up to 3 s).

Waits: tasks are submitted steadily at 20 a second (2 a second in real life) through ONE
``AsyncClient`` (so every wait shares its model), each with ``client.submit`` then
``client.wait(submission)``. The first ``--warm`` tasks teach the model and are not counted;
the next ``--tasks`` are. Printed per duration shape: queries per task (p50, p95, mean; counted
by the gateway, per task) and the delay from a task's finish (the gateway's record) to its
wait's return (p50, p95), and how many tasks broke the promise: seen later than 15% of their
running time plus one initial interval, or later than one max interval, after they finished;
"(covered)" counts those the promise covers (DESIGN 15: tasks at least as slow as the fastest
that the model's window, its last 50 lessons, had timed when they were submitted; for today's
schedule, every task). Targets: a median of at most 7 and a p95 of at most 10 queries per
task, none over the promise; stretch, a mean of 5. Shapes: ``uniform`` (the issue's),
``longtail`` (lognormal), ``bimodal`` (30% fast, 70% slow) and ``slowdown`` (3x slower from
the middle of the counted tasks).

Batch: ``--lines`` lines through ``run_batch`` (surface alpha, no gallery) at surface A's
provider's limits scaled 10x, ``RateLimit(submits_per_second=20, queries_per_second=100)``,
from an empty folder (the model starts from nothing). Printed: the wall time against the floor
the limits allow (lines / 20 submits a second + the median task duration), queries per task,
the busiest second's queries (the gateway's count, against 100), and the delay from a task's
finish on the gateway to its line being seen finished (``completed_at`` in the ledger) and to
its file on disk (``finished_at``), p50 and p95.

Seconds are shown in real life (x10). Each task's true start and duration come from the gateway
itself, after the run; the gateway's monotonic clock is this process's (one machine).

``--virtual`` measures the schedules alone on a virtual clock instead (no gateway, no client,
seconds): PollPolicy() against fixed intervals on tasks of 5 s to 10 min (log-uniform), and
the learned schedule against today's on every shape, unscaled.

Run: python bench/polling.py [--quick] [--shape NAME|all] [--only waits|batch] [--json]
     python bench/polling.py --virtual [--grid] [--json]
Full run (all shapes, 200 + 200 tasks each, a batch of 400 lines): about 5 minutes.
``--quick``: the uniform shape, 200 + 40 tasks, a batch of 40 lines, about a minute. (The
warm-up is at least 10 s of submits whatever the count, so that the counted tasks start after
the first warm ones finished: a model is taught by finishes, not by submits.)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import heapq
import json
import math
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import httpx

from imggw_client import AsyncClient, PollPolicy, RateLimit
from imggw_client._core.durations import WINDOW, DurationModel, Kind
from imggw_client._core.poll import LearnedWait, poll_interval

SCALE = 10.0
DEFAULT = PollPolicy()
SCALED = PollPolicy(
    initial_interval=DEFAULT.initial_interval / SCALE,
    max_interval=DEFAULT.max_interval / SCALE,
    multiplier=DEFAULT.multiplier,
)
# Surface A's provider: 20 submits per 10 s and 10 queries a second per key, scaled 10x.
BATCH_LIMIT = RateLimit(submits_per_second=20, queries_per_second=100)
BATCH_SURFACE = "alpha"
SHAPES = ("uniform", "longtail", "bimodal", "slowdown")
KEY = "bench-key"
KIND = ("beta", "1k")  # the waits' kind: the client's default surface, 1k
WAIT_TIMEOUT = 300.0  # seconds at 10x speed: no task of any shape comes near it
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
    from imggw_client.mock import _serving as serving

    shape = os.environ.get(ENV_SHAPE, "uniform")
    slow_from = int(os.environ.get(ENV_SLOW_FROM, "0"))
    queries: Counter[str] = Counter()  # task id -> queries that reached it
    arrivals: list[float] = []  # when each query came (the gateway's monotonic clock)

    class ShapedGateway(MockGateway):
        # The reference gateway draws durations uniformly; each task's is replaced by its
        # shape's, by task id, once created. Queries are counted per task (under the lock).
        def _create(self, *args: Any) -> Any:
            task = super()._create(*args)
            task.duration = shape_duration(shape, int(task.id) - 1, slow_from)
            return task

        def _query(self, req: Any, surface: Any, owner: str, delay: float) -> Any:
            queries[serving.query_task_id(surface, req.path, req.query)] += 1
            arrivals.append(self.clock())
            return super()._query(req, surface, owner, delay)

    gateway = ShapedGateway(api_keys=[KEY], seed=1)
    inner = gateway.asgi()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        """The gateway, and ``GET /_bench/tasks``: every task's start (the gateway's monotonic
        clock, the same as the bench's on one machine), running time and queries, and when
        every query came."""
        if scope["type"] == "http" and scope["path"] == "/_bench/tasks":
            with gateway._lock:
                tasks = {t.id: [t.created, t.duration, queries[t.id]]
                         for t in gateway._tasks.values()}  # fmt: skip
                body = json.dumps({"tasks": tasks, "arrivals": arrivals}).encode()
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


def gateway_record(base: str) -> dict[str, Any]:
    """What the gateway saw: ``{"tasks": {id: [created, duration, queries]}, "arrivals"}``."""
    record: dict[str, Any] = httpx.get(f"{base}/_bench/tasks", timeout=60.0).json()
    return record


# ---------------------------------------------------------------------------- the waits


@dataclass
class Run:
    """What one schedule's run saw; times on this machine's monotonic clock."""

    learn: bool
    policy: PollPolicy
    model: DurationModel = field(default_factory=DurationModel)
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    started: dict[str, float] = field(default_factory=dict)  # task id -> submit answered
    returned: dict[str, float] = field(default_factory=dict)  # task id -> wait returned
    queries: dict[str, int] = field(default_factory=dict)
    taught: list[tuple[float, str, bool]] = field(default_factory=list)  # when, id, timed
    errors: int = 0


class Recorder(DurationModel):
    """The client's duration model, noting every lesson it is taught (when, lower, upper,
    kept), so that the bench knows which tasks the model's window had timed."""

    def __init__(self) -> None:
        super().__init__()
        self.lessons: list[tuple[float, float, float, bool]] = []

    def observe(self, kind: Kind, lower: float, upper: float, now: float) -> bool:
        kept = super().observe(kind, lower, upper, now)
        self.lessons.append((now, lower, upper, kept))
        return kept


def lesson_of(model: Recorder, started: float) -> tuple[float, bool] | None:
    """The lesson (when, timed: seen running) that the wait of a task started at ``started``
    taught, if it taught one. A wait teaches just before it returns, with no other coroutine
    running in between, so its lesson is the last one; the bench looks among the last few, by
    the start the lesson implies (``now - upper``)."""
    for now, lower, upper, kept in reversed(model.lessons[-8:]):
        if kept and abs(now - upper - started) < 1e-6:
            return now, lower > 0
    return None


async def drive(base: str, run: Run, total: int, rate: float) -> None:
    """Submits ``total`` tasks at ``rate`` a second through one AsyncClient and waits for each
    with ``client.wait(submission)``."""
    model = Recorder()
    run.model = model
    async with AsyncClient(api_key=KEY, base_url=base, poll=run.policy) as client:
        client._flows.durations = model  # the client's own model (fresh), watched

        async def one(index: int) -> None:
            try:
                sub = await client.submit(f"polling bench {index}", aspect_ratio="1:1",
                                          resolution="1k")  # fmt: skip
                started = sub._accepted_at if sub._accepted_at is not None else time.monotonic()
                run.started[sub.task_id] = started
                await client.wait(sub, wait_timeout=WAIT_TIMEOUT)
                run.returned[sub.task_id] = time.monotonic()
                lesson = lesson_of(model, started)
                if lesson is not None:
                    run.taught.append((lesson[0], sub.task_id, lesson[1]))
            except Exception:  # counted and shown: the figures leave such a task out
                run.errors += 1

        begin = time.monotonic()
        jobs = []
        for index in range(total):
            await asyncio.sleep(max(0.0, begin + index / rate - time.monotonic()))
            jobs.append(asyncio.create_task(one(index)))
        await asyncio.gather(*jobs)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def figures(run: Run, truth: dict[str, list[float]], warm: int) -> dict[str, Any]:
    """Queries and delays of the counted tasks, and who broke the promise. ``truth`` is
    ``{id: [created, duration, ...]}``."""
    policy = run.policy
    counted = sorted((t for t in truth if int(t) > warm and t in run.returned), key=int)
    queries = [run.queries[t] for t in counted]
    delays, over, over_covered = [], 0, 0
    taught = sorted(run.taught)
    for tid in counted:
        created, duration = truth[tid][:2]
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
    run = Run(learn=learn, policy=dataclasses.replace(SCALED, learn=learn))
    with serve("polling:app") as base:
        asyncio.run(drive(base, run, warm + tasks, rate))
        truth = gateway_record(base)["tasks"]
    run.queries = {tid: int(record[2]) for tid, record in truth.items()}
    return figures(run, truth, warm)


# ---------------------------------------------------------------------------- the batch


def batch(shape: str, learn: bool, lines: int, concurrency: int) -> dict[str, Any]:
    """``lines`` lines through ``run_batch`` at the scaled limits, from an empty folder."""
    from _common import serve

    from imggw_client.batch import LEDGER_NAME, run_batch

    os.environ[ENV_SHAPE] = shape
    os.environ[ENV_SLOW_FROM] = str(lines // 2)
    policy = dataclasses.replace(SCALED, learn=learn)
    with serve("polling:app") as base, tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "in.jsonl", Path(tmp) / "out"
        source.write_text("".join(
            json.dumps({"prompt": f"batch line {i}", "aspect_ratio": "1:1", "resolution": "1k"})
            + "\n" for i in range(lines)
        ))  # fmt: skip

        def client() -> AsyncClient:
            return AsyncClient(api_key=KEY, base_url=base, surface=BATCH_SURFACE, poll=policy,
                               rate_limit=BATCH_LIMIT)  # fmt: skip

        began = time.monotonic()
        report = run_batch(source, out, client_factory=client, concurrency=concurrency,
                           gallery=False)  # fmt: skip
        wall = time.monotonic() - began
        to_wall = time.time() - time.monotonic()  # this machine's monotonic clock to Unix time
        with contextlib.closing(sqlite3.connect(out / LEDGER_NAME)) as db:
            rows = db.execute(
                "SELECT task_id, state, completed_at, finished_at FROM tasks"
            ).fetchall()
        record = gateway_record(base)
    tasks, arrivals = record["tasks"], sorted(record["arrivals"])
    seen, filed, queries = [], [], []
    for task_id, state, completed_at, finished_at in rows:
        if task_id is None or task_id not in tasks:
            continue
        created, duration, count = tasks[task_id]
        done = created + duration + to_wall
        queries.append(count)
        if completed_at is not None:
            seen.append(completed_at - done)
        if state == "saved" and finished_at is not None:
            filed.append(finished_at - done)
    typical = statistics.median(t[1] for t in tasks.values())
    floor = lines / BATCH_LIMIT.submits_per_second + typical  # type: ignore[operator]
    return {
        "lines": lines,
        "saved": sum(1 for row in rows if row[1] == "saved"),
        "exit": int(report.exit_code),
        "wall_s": round(wall, 2),
        "floor_s": round(floor, 2),
        "wall_over_floor": round(wall / floor, 3),
        "queries_p50": statistics.median(queries) if queries else 0,
        "queries_p95": percentile(queries, 0.95) if queries else 0,
        "queries_mean": round(statistics.fmean(queries), 2) if queries else 0.0,
        "queries_total": len(arrivals),
        "busiest_second": busiest(arrivals, 1.0),
        "seen_p50_s": round(statistics.median(seen), 3) if seen else None,
        "seen_p95_s": round(percentile(seen, 0.95), 3) if seen else None,
        "file_p50_s": round(statistics.median(filed), 3) if filed else None,
        "file_p95_s": round(percentile(filed, 0.95), 3) if filed else None,
    }


def busiest(times: list[float], span: float) -> int:
    """The most of the sorted ``times`` within any ``span`` seconds."""
    return max((bisect.bisect_right(times, t + span) - i for i, t in enumerate(times)), default=0)


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


def teach(run: Run, plan: LearnedWait, now: float, task_id: str) -> None:
    """Lets the wait teach the model, noting whether it timed the task (saw it running)."""
    if plan.finished(now):
        run.taught.append((now, task_id, run.model.observations(KIND, now)[-1][0] > 0))


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


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def report_waits(results: dict[str, dict[str, Any]], shapes: tuple[str, ...]) -> None:
    table(results, unit=SCALE)
    for shape in shapes:
        learned, today = results[f"{shape} learned"], results[f"{shape} today"]
        met = (learned["queries_p50"] <= 7 and learned["queries_p95"] <= 10
               and learned["over_promise_covered"] == 0)  # fmt: skip
        print(f"  {shape}: learned/today queries mean "
              f"{ratio(learned['queries_mean'], today['queries_mean'])}, delay p50 "
              f"{ratio(learned['delay_p50_s'], today['delay_p50_s'])}, p95 "
              f"{ratio(learned['delay_p95_s'], today['delay_p95_s'])}; target "
              f"{'met' if met else 'MISSED'}"
              f"{', stretch met' if met and learned['queries_mean'] <= 5 else ''}")  # fmt: skip
    print("target: learned queries p50 <= 7, p95 <= 10, none over the promise (covered); "
          "stretch: mean 5")  # fmt: skip


def report_batch(results: dict[str, dict[str, Any]]) -> None:
    def s(value: float | None) -> str:
        return "n/a" if value is None else f"{value * SCALE:.1f}s"

    print(f"{'run':<10}{'saved':>8}{'wall':>9}{'floor':>9}{'/floor':>8}{'q p50':>7}{'q p95':>7}"
          f"{'q mean':>8}{'max q/s':>9}{'seen p50':>10}{'seen p95':>10}{'file p50':>10}"
          f"{'file p95':>10}")  # fmt: skip
    for name, r in results.items():
        print(f"{name:<10}{r['saved']:>4}/{r['lines']:<3}{s(r['wall_s']):>9}{s(r['floor_s']):>9}"
              f"{r['wall_over_floor']:>7.2f}x{r['queries_p50']:>7g}{r['queries_p95']:>7g}"
              f"{r['queries_mean']:>8.2f}{r['busiest_second']:>9}{s(r['seen_p50_s']):>10}"
              f"{s(r['seen_p95_s']):>10}{s(r['file_p50_s']):>10}{s(r['file_p95_s']):>10}"
              + (f"  exit {r['exit']}" if r["exit"] else ""))  # fmt: skip
    learned, today = results["learned"], results["today"]
    print(f"  learned/today: wall {ratio(learned['wall_s'], today['wall_s'])}, queries mean "
          f"{ratio(learned['queries_mean'], today['queries_mean'])}, finish-to-file p95 "
          f"{ratio(learned['file_p95_s'], today['file_p95_s'])}")  # fmt: skip
    print("  max q/s: the most queries the gateway took in any 1 s at 10x speed (limit 100)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="all", choices=(*SHAPES, "all"),
                        help="duration shape of the waits [all]; the batch's is uniform unless "
                             "one shape is named")  # fmt: skip
    parser.add_argument("--only", choices=("waits", "batch"), help="run one part only")
    parser.add_argument("--warm", type=int, default=200, help="tasks not counted [200]")
    parser.add_argument("--tasks", type=int, default=None,
                        help="tasks counted [200; --virtual: 5000]")  # fmt: skip
    parser.add_argument("--rate", type=float, default=20.0, help="submits per second [20]")
    parser.add_argument("--lines", type=int, default=400, help="lines of the batch [400]")
    parser.add_argument("--concurrency", type=int, default=16, help="of the batch [16]")
    parser.add_argument("--quick", action="store_true",
                        help="uniform shape, 200 + 40 tasks, a batch of 40 lines")  # fmt: skip
    parser.add_argument("--virtual", action="store_true", help="on a virtual clock")
    parser.add_argument("--grid", action="store_true", help="--virtual: search the policy space")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.virtual:
        args.tasks = args.tasks or 5000
        return virtual(args)
    if args.quick:
        # The warm tasks must have finished (3-9 s) before the counted ones start: 10 s of them.
        warm, tasks, lines = 200, 40, 40
        shapes: tuple[str, ...] = ("uniform",)
    else:
        warm, tasks, lines = args.warm, args.tasks or 200, args.lines
        shapes = SHAPES if args.shape == "all" else (args.shape,)
    waits: dict[str, dict[str, Any]] = {}
    batches: dict[str, dict[str, Any]] = {}
    if args.only != "batch":
        for shape in shapes:
            for learn in (True, False):
                name = f"{shape} {'learned' if learn else 'today'}"
                waits[name] = measure(shape, learn, warm, tasks, args.rate)
    batch_shape = shapes[0] if len(shapes) == 1 else "uniform"
    if args.only != "waits":
        for name, learn in (("learned", True), ("today", False)):
            batches[name] = batch(batch_shape, learn, lines, args.concurrency)
    if args.json:
        print(json.dumps({"waits": waits, "batch": batches}, indent=1))
        return 0
    if waits:
        print(f"Waits: {warm} + {tasks} tasks at {args.rate:g}/s through one AsyncClient "
              f"(submit, then wait), against the reference gateway in its own process, 10x "
              f"scaled; seconds shown real-life (x{SCALE:g})")  # fmt: skip
        report_waits(waits, shapes)
    if batches:
        print(f"\nBatch: {lines} lines ({batch_shape}) through run_batch, concurrency "
              f"{args.concurrency}, {BATCH_LIMIT} (surface A's provider x10), against the "
              f"reference gateway in its own process; floor = lines / 20 per s + median "
              f"duration; seconds shown real-life (x{SCALE:g})")  # fmt: skip
        report_batch(batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
