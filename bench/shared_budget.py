"""A request budget shared by many processes through Redis (DESIGN 16): ``RateLimit(...,
store="redis://...")`` against the same limits kept by each process alone, in the same run,
and what the store costs per request.

Part 1, four processes, one key: a real ``redis-server`` on a free loopback port, and the
reference gateway in a process of its own (uvicorn, 127.0.0.1) limiting the key to 20 submits
and 100 queries in any 1 s (surface A's provider, 20 per 10 s and 10 a second, scaled 10x) with
tasks of 0.2 to 0.6 s. Four worker processes (this file with ``--child``), started together on
one signal, each with one ``Client`` (``--client async``: one ``AsyncClient``) configured at the
gateway's limits, ``RateLimit(submits_per_second=20, queries_per_second=100)``, run M jobs each
(``submit`` then ``wait``, up to ``--threads`` at once per process), polling every 0.04 s
growing to 0.2 s (``PollPolicy(learn=False)``): about 5 queries a task, so that at 20 tasks a
second the queries press on their limit as much as the submits do. Each mode on a fresh
gateway: **shared**, all four through one store; **alone**, the same four with their own
in-process budgets (each keeps 20/s and 100/s; together they offer 4x that). The gateway
records the arrival of every submit and query and whether it answered 429. Printed per mode:
the 429s (submits + queries), the peak submits and queries sent in any 1 s window (sliding, as
the gateway counts, refused ones included), the wall time (the common start to the last job
done) against the floor the limits allow (all submits / 20 per second) and their ratio, the
tasks created (each job billed once) and the jobs lost. Targets, shared: 0 429s, peaks <= the
limits (20 and 100), wall <= 1.15x the floor, tasks created == jobs, none lost. Alone is the
baseline: it meets 429s.
``--over X`` configures every client X times above the gateway's limits instead (the shared
budget then meets 429s, pauses and slows every process at once; no target).

Part 2, what the store costs: one client's tight loop of ``get`` on one task, through an
in-process gateway with no limits, under ``RateLimit(1e6, 1e6, store=...)`` (two script calls
per request: take and finished), under ``RateLimit(1e6, 1e6)`` (in-process budget) and with no
``RateLimit``, interleaved in alternating rounds; the sync ``Client`` and the ``AsyncClient``.
Printed: microseconds per request, the store's cost per request (store less in-process) and
the ratio store / in-process; for reference, one redis-py PING and one call of the budget's
script (``take``) on the same server, in the same rounds as the sync client. No target: the
figure to know is the cost, about two calls of the script.

Run: python bench/shared_budget.py [--quick] [--jobs M] [--workers W] [--threads T]
     [--client sync|async] [--poll FIRST MAX] [--over X] [--part 1|2] [--json]
Full: 150 jobs per process (600 in all, a 30 s floor per mode), 2,000 requests per contender
in part 2; about 2 minutes. ``--quick``: 40 jobs per process (8 s floor), 300 requests; under
40 s. Needs ``redis-server`` on the PATH (or ``--redis-server``) and redis-py (``imggw[redis]``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import (
    child_gateway,
    gateway_report,
    interleaved,
    interleaved_async,
    peak_in_window,
)

KEY = "sk-bench-shared-budget-0001"
WORKERS = 4
SUBMIT_LIMIT = (20, 1.0)  # the gateway's: at most 20 submits per key in any 1 s
QUERY_LIMIT = (100, 1.0)  # and 100 queries
DURATION = (0.2, 0.6)  # seconds a task runs
POLL = (0.04, 0.2)  # polls: PollPolicy(initial_interval, max_interval, learn=False)
WAIT_TIMEOUT = 120.0  # per job's wait; no task comes near it
HUGE = 1e6  # part 2: a ceiling no loop reaches
MODES = {"shared": "one store (shared)", "alone": "own budgets (baseline)"}


# --------------------------------------------------------------------------- redis-server


def free_port() -> int:
    with socket.socket() as probe:  # an ephemeral port, free a moment ago
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(binary: str) -> Iterator[str]:
    """A fresh redis-server on 127.0.0.1 (no persistence); yields its ``redis://`` URL once it
    answers PING, and kills it at the end."""
    import redis

    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no"]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 15
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as probe:
            while True:
                try:
                    if probe.ping():
                        break
                except redis.ConnectionError:
                    if child.poll() is not None or time.monotonic() > deadline:
                        err = child.stderr.read().decode() if child.stderr else ""
                        raise RuntimeError(f"redis-server did not start: {err[-300:]}") from None
                    time.sleep(0.05)
        yield url
    finally:
        child.kill()
        child.wait(timeout=10)


# --------------------------------------------------------------------------- the gateway


def serve_gateway(args: argparse.Namespace) -> int:
    """The reference gateway in this process, noting when every submit and query came and
    whether it was refused (``GET /_bench/log``). Prints the URL, serves until stdin closes."""
    from imggw_client.mock import MockGateway
    from imggw_client.mock._asgi import serve_app

    arrivals: dict[str, list[float]] = {"submit": [], "query": []}
    refused: dict[str, list[float]] = {"submit": [], "query": []}

    class RecordingGateway(MockGateway):
        # Called (under the gateway's lock) for every authenticated submit and query, with
        # the gateway's monotonic clock: the moment the limit is applied, as it counts it.
        def _admit(self, owner: str, kind: str, now: float) -> float | None:
            wait = super()._admit(owner, kind, now)
            arrivals[kind].append(now)
            if wait is not None:
                refused[kind].append(now)
            return wait

    gateway = RecordingGateway(
        api_keys=[KEY],
        seed=args.seed,
        duration_min=DURATION[0],
        duration_max=DURATION[1],
        submit_limit=f"{SUBMIT_LIMIT[0]}/{SUBMIT_LIMIT[1]:g}",
        query_limit=f"{QUERY_LIMIT[0]}/{QUERY_LIMIT[1]:g}",
    )
    inner = gateway.asgi()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/_bench/log":
            with gateway._lock:
                body = json.dumps({"arrivals": arrivals, "refused": refused}).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await inner(scope, receive, send)

    with serve_app(app, request_timeout=30.0) as url:
        print(url, flush=True)
        sys.stdin.read()  # until the parent closes it (or dies)
    return 0


@contextlib.contextmanager
def gateway_process(seed: int) -> Iterator[str]:
    """A fresh reference gateway in a child process on 127.0.0.1; yields its URL."""
    with child_gateway([sys.executable, __file__, "--serve", "--seed", str(seed)]) as url:
        yield url


# --------------------------------------------------------------------------- the workers


class Warnings(logging.Handler):
    """Counts what the SDK logs at WARNING or above (a store that fails, say)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen[record.getMessage()[:200]] += 1


