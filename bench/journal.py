"""The journal and as_completed (DESIGN 19), each side measured in the same run. Every gateway
is the reference gateway in a process of its own (uvicorn, 127.0.0.1).

Part 1, what a journal costs per task: N ``generate()`` calls (submit, then wait) through a
client with ``journal=`` a file on this machine's disk, against the same calls through one
without: ``AsyncClient`` one at a time, one at a time with the download, 32 at once; ``Client``
one at a time and from 16 threads. One at a time, the two sides alternate call by call (a
loaded machine's drift hits both); 32 at once and 16 threads, round by round. Wall time and
the client process's CPU time (every thread) a task. Two more rows take the cost apart: a
journal that writes nothing (what is left is the client's side: the ``Record`` actions), and
every write through a worker thread (a bench-only patch of ``_io_async.record``: how
``AsyncClient`` wrote before its writes went on the loop's thread when the file is free).
Tasks finish at once and the first poll comes after 1 ms (``PollPolicy(initial_interval=
0.001)``), so a task costs a few ms and the journal's share shows (with the default polls a
``generate`` takes a second or more). Then the file alone: the five events of one task
(sending, accepted, running, succeeded, saved), per task, through ``Journal.record`` (a
blocking caller's way) and through ``Journal.try_record`` (an event loop's). All of it repeated
(3 times) on a fresh gateway and journal. Target: within 1 ms per task.

Part 2, ``as_completed`` against the waits a user writes by hand: T tasks (1,000) of 2 to 8 s,
submitted one after another, then waited on: ``async for task in client.as_completed(subs)``
against an anyio task group of ``client.wait``; ``Client.as_completed`` against a
``ThreadPoolExecutor`` of T workers (a thread per wait) and one with its default workers
(``cpu_count + 4``). Each way in its own process against a fresh gateway (same seed, same
durations), the ways in alternating order each round: wall time of the waits, queries sent
(the gateway's count), how long after its finish each task reached the code (p50, p95), CPU,
peak threads and peak RSS.

Part 3, the batch at scale before and after: ``bench/batch.py``'s scale part (CPU per line and
peak RSS at 1k, 10k and 100k lines) run from this tree and from another (``--base-src``, the
``src`` folder of a worktree of the commit to compare with), alternating, R rounds each.
"Within noise" means the two sides' ranges over the rounds overlap.

Part 4, the journal's edges (DESIGN 22): ``client.unfinished()`` over U journaled submits of
unknown outcome (500) against a gateway that answers every request 50 ms late, against the same
replays sent one at a time (how ``unfinished()`` sent them before; target under 3 s); and
``imggw tasks`` on a journal of 100,000 rows (the newest 50; ``--json``; target under 1 s wall
and 100 MiB peak RSS), against ``imggw tasks --all`` (every row read and printed, as the listing
did before) and ``imggw --version`` (the command's start alone), each a process of its own, the
ways alternating, R rounds: wall time and the child's peak RSS (``wait4``'s rusage).

Run: python bench/journal.py [--part 1|2|3|4] [--quick] [--json]
     git worktree add --detach /tmp/base 5bd5b17    # part 3: the commit before the journal
     python bench/journal.py --part 3 --base-src /tmp/base/src [--head-src DIR] [--rounds R]
Parts 1, 2 and 4 by default (about 9 minutes on a busy 2-core machine; ``--quick`` about 2);
part 3 only with ``--base-src`` (10 to 25 minutes a round and tree at full size, most of it
the 100,000 lines; ``--quick``: 1k, 2k, 4k lines).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import child_gateway

KEY = "bench-key-journal"
QUERY = "GET /beta/v1/tasks/{id}"
FAST_POLL = {"initial_interval": 0.001, "max_interval": 0.01}
TARGET_MS = 1.0  # part 1: a journal's cost per task


# --------------------------------------------------------------------------- shared


def serve_gateway(options: dict[str, Any]) -> int:
    """The reference gateway with ``options`` in this process; prints its URL, then serves
    until stdin closes."""
    from imggw_client.mock import MockGateway
    from imggw_client.mock._asgi import serve_app

    delay = float(options.pop("answer_delay", 0.0))  # seconds before every answer (part 4)
    gateway = MockGateway(api_keys=[KEY], **options)
    inner = gateway.asgi()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if delay and scope["type"] == "http":
            import anyio

            await anyio.sleep(delay)
        if scope["type"] == "http" and scope["path"] == "/_bench/finished":
            # When each task finished, on the gateway's clock: CLOCK_MONOTONIC, which every
            # process on this machine reads alike (the gateway's own table; a bench may look).
            with gateway._lock:
                finished = {task.id: task.finished for task in gateway._tasks.values()}
            body = json.dumps(finished).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await inner(scope, receive, send)

    with serve_app(app, request_timeout=60.0) as url:
        print(url, flush=True)
        sys.stdin.read()
    return 0


@contextlib.contextmanager
def gateway(**options: Any) -> Iterator[str]:
    """A fresh reference gateway in a child process; yields its URL."""
    with child_gateway([sys.executable, __file__, "--serve", json.dumps(options)]) as url:
        yield url


def stats(url: str, path: str = "/_mock/stats") -> dict[str, Any]:
    import httpx

    answer: dict[str, Any] = httpx.get(url + path, timeout=60).json()
    return answer


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def spread(values: list[float], fmt: str = ".2f") -> str:
    """The median and, for several values, their range: ``1.23 (1.10-1.40)``, or ``+0.25
    (+0.20 to +0.30)`` for signed figures."""
    mid = format(statistics.median(values), fmt)
    if len(values) < 2:
        return mid
    between = " to " if "+" in fmt else "-"
    return f"{mid} ({format(min(values), fmt)}{between}{format(max(values), fmt)})"


def _counting_journal(path: Path) -> Any:
    """A Journal that counts what an AsyncClient asks it to record (every event reaches
    ``try_record`` first) and how many of those went on to ``record`` in a worker thread."""
    from imggw_client.tracking import Journal

    class Counting(Journal):
        events: list[str]
        hops: int

        def try_record(self, event: object, scope: Any) -> bool:
            self.events.append(type(event).__name__)
            return super().try_record(event, scope)

        def record(self, event: object, scope: Any) -> None:
            self.hops += 1
            super().record(event, scope)

    journal = Counting(path)
    journal.events, journal.hops = [], 0
    return journal


# --------------------------------------------------------------------------- part 1


def _noop_journal(path: Path) -> Any:
    """A Journal that writes nothing: the client's side of journaling alone (the Record
    actions)."""
    from imggw_client.tracking import Journal

    class NoOp(Journal):
        def record(self, event: object, scope: Any) -> None:
            pass

        def try_record(self, event: object, scope: Any) -> bool:
            return True

    return NoOp(path)


PROMPT = "a journaled lighthouse"
SIDES = ("plain", "journal")
Samples = dict[str, dict[str, list[float]]]  # side -> {"wall": [...], "cpu": [...]} seconds


def _samples() -> Samples:
    return {side: {"wall": [], "cpu": []} for side in SIDES}


def _order(i: int) -> tuple[str, ...]:
    """The sides' order at step ``i``: alternating, so neither always goes first."""
    return SIDES if i % 2 == 0 else SIDES[::-1]