def child_main(spec: dict[str, Any]) -> int:
    """One worker: makes its client, says ``ready``, waits for the common start (a monotonic
    time on stdin), runs its jobs, prints what it did as JSON."""
    from imggw_client import AsyncClient, Client, ImggwError, PollPolicy, RateLimit

    warnings = Warnings()
    logging.getLogger("imggw_client").addHandler(warnings)
    scale = spec["over"]  # 1: at the gateway's limits
    limit = RateLimit(submits_per_second=scale * SUBMIT_LIMIT[0] / SUBMIT_LIMIT[1],
                      queries_per_second=scale * QUERY_LIMIT[0] / QUERY_LIMIT[1],
                      store=spec["store"])  # fmt: skip
    options = {"api_key": KEY, "base_url": spec["url"], "rate_limit": limit,
               "poll": PollPolicy(initial_interval=spec["poll"][0],
                                  max_interval=spec["poll"][1], learn=False)}  # fmt: skip
    errors: Counter[str] = Counter()
    finished: list[float] = []
    tag, jobs, threads = spec["tag"], spec["jobs"], spec["threads"]

    def failed(err: Exception) -> None:
        name = err.message if isinstance(err, ImggwError) else str(err)
        errors[f"{type(err).__name__}: {name}"[:200]] += 1

    def go() -> float:
        print("ready", flush=True)
        start = float(sys.stdin.readline())
        time.sleep(max(0.0, start - time.monotonic()))
        return start

    if spec["client"] == "sync":
        with Client(**options) as client:

            def one(i: int) -> None:
                try:
                    sub = client.submit(f"shared budget {tag} {i}")
                    client.wait(sub, wait_timeout=WAIT_TIMEOUT)
                    finished.append(time.monotonic())
                except Exception as err:
                    failed(err)

            start = go()
            with ThreadPoolExecutor(max_workers=threads) as pool:
                list(pool.map(one, range(jobs)))
    else:

        async def main() -> float:
            async with AsyncClient(**options) as client:
                gate = asyncio.Semaphore(threads)

                async def one(i: int) -> None:
                    async with gate:
                        try:
                            sub = await client.submit(f"shared budget {tag} {i}")
                            await client.wait(sub, wait_timeout=WAIT_TIMEOUT)
                            finished.append(time.monotonic())
                        except Exception as err:
                            failed(err)

                start = await asyncio.get_running_loop().run_in_executor(None, go)
                await asyncio.gather(*(one(i) for i in range(jobs)))
                return start

        start = asyncio.run(main())
    ended = max(finished, default=time.monotonic())
    print(json.dumps({"start": start, "ended": ended, "done": len(finished),
                      "errors": dict(errors), "warnings": dict(warnings.seen)}))  # fmt: skip
    return 0


def run_mode(mode: str, args: argparse.Namespace, store: str, seed: int) -> dict[str, Any]:
    """The workers against a fresh gateway, through ``store`` (shared) or alone."""
    jobs, total = args.jobs, args.jobs * args.workers
    floor = total / (SUBMIT_LIMIT[0] / SUBMIT_LIMIT[1])
    bound = 60 + 6 * floor  # a run is bounded: a worker past it is killed
    with gateway_process(seed) as url:
        children = []
        for w in range(args.workers):
            spec = {"url": url, "store": store if mode == "shared" else None, "jobs": jobs,
                    "threads": args.threads, "client": args.client, "tag": f"{mode}-{w}",
                    "poll": args.poll, "over": args.over}  # fmt: skip
            command = [sys.executable, __file__, "--child", json.dumps(spec)]
            children.append(subprocess.Popen(command, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True))  # fmt: skip
        for child in children:
            assert child.stdout is not None
            said = child.stdout.readline().strip()
            if said != "ready":
                raise RuntimeError(f"{mode}: a worker did not start (it said {said!r})")
        start = time.monotonic() + 0.3
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"{start!r}\n")
            child.stdin.flush()
        results = []
        for child in children:
            try:
                out, _ = child.communicate(timeout=bound)
            except subprocess.TimeoutExpired:
                for other in children:
                    other.kill()
                raise RuntimeError(f"{mode}: a worker still ran after {bound:.0f} s") from None
            if child.returncode != 0:
                raise RuntimeError(f"{mode}: a worker exited with {child.returncode}")
            results.append(json.loads(out.splitlines()[-1]))
        report = gateway_report(url)
    stats, log = report["stats"], report["log"]
    submits, queries = log["arrivals"]["submit"], log["arrivals"]["query"]
    errors: Counter[str] = Counter()
    warnings: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
        warnings.update(r["warnings"])
    wall = max(r["ended"] for r in results) - start
    done = sum(r["done"] for r in results)
    return {
        "jobs": total,
        "limited": stats["rate_limited"],
        "limited_submits": len(log["refused"]["submit"]),
        "limited_queries": len(log["refused"]["query"]),
        "submits": len(submits),
        "queries": len(queries),
        "queries_per_job": len(queries) / max(1, total),
        "peak_submits": peak_in_window(submits, SUBMIT_LIMIT[1]),
        "peak_queries": peak_in_window(queries, QUERY_LIMIT[1]),
        "wall_s": wall,
        "floor_s": floor,
        "wall_ratio": wall / floor,
        "billed": stats["tasks_created"],
        "done": done,
        "lost": total - done,
        "errors": dict(errors),
        "warnings": dict(warnings),
    }


def part1(args: argparse.Namespace, store: str) -> dict[str, Any]:
    return {mode: run_mode(mode, args, store, seed) for seed, mode in enumerate(MODES, 1)}


def part1_checks(r: dict[str, Any]) -> list[tuple[str, bool]]:
    return [
        ("0 429s", r["limited"] == 0),
        (f"peak submits <= {SUBMIT_LIMIT[0]}", r["peak_submits"] <= SUBMIT_LIMIT[0]),
        (f"peak queries <= {QUERY_LIMIT[0]}", r["peak_queries"] <= QUERY_LIMIT[0]),
        ("wall <= 1.15x", r["wall_ratio"] <= 1.15),
        (f"billed {r['jobs']}", r["billed"] == r["jobs"]),
        ("lost 0", r["lost"] == 0),
    ]