def _note(samples: Samples, side: str, wall: float, cpu: float, per: int = 1) -> None:
    samples[side]["wall"].append(wall / per)
    samples[side]["cpu"].append(cpu / per)


@contextlib.asynccontextmanager
async def _writes_in_a_thread(client: Any) -> AsyncIterator[None]:
    """Makes ``client``'s journal writes each hop to a worker thread, as ``AsyncClient`` did
    before they went on the loop's thread (a bench-only patch of the driver's
    ``_io_async.record``, undone after): the old way, measured in the same run."""
    from imggw_client import _io_async

    on_loop = _io_async.record

    async def record(journal: Any, event: object, scope: Any) -> None:
        if journal is client.journal:
            await _io_async.run_sync(journal.record, event, scope)
        else:
            await on_loop(journal, event, scope)

    _io_async.record = record
    try:
        yield
    finally:
        _io_async.record = on_loop


def part1_async(url: str, folder: Path, tasks: int, rounds: int) -> dict[str, Any]:
    """AsyncClient: one call at a time (the sides alternating call by call), with and without
    the download; then 32 at once (the sides alternating round by round)."""
    import anyio

    from imggw_client import AsyncClient, PollPolicy

    journal = _counting_journal(folder / "async.sqlite")
    found: dict[str, Samples] = {}
    # (mode, with the download, the client on the journal side)
    modes = [("AsyncClient, one at a time", False, "journal"),
             ("AsyncClient, one at a time + download", True, "journal"),
             ("AsyncClient, one at a time, writes a no-op", False, "no-op"),
             ("AsyncClient, one at a time, writes in a thread", False, "thread")]  # fmt: skip

    async def main() -> None:
        common = {"api_key": KEY, "base_url": url, "poll": PollPolicy(**FAST_POLL)}
        async with (
            AsyncClient(**common, journal=False) as plain,
            AsyncClient(**common, journal=journal) as journaled,
            AsyncClient(**common, journal=_noop_journal(folder / "noop.sqlite")) as noop,
            AsyncClient(**common, journal=folder / "thread.sqlite") as thread,
            _writes_in_a_thread(thread),
        ):
            clients = {"plain": plain, "journal": journaled, "no-op": noop, "thread": thread}

            async def one(client: str, download: bool) -> None:
                task = await clients[client].generate(PROMPT)
                if download:
                    await clients[client].download(task, folder / client)

            for mode, download, other in modes:
                samples = found.setdefault(mode, _samples())
                for i in range(-10, tasks):  # 10 calls a side to warm up
                    for side in _order(i):
                        wall, cpu = time.perf_counter(), time.process_time()
                        await one(other if side == "journal" else side, download)
                        if i >= 0:
                            _note(samples, side, time.perf_counter() - wall,
                                  time.process_time() - cpu)  # fmt: skip
            limiter = anyio.CapacityLimiter(32)

            async def limited(side: str) -> None:
                async with limiter:
                    await one(side, False)

            samples = found.setdefault("AsyncClient, 32 at once", _samples())
            per_round = tasks // rounds
            for r in range(rounds):
                for side in _order(r):
                    wall, cpu = time.perf_counter(), time.process_time()
                    async with anyio.create_task_group() as group:
                        for _ in range(per_round):
                            group.start_soon(limited, side)
                    _note(samples, side, time.perf_counter() - wall, time.process_time() - cpu,
                          per_round)  # fmt: skip

    anyio.run(main)
    # Events a task through the counting journal: 3 for a generate (sending, accepted,
    # succeeded; running too when a poll sees it), 4 with the download (saved).
    made = 2 * (tasks + 10) + rounds * (tasks // rounds)
    writes = len(journal.events) / made
    hops = journal.hops / made
    journal.close()
    return {"samples": found, "writes_per_task": writes, "hops_per_task": hops}


def part1_sync(url: str, folder: Path, tasks: int, rounds: int) -> dict[str, Samples]:
    """Client: one call at a time (alternating call by call), then from 16 threads
    (alternating round by round)."""
    from imggw_client import Client, PollPolicy

    found: dict[str, Samples] = {}
    common = {"api_key": KEY, "base_url": url, "poll": PollPolicy(**FAST_POLL)}
    with Client(**common, journal=False) as plain, \
            Client(**common, journal=folder / "sync.sqlite") as journaled, \
            ThreadPoolExecutor(16) as pool:  # fmt: skip
        clients = {"plain": plain, "journal": journaled}
        samples = found.setdefault("Client, one at a time", _samples())
        for i in range(-10, tasks):
            for side in _order(i):
                wall, cpu = time.perf_counter(), time.process_time()
                clients[side].generate(PROMPT)
                if i >= 0:
                    _note(samples, side, time.perf_counter() - wall, time.process_time() - cpu)
        samples = found.setdefault("Client, 16 threads", _samples())
        per_round = tasks // rounds
        for r in range(-1, rounds):
            for side in _order(r):
                wall, cpu = time.perf_counter(), time.process_time()
                list(pool.map(lambda _, c=clients[side]: c.generate(PROMPT), range(per_round)))
                if r >= 0:
                    _note(samples, side, time.perf_counter() - wall, time.process_time() - cpu,
                          per_round)  # fmt: skip
    return found


def journal_alone(folder: Path, tasks: int, nowait: bool = False) -> dict[str, float]:
    """``Journal.record`` of one task's five events, per task, on this disk (no client, no
    thread hop): what the file itself costs, in wall and CPU time. ``nowait``: through
    ``try_record`` (then ``record`` in this thread when it declines), as an event loop
    writes."""
    from imggw_client import ImageRequest, Submission, Task, TaskStatus
    from imggw_client._core import states
    from imggw_client.tracking import Journal, Scope

    journal = Journal(folder / ("alone-nowait.sqlite" if nowait else "alone.sqlite"))
    scope = Scope("http://127.0.0.1:1", "0" * 16)
    request = ImageRequest(PROMPT)
    now = datetime.now(timezone.utc)
    files = (folder / "x.png",)
    plan = []
    for i in range(tasks + 1):
        task_id, key = str(i + 1), uuid.uuid4().hex  # ids as the gateway gives them
        plan.append([
            states.Sending(key, "beta", request),
            states.Accepted(Submission(task_id=task_id, idempotency_key=key, surface="beta",
                                       resolution="1k", submitted_at=now)),
            states.Seen(Task(id=task_id, surface="beta", status=TaskStatus.RUNNING, progress=40)),
            states.Seen(Task(id=task_id, surface="beta", status=TaskStatus.SUCCEEDED,
                             image_urls=["http://127.0.0.1:1/x.png"], credits=4.0,
                             expires_at=now)),
            states.Saved(task_id, "beta", files),
        ])  # fmt: skip
    for event in plan.pop():  # the first write makes the file's pages
        journal.record(event, scope)
    wall, cpu = time.perf_counter(), time.process_time()
    for events in plan:
        for event in events:
            if not (nowait and journal.try_record(event, scope)):
                journal.record(event, scope)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    saved = len([e for e in journal.tasks() if e.state == "saved"])
    journal.close()
    assert saved == tasks + 1, saved
    return {"wall_us": wall * 1e6 / tasks, "cpu_us": cpu * 1e6 / tasks}


def _summary(kind: str, samples: Samples) -> dict[str, float]:
    """One repeat's figures for a mode, in ms a task: the sides' medians (wall) and means
    (CPU), the difference, and the ratio of the walls."""
    wall = {side: statistics.median(samples[side]["wall"]) * 1000 for side in SIDES}
    cpu = {side: statistics.fmean(samples[side]["cpu"]) * 1000 for side in SIDES}
    if kind == "rounds":  # the difference round by round: the load moves between rounds
        plus = statistics.median(
            1000 * (j - p)
            for p, j in zip(samples["plain"]["wall"], samples["journal"]["wall"], strict=True)
        )
    else:
        plus = wall["journal"] - wall["plain"]
    return {
        "plain_ms": wall["plain"],
        "journal_ms": wall["journal"],
        "plus_ms": plus,
        "ratio": wall["journal"] / wall["plain"],
        "plain_cpu_ms": cpu["plain"],
        "journal_cpu_ms": cpu["journal"],
        "plus_cpu_ms": cpu["journal"] - cpu["plain"],
    }


def part1(tasks: int, rounds: int, repeats: int) -> dict[str, Any]:
    found: dict[str, Any] = {"load_before": load(), "tasks": tasks, "rounds": rounds,
                             "repeats": repeats}  # fmt: skip
    figures: dict[str, list[dict[str, float]]] = {}
    alone: list[dict[str, float]] = []
    alone_nowait: list[dict[str, float]] = []
    writes: list[float] = []
    hops: list[float] = []
    created = 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="imggw-journal-bench-") as tmp:
            folder = Path(tmp)
            found["disk"] = _filesystem(folder)
            with gateway(duration_min=0.0, duration_max=0.0, seed=1) as url:
                a = part1_async(url, folder, tasks, rounds)
                s = part1_sync(url, folder, tasks, rounds)
                created += stats(url)["tasks_created"]
            for mode, samples in {**a["samples"], **s}.items():
                kind = "rounds" if "at once" in mode or "threads" in mode else "calls"
                figures.setdefault(mode, []).append(_summary(kind, samples))
            writes.append(a["writes_per_task"])
            hops.append(a["hops_per_task"])
            alone.append(journal_alone(folder, tasks))
            alone_nowait.append(journal_alone(folder, tasks, nowait=True))
    found.update(figures=figures, alone=alone, alone_nowait=alone_nowait,
                 writes_per_task=statistics.fmean(writes), hops_per_task=statistics.fmean(hops),
                 tasks_created=created, load_after=load())  # fmt: skip
    return found


def _filesystem(path: Path) -> str:
    done = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, check=False)
    lines = done.stdout.split("\n")
    if done.returncode != 0 or len(lines) < 2:
        return "unknown"
    device, kind = lines[1].split()[:2]
    return f"{kind} on {device}"


def print_part1(found: dict[str, Any]) -> None:
    n, rounds, repeats = found["tasks"], found["rounds"], found["repeats"]
    print(f"Part 1: what a journal costs per task: {n} generate() a side and mode, tasks that "
          f"finish at once, first poll after 1 ms; journal on {found['disk']}; {repeats} "
          f"repeats, each with a fresh gateway and journal")  # fmt: skip
    print(f"  ({found['load_before']} before, {found['load_after']} after)")
    print(f"  {'ms a task':<48}{'no journal':>20}{'journal':>20}{'+ms wall':>24}{'ratio':>18}"
          f"{'+ms CPU':>24}")  # fmt: skip
    for mode, rows in found["figures"].items():

        def col(name: str, fmt: str = ".2f", rows: list[dict[str, float]] = rows) -> str:
            return spread([row[name] for row in rows], fmt)

        print(
            f"  {mode:<48}{col('plain_ms'):>20}{col('journal_ms'):>20}"
            f"{col('plus_ms', '+.2f'):>24}{col('ratio'):>18}{col('plus_cpu_ms', '+.2f'):>24}"
        )
    print(f"  (median and range over the repeats. Within a repeat: one-at-a-time modes "
          f"alternate the sides call by call, wall = each side's median call; 32 at once and "
          f"16 threads alternate {rounds} rounds of {n // rounds}, '+ms wall' the median "
          f"round-by-round difference; CPU: the client process's, mean a task, every thread. "
          f"{found['writes_per_task']:.2f} journal events a task, "
          f"{found['hops_per_task']:.3f} of them in a worker thread; {found['tasks_created']:,} "
          f"tasks created)")  # fmt: skip
    for name, key in (("Journal.record", "alone"), ("Journal.try_record", "alone_nowait")):
        wall = [a["wall_us"] for a in found[key]]
        cpu = [a["cpu_us"] for a in found[key]]
        print(f"  {name} alone, the 5 events of one task (sending, accepted, running, "
              f"succeeded, saved): {spread(wall, '.0f')} us wall, {spread(cpu, '.0f')} us CPU "
              f"a task ({n} tasks a repeat)")  # fmt: skip
    worst = max(statistics.median(r["plus_ms"] for r in rows)
                for mode, rows in found["figures"].items()
                if "no-op" not in mode and "in a thread" not in mode)  # fmt: skip
    verdict = "met" if worst <= TARGET_MS else "MISSED"
    print(f"  target: within {TARGET_MS:g} ms a task (the worst mode's median {worst:+.2f} ms): "
          f"{verdict}")  # fmt: skip