def print_part1(results: dict[str, Any], args: argparse.Namespace) -> None:
    r0 = next(iter(results.values()))
    print(
        f"Part 1: {args.workers} processes x {args.jobs} jobs (submit + wait, {args.threads} "
        f"at once per process, {args.client} client), each RateLimit(submits_per_second="
        f"{args.over * SUBMIT_LIMIT[0]:g}, queries_per_second={args.over * QUERY_LIMIT[0]:g}); "
        f"the gateway allows "
        f"{SUBMIT_LIMIT[0]} submits and {QUERY_LIMIT[0]} queries per key in any 1 s; tasks of "
        f"{DURATION[0]:g} to {DURATION[1]:g} s; floor = {r0['jobs']} submits / "
        f"{SUBMIT_LIMIT[0]}/s = {r0['floor_s']:.1f} s"
    )
    print(
        f"{'':<24}{'429s':>6}{'(s+q)':>10}{'submits':>8}{'queries':>8}{'q/job':>6}"
        f"{'peak s/1s':>10}{'q/1s':>6}{'wall':>8}{'/floor':>7}{'billed':>7}{'lost':>5}"
    )
    for mode, label in MODES.items():
        r = results[mode]
        split = f"{r['limited_submits']}+{r['limited_queries']}"
        print(
            f"{label:<24}{r['limited']:>6}{split:>10}{r['submits']:>8}{r['queries']:>8}"
            f"{r['queries_per_job']:>6.2f}{r['peak_submits']:>10}{r['peak_queries']:>6}"
            f"{r['wall_s']:>7.1f}s{r['wall_ratio']:>6.2f}x{r['billed']:>7}{r['lost']:>5}"
        )
    shared, alone = results["shared"], results["alone"]
    verdicts = ", ".join(f"{n} {'ok' if ok else 'MISSED'}" for n, ok in part1_checks(shared))
    print(f"  shared: {verdicts}")
    print(
        f"  alone (baseline): {alone['limited']} 429s, peaks {alone['peak_submits']} submits "
        f"and {alone['peak_queries']} queries in 1 s; shared / alone wall "
        f"{shared['wall_s'] / alone['wall_s']:.2f}x"
    )
    for mode in MODES:
        for what in ("errors", "warnings"):
            for message, count in results[mode][what].items():
                print(f"    {mode} {what[:-1]} x{count}: {message}")


# --------------------------------------------------------------------------- part 2