# --------------------------------------------------------------------------- part 2

WAYS = {
    "async-as_completed": "AsyncClient.as_completed",
    "async-task-group": "AsyncClient, anyio task group of wait()",
    "sync-as_completed": "Client.as_completed",
    "sync-threads": "Client, ThreadPoolExecutor, a thread per wait()",
    "sync-pool": f"Client, ThreadPoolExecutor() ({min(32, (os.cpu_count() or 1) + 4)} threads)",
}


class Sampler:
    """The process's threads and RSS, read from /proc every 10 ms on a thread of its own (not
    counted)."""

    def __init__(self) -> None:
        self.threads = 0
        self.rss_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            with open("/proc/self/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("Threads:"):
                        self.threads = max(self.threads, int(line.split()[1]) - 1)
                    elif line.startswith("VmRSS:"):
                        self.rss_mib = max(self.rss_mib, int(line.split()[1]) / 1024)
            self._stop.wait(0.01)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def waits_child(way: str, url: str, tasks: int) -> dict[str, Any]:
    """Submits ``tasks`` one after another, then waits on them all the ``way`` given; notes when
    each task reached the code (monotonic: the gateway's clock too)."""
    seen: dict[str, float] = {}
    expected: list[str] = []
    began: list[float] = []  # when the waits began

    def note(task: Any) -> Any:
        seen[task.id] = time.monotonic()
        return task

    if way.startswith("async"):
        import anyio

        from imggw_client import AsyncClient

        async def main() -> tuple[float, float, Sampler]:
            async with AsyncClient(api_key=KEY, base_url=url, journal=False) as client:
                subs = [await client.submit(f"image {i}") for i in range(tasks)]
                expected.extend(sub.task_id for sub in subs)
                began.append(time.monotonic())
                cpu, started = _cpu(), time.perf_counter()
                with Sampler() as sampler:
                    if way == "async-as_completed":
                        async for task in client.as_completed(subs):
                            note(task)
                    else:

                        async def one(sub: Any) -> None:
                            note(await client.wait(sub))

                        async with anyio.create_task_group() as group:
                            for sub in subs:
                                group.start_soon(one, sub)
                return time.perf_counter() - started, _cpu() - cpu, sampler

        wall, cpu, sampler = anyio.run(main)
    else:
        from imggw_client import Client

        with Client(api_key=KEY, base_url=url, journal=False) as client:
            subs = [client.submit(f"image {i}") for i in range(tasks)]
            expected.extend(sub.task_id for sub in subs)
            began.append(time.monotonic())
            cpu, started = _cpu(), time.perf_counter()
            with Sampler() as sampler:
                if way == "sync-as_completed":
                    for task in client.as_completed(subs):
                        note(task)
                else:  # a thread per wait, or the executor's default: cpu_count + 4
                    workers = tasks if way == "sync-threads" else None
                    with ThreadPoolExecutor(max_workers=workers) as pool:
                        # Noted in the worker, as soon as its wait returns.
                        list(pool.map(lambda sub: note(client.wait(sub)), subs))
            wall, cpu = time.perf_counter() - started, _cpu() - cpu
    assert sorted(seen) == sorted(expected), "a task missing"
    return {"seconds": wall, "cpu_seconds": cpu, "peak_threads": sampler.threads,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "wait_rss_mib": sampler.rss_mib, "seen": seen, "began": began[0]}  # fmt: skip


def part2(tasks: int, rounds: int, duration: tuple[float, float]) -> dict[str, Any]:
    found: dict[str, Any] = {"load_before": load(), "tasks": tasks, "rounds": rounds,
                             "duration": duration}  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for r in range(rounds):
        order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
        for way in order:
            with gateway(duration_min=duration[0], duration_max=duration[1], seed=7) as url:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", way, "--url", url,
                     "--tasks", str(tasks)],
                    stdout=subprocess.PIPE, text=True, check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"{way} failed (exit {done.returncode})")
                row = json.loads(done.stdout.splitlines()[-1])
                requests = stats(url)["requests"]
                finished = stats(url, "/_bench/finished")
            # From the finish, or from when the waits began for a task that finished while
            # the others were being submitted.
            began = row.pop("began")
            lags = sorted(at - max(finished[task_id], began)
                          for task_id, at in row.pop("seen").items())  # fmt: skip
            row["lag_p50"] = lags[len(lags) // 2]
            row["lag_p95"] = lags[int(0.95 * (len(lags) - 1))]
            row["lag_max"] = lags[-1]
            row["queries"] = requests.get(QUERY, 0)
            row["queries_per_task"] = row["queries"] / tasks
            runs[way].append(row)
    found["runs"] = runs
    found["load_after"] = load()
    return found


def print_part2(found: dict[str, Any]) -> None:
    low, high = found["duration"]
    print(f"Part 2: {found['tasks']:,} tasks of {low:g} to {high:g} s, submitted one after "
          f"another, then waited on; each way in its own process against a fresh gateway, "
          f"{found['rounds']} rounds")  # fmt: skip
    print(f"  ({found['load_before']} before, {found['load_after']} after)")
    print(f"  {'way':<48}{'wall s':>18}{'seen after, p50 s':>20}{'p95 s':>18}"
          f"{'queries/task':>18}{'CPU s':>18}{'threads':>10}{'peak RSS MiB':>22}")  # fmt: skip
    for way, label in WAYS.items():
        rows = found["runs"][way]

        def col(name: str, fmt: str = ".2f", rows: list[dict[str, Any]] = rows) -> str:
            return spread([row[name] for row in rows], fmt)

        threads = max(row["peak_threads"] for row in rows)
        print(f"  {label:<48}{col('seconds'):>18}{col('lag_p50'):>20}{col('lag_p95'):>18}"
              f"{col('queries_per_task'):>18}"
              f"{col('cpu_seconds'):>18}{threads:>10}{col('peak_rss_mib', '.1f'):>22}")  # fmt: skip
    print("  (median and range of the rounds; seen after: from a task's finish at the gateway "
          "(or the start of the waits, if later) to its wait returning it to the code; "
          "threads: the most alive at once while waiting, the sampler's own not counted; "
          "peak RSS of the whole process)")  # fmt: skip


# --------------------------------------------------------------------------- part 3


def part3(base_src: str, head_src: str | None, rounds: int, sizes: str) -> dict[str, Any]:
    """bench/batch.py's scale part from two trees, alternating."""
    trees = {"head": head_src, "base": base_src}
    found: dict[str, Any] = {
        "load_before": load(),
        "sizes": sizes,
        "rounds": rounds,
        "trees": {k: v or "(this environment)" for k, v in trees.items()},
    }
    runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    for r in range(rounds):
        for tree in trees if r % 2 == 0 else reversed(trees):
            env = dict(os.environ)
            src = trees[tree]
            if src:
                env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(
                    os.pathsep
                )
            command = [sys.executable, str(Path(__file__).parent / "batch.py"), "--no-compare",
                       "--json", "--sizes", sizes]  # fmt: skip
            print(f"  part 3, round {r + 1}, {tree}: {' '.join(command[1:])}", file=sys.stderr,
                  flush=True)  # fmt: skip
            done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"bench/batch.py failed from {tree} (exit {done.returncode})")
            scale = json.loads(done.stdout.splitlines()[-1])["scale"]
            runs[tree].append({
                str(row["lines"]): {k: row[k] for k in ("cpu_ms_per_line", "peak_rss_mib",
                                                         "runner_rss_mib", "seconds",
                                                         "requests_per_line")}
                for row in scale["rows"]
            })  # fmt: skip
    found["runs"] = runs
    found["load_after"] = load()
    return found


def _overlap(a: list[float], b: list[float]) -> bool:
    return min(a) <= max(b) and min(b) <= max(a)


def print_part3(found: dict[str, Any]) -> None:
    print(f"Part 3: bench/batch.py's scale part (concurrency 32, the CLI's display on), "
          f"{found['rounds']} rounds a tree, alternating")  # fmt: skip
    for tree, src in found["trees"].items():
        print(f"  {tree}: {src}")
    print(f"  ({found['load_before']} before, {found['load_after']} after)")
    print(f"  {'lines':>8} {'tree':<6}{'CPU ms/line':>20}{'peak RSS MiB':>22}"
          f"{'RSS - gateway MiB':>22}{'wall s':>22}")  # fmt: skip
    for size in found["sizes"].split(","):
        cells: dict[str, dict[str, list[float]]] = {}
        for tree, runs in found["runs"].items():
            cells[tree] = {k: [run[size][k] for run in runs] for k in runs[0][size]}
            c = cells[tree]
            print(f"  {int(size):>8,} {tree:<6}{spread(c['cpu_ms_per_line']):>20}"
                  f"{spread(c['peak_rss_mib'], '.1f'):>22}{spread(c['runner_rss_mib'], '.1f'):>22}"
                  f"{spread(c['seconds'], '.1f'):>22}")  # fmt: skip
        head, base = cells["head"], cells["base"]
        verdicts = []
        for name, label in (("cpu_ms_per_line", "CPU"), ("peak_rss_mib", "RSS")):
            ratio = statistics.median(head[name]) / statistics.median(base[name])
            if found["rounds"] < 2:
                noise = "one round: no noise measured"
            elif _overlap(head[name], base[name]):
                noise = "within noise"
            else:
                noise = "NOT within noise"
            verdicts.append(f"{label} {ratio:.2f}x, {noise}")
        print(f"  {'':>8} head/base: {'; '.join(verdicts)}")
    print("  (median and range of the rounds; within noise: the two trees' ranges overlap)")