def script_calls(r: Any) -> int:
    """Scripts the server ran so far (EVAL and EVALSHA)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha",
                                                                     "cmdstat_eval"))  # fmt: skip


def part2(store: str, requests: int, rounds: int) -> dict[str, Any]:
    import redis

    from imggw_client import RateLimit
    from imggw_client._core import shared_budget
    from imggw_client.mock import MockGateway

    per_round = max(1, requests // rounds)
    made = 2 * (per_round // 4 + 1 + rounds * per_round)  # through the store: sync, then async
    limits = {
        "store": RateLimit(submits_per_second=HUGE, queries_per_second=HUGE, store=store),
        "in-process": RateLimit(submits_per_second=HUGE, queries_per_second=HUGE),
        "none": None,
    }
    gateway = MockGateway(api_keys=[KEY], duration_min=0, duration_max=0)
    result: dict[str, Any] = {"requests": per_round * rounds}
    with redis.Redis.from_url(store) as r:
        calls_before = script_calls(r)

    with contextlib.ExitStack() as stack:
        clients = {name: stack.enter_context(gateway.client(rate_limit=limit))
                   for name, limit in limits.items()}  # fmt: skip
        task_id = clients["none"].submit("shared budget cost").task_id
        contenders = {name: (lambda c=c: c.get(task_id)) for name, c in clients.items()}
        # The references run in the same rounds: the store, alone, at the same moments.
        raw = stack.enter_context(redis.Redis.from_url(store))
        script = raw.register_script(shared_budget.SCRIPTS["take"])
        lane = shared_budget.lane_key("bench", "http://part2", "query")
        keys = [lane, shared_budget.flying_key(lane)]
        take = ["-1", "0.0", "", repr(shared_budget.LEASE), "fixed", repr(HUGE)]
        contenders["ping"] = raw.ping
        contenders["script"] = lambda: script(keys=keys, args=take)
        timed = interleaved(contenders, rounds=rounds, per_round=per_round)
        result["redis"] = {name: timed.pop(name) for name in ("ping", "script")}
        result["sync"] = timed
    before = gateway.stats()["rate_limited"]

    async def run_async() -> dict[str, float]:
        async with contextlib.AsyncExitStack() as stack:
            clients = {name: await stack.enter_async_context(gateway.async_client(rate_limit=lim))
                       for name, lim in limits.items()}  # fmt: skip
            return await interleaved_async(
                {name: (lambda c=c: c.get(task_id)) for name, c in clients.items()},
                rounds=rounds,
                per_round=per_round,
            )

    result["async"] = asyncio.run(run_async())
    result["limited"] = gateway.stats()["rate_limited"] - before

    with redis.Redis.from_url(store) as r:
        reference = per_round // 4 + 1 + rounds * per_round  # the script's own calls
        result["script_calls_per_request"] = (script_calls(r) - calls_before - reference) / made
    return result


def print_part2(r: dict[str, Any]) -> None:
    print(
        f"\nPart 2: the cost of the shared budget: {r['requests']} `get`s per contender "
        f"(median of alternating rounds) through one client and an in-process gateway with no "
        f"limits; RateLimit({HUGE:g}/s, {HUGE:g}/s) through the store, in-process, or none"
    )
    print(
        f"{'client':<8}{'store':>11}{'in-process':>13}{'none':>11}{'store cost':>13}"
        f"{'store/in-proc':>15}{'in-proc/none':>14}"
    )
    for kind in ("sync", "async"):
        t = {name: 1e6 * s for name, s in r[kind].items()}
        print(
            f"{kind:<8}{t['store']:>9.1f}us{t['in-process']:>11.1f}us{t['none']:>9.1f}us"
            f"{t['store'] - t['in-process']:>11.1f}us{t['store'] / t['in-process']:>14.2f}x"
            f"{t['in-process'] / t['none']:>13.2f}x"
        )
    ping, script = 1e6 * r["redis"]["ping"], 1e6 * r["redis"]["script"]
    print(
        f"  reference (sync, same rounds): redis-py PING {ping:.1f} us, one call of the "
        f"budget's script (take) {script:.1f} us; script calls per request through the store "
        f"{r['script_calls_per_request']:.2f} (take, finished); 429s {r['limited']}"
    )


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, help="part 1: jobs per process [150; quick 40]")
    parser.add_argument("--workers", type=int, default=WORKERS, help="processes [4]")
    parser.add_argument("--threads", type=int, default=16, help="jobs at once per process [16]")
    parser.add_argument("--client", choices=["sync", "async"], default="sync", help="[sync]")
    parser.add_argument(
        "--poll",
        type=float,
        nargs=2,
        default=POLL,
        metavar=("FIRST", "MAX"),
        help="part 1: seconds between polls, first and longest [0.04 0.2]",
    )
    parser.add_argument("--over", type=float, default=1.0, help="part 1: configure the "
                        "clients this many times above the gateway's limits, to see the shared "
                        "budget meet 429s and pause and slow all processes [1]")  # fmt: skip
    parser.add_argument("--requests", type=int, help="part 2: gets per contender [2000; 300]")
    parser.add_argument("--part", choices=["1", "2"], help="run only one part")
    parser.add_argument("--redis-server", default="redis-server", help="[redis-server]")
    parser.add_argument("--quick", action="store_true", help="everything smaller, under 40 s")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    hidden = argparse.SUPPRESS
    parser.add_argument("--serve", action="store_true", help=hidden)
    parser.add_argument("--child", help=hidden)
    parser.add_argument("--seed", type=int, default=1, help=hidden)
    args = parser.parse_args()
    if args.serve:
        return serve_gateway(args)
    if args.child:
        return child_main(json.loads(args.child))
    args.jobs = args.jobs or (40 if args.quick else 150)
    requests = args.requests or (300 if args.quick else 2000)
    rounds = 6 if args.quick else 10
    binary = shutil.which(args.redis_server) or "/usr/bin/redis-server"
    summary: dict[str, Any] = {
        "workers": args.workers, "jobs_per_worker": args.jobs, "threads": args.threads,
        "client": args.client, "submit_limit": list(SUBMIT_LIMIT),
        "query_limit": list(QUERY_LIMIT), "duration": list(DURATION), "poll": list(args.poll),
        "over": args.over,
    }  # fmt: skip
    with redis_server(binary) as store:
        if args.part in (None, "1"):
            summary["part1"] = part1(args, store)
            if not args.json:
                print_part1(summary["part1"], args)
        if args.part in (None, "2"):
            summary["part2"] = part2(store, requests, rounds)
            if not args.json:
                print_part2(summary["part2"])
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