# --------------------------------------------------------------------------- part 4

ANSWER_DELAY = 0.05  # part 4: the gateway answers every request this late
UNFINISHED_TARGET = 3.0  # seconds for unfinished() over 500 rows
LIST_TARGET = (1.0, 100.0)  # imggw tasks on 100,000 rows: seconds, MiB


def _unknown_rows(journal: Any, scope: Any, count: int, tag: str) -> list[str]:
    """``count`` journaled submits of unknown outcome (their rows made as a submit makes them
    before its request leaves, never sent): their keys."""
    from imggw_client import ImageRequest
    from imggw_client._core import states

    keys = [f"bench-{tag}-{uuid.uuid4().hex}" for _ in range(count)]
    for n, key in enumerate(keys):
        journal.record(states.Sending(key, "beta", ImageRequest(f"{PROMPT} {n}")), scope)
    return keys


def unfinished_rows(url: str, folder: Path, rows: int, rounds: int) -> dict[str, list[float]]:
    """``unfinished()`` over ``rows`` unknown rows, and the same replays one at a time (each
    round on rows of its own, the two ways alternating which goes first)."""
    import anyio

    from imggw_client import AsyncClient
    from imggw_client.tracking import Journal

    found: dict[str, list[float]] = {"unfinished()": [], "one at a time": []}

    async def main() -> None:
        for r in range(rounds):
            journal = Journal(folder / f"unfinished-{r}.sqlite")
            async with (
                AsyncClient(api_key=KEY, base_url=url, journal=journal) as client,
                AsyncClient(api_key=KEY, base_url=url, journal=False) as plain,
            ):
                _unknown_rows(journal, client.journal_scope, rows, f"u{r}")
                # The one-at-a-time side's keys: new to the gateway too (a first send each).
                by_hand = [f"bench-h{r}-{uuid.uuid4().hex}" for _ in range(rows)]
                for way in found if r % 2 == 0 else list(found)[::-1]:
                    started = time.perf_counter()
                    if way == "unfinished()":
                        subs = await client.unfinished()
                        assert len(subs) == rows, f"{len(subs)} of {rows} came back"
                    else:
                        for n, key in enumerate(by_hand):
                            await plain.submit(f"{PROMPT} {n}", idempotency_key=key)
                    found[way].append(time.perf_counter() - started)
            journal.close()

    anyio.run(main)
    return found


def _big_journal(path: Path, rows: int) -> None:
    """A journal of ``rows`` saved tasks, as the command line writes them (its first row
    through the journal, then copies in one statement)."""
    from imggw_client import ImageRequest
    from imggw_client._core import states
    from imggw_client.tracking import Journal, Scope

    journal = Journal(path)
    journal.record(states.Sending("bench-0", "beta", ImageRequest(PROMPT)),
                   Scope("http://127.0.0.1:9", "0" * 64))  # fmt: skip
    journal.close()
    import sqlite3

    files = json.dumps([f"/home/user/images/out/{n}-0.png" for n in range(2)])
    values = {"idempotency_key": "'bench-' || i", "task_id": "CAST(100000 + i AS TEXT)",
              "state": "'saved'", "files": "?", "created": "created + i",
              "prompt": "prompt || ' ' || i"}  # fmt: skip
    with sqlite3.connect(path) as db:
        columns = [c[1] for c in db.execute("PRAGMA table_info(tasks)") if c[1] != "row"]
        chosen = ", ".join(values.get(c, c) for c in columns)
        db.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            f"INSERT INTO tasks ({', '.join(columns)}) SELECT {chosen} FROM n, "
            "(SELECT * FROM tasks WHERE idempotency_key = 'bench-0')",
            (rows - 1, files),
        )


LISTINGS = {
    "imggw tasks": ["tasks"],
    "imggw tasks --json": ["tasks", "--json"],
    "imggw tasks --all (every row)": ["tasks", "--all"],
    "imggw --version (start only)": ["--version"],
}


# The command as its entry point runs it, telling its own peak RSS (VmHWM) at exit on the
# descriptor PEAK_FD names: getrusage's ru_maxrss of a child counts the process it was forked
# from.
LISTING_CHILD = """
import atexit, os, sys

def peak() -> None:
    with open("/proc/self/status") as status:
        found = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    os.write(int(os.environ["PEAK_FD"]), found.encode())

atexit.register(peak)
sys.argv = ["imggw", *sys.argv[1:]]
from imggw_cli import main
main()
"""


def _listing(words: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """One ``imggw`` process: its wall time, its peak RSS (MiB) and how many lines it printed."""
    told, tell = os.pipe()
    try:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", LISTING_CHILD, *words],
                                 env={**env, "PEAK_FD": str(tell)}, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, pass_fds=(tell,))  # fmt: skip
        assert child.stdout is not None
        lines = sum(1 for _ in child.stdout)
        child.stdout.close()
        code = child.wait()
        wall = time.perf_counter() - started
    finally:
        os.close(tell)
    with os.fdopen(told, "rb") as answer:
        kib = int(answer.read() or 0)
    assert code == 0, f"{words}: exit {code}"
    return wall, kib / 1024, lines


def listing(folder: Path, rows: int, rounds: int) -> dict[str, Any]:
    """``imggw tasks`` and its baselines on a journal of ``rows`` rows (see the docstring)."""
    path = folder / "big.sqlite"
    _big_journal(path, rows)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    env.update(IMGGW_JOURNAL=str(path), IMGGW_API_KEY=KEY)
    found: dict[str, dict[str, Any]] = {
        name: {"wall": [], "rss_mib": [], "lines": 0} for name in LISTINGS
    }
    for r in range(rounds + 1):  # the first round warms the page cache and is not kept
        order = list(LISTINGS.items())
        for name, words in order if r % 2 else order[::-1]:
            wall, rss, lines = _listing(words, env)
            if r:
                found[name]["wall"].append(wall)
                found[name]["rss_mib"].append(rss)
                found[name]["lines"] = lines
    return {"rows": rows, "ways": found}


def part4(rows: int, tasks: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="imggw-bench-") as tmp:
        folder = Path(tmp)
        with gateway(duration_min=0.01, duration_max=0.02, answer_delay=ANSWER_DELAY) as url:
            resent = unfinished_rows(url, folder, tasks, rounds)
        listed = listing(folder, rows, rounds)
    return {"unfinished": {"rows": tasks, "answer_delay": ANSWER_DELAY, "ways": resent},
            "listing": listed, "load": load()}  # fmt: skip


def print_part4(found: dict[str, Any]) -> None:
    resent = found["unfinished"]
    print(f"Part 4: the journal's edges ({found['load']})")
    late = resent["answer_delay"] * 1000
    print(f"  unfinished() over {resent['rows']} unknown rows, the gateway answering {late:.0f} "
          f"ms late (target under {UNFINISHED_TARGET:g} s):")  # fmt: skip
    ways = resent["ways"]
    for way, walls in ways.items():
        print(f"  {way:>28}: {spread(walls)} s")
    ratio = statistics.median(ways["one at a time"]) / statistics.median(ways["unfinished()"])
    verdict = "met" if statistics.median(ways["unfinished()"]) < UNFINISHED_TARGET else "NOT met"
    print(f"  {'':>28}  unfinished() is {ratio:.1f}x as fast as one at a time; target {verdict}")
    listed = found["listing"]
    seconds, mib = LIST_TARGET
    print(f"  imggw tasks on {listed['rows']:,} rows, a process each (target under {seconds:g} s "
          f"and {mib:g} MiB):")  # fmt: skip
    for name, got in listed["ways"].items():
        print(f"  {name:>32}: {spread(got['wall'])} s, peak RSS {spread(got['rss_mib'], '.0f')} "
              f"MiB, {got['lines']:,} lines")  # fmt: skip
    shown = listed["ways"]["imggw tasks"]
    met = statistics.median(shown["wall"]) < seconds and max(shown["rss_mib"]) < mib
    print(f"  {'':>32}  target {'met' if met else 'NOT met'} (median wall, highest RSS)")


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part",
        type=int,
        choices=(1, 2, 3, 4),
        action="append",
        help="run only this part (repeatable) [1, 2 and 4; 3 with --base-src]",
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke check")
    parser.add_argument(
        "--tasks",
        type=int,
        help="part 1: tasks a side and mode [500]; part 2: tasks waited on [1000]; part 4: "
        "unknown rows unfinished() resends [500]",
    )
    parser.add_argument("--rows", type=int, help="part 4: rows of the journal listed [100000]")
    parser.add_argument(
        "--rounds", type=int, help="rounds [part 1: 5, part 2: 3, part 3: 3, part 4: 3]"
    )
    parser.add_argument("--base-src", help="part 3: the src folder of the tree to compare with")
    parser.add_argument(
        "--head-src", help="part 3: the src folder of this side [the one this interpreter imports]"
    )
    parser.add_argument("--sizes", help="part 3: batch sizes [1000,10000,100000]")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=list(WAYS), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()  # fmt: skip
    if args.serve:
        return serve_gateway(json.loads(args.serve))
    if args.child:
        print(json.dumps(waits_child(args.child, args.url, args.tasks)))
        return 0
    parts = args.part or ([1, 2, 3, 4] if args.base_src else [1, 2, 4])
    if 3 in parts and not args.base_src:
        parser.error("part 3 needs --base-src (a worktree's src folder)")
    summary: dict[str, Any] = {}
    if 1 in parts:
        tasks = args.tasks or (100 if args.quick else 500)
        summary["part1"] = part1(tasks, args.rounds or 10, 1 if args.quick else 3)
        if not args.json:
            print_part1(summary["part1"])
            print(flush=True)
    if 2 in parts:
        tasks, duration = (args.tasks or 300, (1.0, 3.0)) if args.quick else (
            args.tasks or 1000, (2.0, 8.0))  # fmt: skip
        summary["part2"] = part2(tasks, args.rounds or (1 if args.quick else 3), duration)
        if not args.json:
            print_part2(summary["part2"])
            print(flush=True)
    if 4 in parts:
        summary["part4"] = part4(args.rows or (20_000 if args.quick else 100_000),
                                 args.tasks or (100 if args.quick else 500),
                                 args.rounds or (1 if args.quick else 3))  # fmt: skip
        if not args.json:
            print_part4(summary["part4"])
            print(flush=True)
    if 3 in parts:
        sizes = args.sizes or ("1000,2000,4000" if args.quick else "1000,10000,100000")
        summary["part3"] = part3(args.base_src, args.head_src,
                                 args.rounds or (1 if args.quick else 3), sizes)  # fmt: skip
        if not args.json:
            print_part3(summary["part3"])
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
