"""Bursts at the gateway's speed (DESIGN 20): with no ``RateLimit`` the client adds no timed
delay until the gateway pushes back, meets lone 429s with a retry rather than a pause, and still
keeps to a gateway's real limits; a ``RateLimit`` keeps its exact spacing. Every gateway is the
reference gateway in a process of its own (uvicorn, 127.0.0.1); each side of a ratio is measured
in the same run.

Part 1, a burst: 150 concurrent ``submit``s to a gateway with no limits, through a fresh
``AsyncClient`` and, from 16 threads, a fresh ``Client``, against raw httpx sending the same
requests (a fresh ``httpx.AsyncClient`` / ``httpx.Client``, an idempotency key each), in
alternating rounds, median of each; then 150 concurrent ``wait``s on the finished tasks
against 150 raw GETs. Target: submits within 1.5x raw httpx, async and threaded.

Part 2, random 429s (DESIGN 25): 1,000 ``submit``s, 32 at a time, through one ``AsyncClient``,
against gateways that answer 3% of requests with a 429 (``fault_rate=0.03, faults=["429"]``):
on surface B with ``Retry-After: 1`` and without one (``no_retry_after``), and on surface A as
its provider answers (code 429 in an HTTP 200, no ``Retry-After``), each against the same
surface without them, all in alternating order on fresh gateways. Targets: within 2x the clean
run, every time; every submit accepted once (1,000 tasks created, no error).

Part 3, real limits: 100 concurrent ``generate`` + download with no ``RateLimit`` against the
limits surface A's provider documents (20 submits per 10 s, 10 queries/s, sliding windows;
tasks of 1 to 3 s), as ``bench/budget.py`` part 1: the beta surface (429 with
``Retry-After``), surface A as its provider (HTTP 200 with code 429, no ``Retry-After``), and,
to show why a lane starts with a window of requests in flight, the beta surface once more
with that window taken away (``START_WINDOW`` unbounded: the burst goes whole). Targets
(beta, adaptive only): wall within 1.15x the floor (100 / 2 submits/s), at most 10% of
requests answered 429, nothing lost, 100 billed; surface A as its provider: the same, and at
most 7% answered 429 (the pacing before bursts met 6.5% there: no more 429s at a real limit).

Part 4, waits under a ceiling: W concurrent waits under ``RateLimit(queries_per_second=50)``
against a gateway limiting queries to 50 per 1 s, as ``bench/budget.py`` part 2. Target: at
most 50 queries in any 1 s window, nothing lost.

Run: python bench/bursts.py [--full] [--part 1|2|3|4] [--json]
Quick (the default, about 2 minutes): 5 rounds in part 1, 2 in part 2, 1,000 waits on tasks of
2 to 8 s in part 4. ``--full``: 9 rounds, 4 rounds, 10,000 waits on tasks of 20 to 60 s
(about 10 minutes, 6 of them part 4).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import budget as budget_bench
from _common import child_gateway, peak_in_window

KEY = budget_bench.KEY
SUBMIT_PATH = "/beta/v1/images/generations"
BODY = {"model": "imagegen-2", "prompt": "a burst", "size": "auto", "resolution": "1k", "n": 1}


# --------------------------------------------------------------------------- the gateway


def serve_gateway(options: dict[str, Any]) -> int:
    """The reference gateway with ``options`` in this process; prints its URL, then serves
    until stdin closes."""
    from imggw_client.mock import MockGateway
    from imggw_client.mock._asgi import serve_app

    gateway = MockGateway(api_keys=[KEY], **options)
    with serve_app(gateway.asgi(), request_timeout=30.0) as url:
        print(url, flush=True)
        sys.stdin.read()
    return 0


@contextlib.contextmanager
def gateway(**options: Any) -> Iterator[str]:
    """A fresh reference gateway in a child process; yields its URL."""
    command = [sys.executable, __file__, "--serve", json.dumps(options)]
    with child_gateway(command) as url:
        yield url


def stats(url: str) -> dict[str, Any]:
    import httpx

    answer: dict[str, Any] = httpx.get(url + "/_mock/stats", timeout=60).json()
    return answer


# --------------------------------------------------------------------------- part 1


def raw_async(url: str, n: int) -> float:
    import anyio
    import httpx

    async def main() -> float:
        started = time.perf_counter()
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:

            async def one() -> None:
                key = {"Idempotency-Key": uuid.uuid4().hex}
                answer = await http.post(SUBMIT_PATH, json=BODY, headers=key)
                answer.raise_for_status()
                assert answer.json()["data"][0]["task_id"]

            async with anyio.create_task_group() as group:
                for _ in range(n):
                    group.start_soon(one)
        return time.perf_counter() - started

    return anyio.run(main)


def sdk_async(url: str, n: int, waits: list[float] | None = None) -> float:
    import anyio

    from imggw_client import AsyncClient

    async def main() -> float:
        started = time.perf_counter()
        ids: list[str] = []
        async with AsyncClient(api_key=KEY, base_url=url) as client:

            async def one() -> None:
                ids.append((await client.submit("a burst")).task_id)

            async with anyio.create_task_group() as group:
                for _ in range(n):
                    group.start_soon(one)
            took = time.perf_counter() - started
            if waits is not None:  # then wait on them all at once (each finished already)
                started = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for task_id in ids:
                        group.start_soon(client.wait, task_id)
                waits.append(time.perf_counter() - started)
        assert len(set(ids)) == n
        return took

    return anyio.run(main)


def raw_gets(url: str, ids: list[str]) -> float:
    import anyio
    import httpx

    async def main() -> float:
        started = time.perf_counter()
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:

            async def one(task_id: str) -> None:
                (await http.get(f"/beta/v1/tasks/{task_id}")).raise_for_status()

            async with anyio.create_task_group() as group:
                for task_id in ids:
                    group.start_soon(one, task_id)
        return time.perf_counter() - started

    return anyio.run(main)


def raw_threads(url: str, n: int, threads: int) -> float:
    import httpx

    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:

        def one(_: int) -> None:
            answer = http.post(
                SUBMIT_PATH, json=BODY, headers={"Idempotency-Key": uuid.uuid4().hex}
            )
            answer.raise_for_status()

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(n)))
    return time.perf_counter() - started


def sdk_threads(url: str, n: int, threads: int) -> float:
    from imggw_client import Client

    started = time.perf_counter()
    with Client(api_key=KEY, base_url=url) as client, ThreadPoolExecutor(threads) as pool:
        ids = list(pool.map(lambda _: client.submit("a burst").task_id, range(n)))
    assert len(set(ids)) == n
    return time.perf_counter() - started


def part1(n: int, threads: int, rounds: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {
        "raw_async": [], "sdk_async": [], "raw_threads": [], "sdk_threads": [],
        "sdk_waits": [], "raw_gets": [],
    }  # fmt: skip
    with gateway(duration_min=0.0, duration_max=0.0) as url:
        contenders: dict[str, Callable[[], float]] = {
            "raw_async": lambda: raw_async(url, n),
            "sdk_async": lambda: sdk_async(url, n, samples["sdk_waits"]),
            "raw_threads": lambda: raw_threads(url, n, threads),
            "sdk_threads": lambda: sdk_threads(url, n, threads),
        }
        for fn in contenders.values():  # warm up imports, the gateway and the loopback
            fn()
        samples["sdk_waits"].clear()
        ids = [str(i) for i in range(1, n + 1)]  # the warm-up's tasks: finished long since
        for r in range(rounds):
            order = list(contenders.items())
            if r % 2:
                order.reverse()
            for name, fn in order:
                samples[name].append(fn())
            samples["raw_gets"].append(raw_gets(url, ids))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "n": n, "threads": threads, "rounds": rounds, "median_s": medians, "samples": samples,
        "async_ratio": medians["sdk_async"] / medians["raw_async"],
        "threads_ratio": medians["sdk_threads"] / medians["raw_threads"],
        "waits_ratio": medians["sdk_waits"] / medians["raw_gets"],
    }  # fmt: skip


def print_part1(r: dict[str, Any]) -> None:
    m = r["median_s"]
    print(
        f"Part 1: a burst of {r['n']} concurrent submits to a gateway with no limits, fresh "
        f"clients, median of {r['rounds']} alternating rounds"
    )
    print(f"  {'':<36}{'SDK':>9}{'raw httpx':>11}{'ratio':>8}")
    rows = [
        ("AsyncClient, 150 tasks", "sdk_async", "raw_async", "async_ratio"),
        (f"Client, {r['threads']} threads", "sdk_threads", "raw_threads", "threads_ratio"),
        ("then 150 waits (raw: 150 GETs)", "sdk_waits", "raw_gets", "waits_ratio"),
    ]
    for label, sdk, raw, ratio in rows:
        print(f"  {label:<36}{m[sdk]:>8.3f}s{m[raw]:>10.3f}s{r[ratio]:>7.2f}x")
    checks = [("async <= 1.5x", r["async_ratio"] <= 1.5),
              ("threads <= 1.5x", r["threads_ratio"] <= 1.5)]  # fmt: skip
    print("  targets: " + ", ".join(f"{n} {'ok' if ok else 'MISSED'}" for n, ok in checks))


# --------------------------------------------------------------------------- part 2


def submits(url: str, n: int, bound: int, surface: str = "beta") -> dict[str, Any]:
    """N submits, ``bound`` at a time, through one AsyncClient on ``surface``."""
    import anyio

    from imggw_client import AsyncClient, ImggwError

    ids: list[str] = []
    errors: list[str] = []

    async def main() -> float:
        limiter = anyio.CapacityLimiter(bound)
        started = time.perf_counter()
        async with AsyncClient(api_key=KEY, base_url=url, surface=surface) as client:

            async def one(i: int) -> None:
                async with limiter:
                    try:
                        ids.append((await client.submit(f"random 429s {i}")).task_id)
                    except ImggwError as err:
                        errors.append(f"{type(err).__name__}: {err.message}")

            async with anyio.create_task_group() as group:
                for i in range(n):
                    group.start_soon(one, i)
        return time.perf_counter() - started

    seconds = anyio.run(main)
    return {"seconds": seconds, "accepted": len(set(ids)), "errors": errors}


# Each way: its label, the surface, the gateway's faults and quirks, and the clean way it is
# measured against (None: a clean way itself).
WAYS2: dict[str, tuple[str, str, dict[str, Any], str | None]] = {
    "clean_b": ("surface B, no 429s", "beta", {}, None),
    "b_hint": ("surface B, 429 with Retry-After: 1", "beta",
               {"fault_rate": 0.03, "faults": ["429"]}, "clean_b"),
    "b_bare": ("surface B, 429 without Retry-After", "beta",
               {"fault_rate": 0.03, "faults": ["429"], "quirks": ["no_retry_after"]}, "clean_b"),
    "clean_a": ("surface A, no 429s", "alpha", {"quirks": ["alpha_http200"]}, None),
    "a_bare": ("surface A, code 429 in HTTP 200, no Retry-After", "alpha",
               {"fault_rate": 0.03, "faults": ["429"],
                "quirks": ["no_retry_after", "alpha_http200"]}, "clean_a"),
}  # fmt: skip


def part2(n: int, bound: int, share: float, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS2}
    for r in range(rounds):
        order = list(WAYS2) if r % 2 == 0 else list(reversed(WAYS2))
        for way in order:
            _, surface, options, _ = WAYS2[way]
            if "fault_rate" in options:
                options = {**options, "fault_rate": share}
            with gateway(duration_min=0.0, duration_max=0.0, **options) as url:
                run = submits(url, n, bound, surface)
                s = stats(url)
            run.update(created=s["tasks_created"], refused=s["faults"].get("429", 0))
            runs[way].append(run)
    median = {way: statistics.median(run["seconds"] for run in runs[way]) for way in WAYS2}
    ratios = {way: median[way] / median[clean] for way, (*_, clean) in WAYS2.items() if clean}
    once = {way: all(run["created"] == n and run["accepted"] == n and not run["errors"]
                     for run in runs[way]) for way in WAYS2}  # fmt: skip
    return {"n": n, "bound": bound, "share": share, "rounds": rounds, "runs": runs,
            "median_s": median, "ratios": ratios, "accepted_once": once}  # fmt: skip


def print_part2(r: dict[str, Any]) -> None:
    print(
        f"\nPart 2: {r['n']} submits, {r['bound']} at a time, one AsyncClient, gateways "
        f"answering {100 * r['share']:g}% of requests with a random 429, median of "
        f"{r['rounds']} rounds on fresh gateways, ways in alternating order"
    )
    for way, (label, *_, clean) in WAYS2.items():
        runs = r["runs"][way]
        secs = ", ".join(f"{run['seconds']:.2f}s" for run in runs)
        refused = ", ".join(str(run["refused"]) for run in runs)
        created = ", ".join(str(run["created"]) for run in runs)
        ratio = f"{r['ratios'][way]:.2f}x its clean run" if clean else "(clean)"
        print(f"  {label:<50} {secs:<22} 429s {refused:<12} created {created:<12} {ratio}")
    checks = [(f"{way} <= 2x", ratio <= 2.0) for way, ratio in r["ratios"].items()]
    checks += [(f"{way} accepted once", ok) for way, ok in r["accepted_once"].items()]
    print("  targets: " + ", ".join(f"{n} {'ok' if ok else 'MISSED'}" for n, ok in checks))
    for way in r["runs"].values():
        for run in way:
            for message in run["errors"][:3]:
                print(f"    error: {message}")


# --------------------------------------------------------------------------- part 3

WAYS3: dict[str, tuple[str, str, tuple[str, ...], int | None]] = {
    "adaptive": ("no rate_limit (adaptive only)", "beta", (), None),
    "provider_a": ("no rate_limit, surface A as its provider", "alpha",
                   ("no_retry_after", "alpha_http200"), None),
    "unwindowed": ("no rate_limit, no start window (why)", "beta", (), 10**9),
}  # fmt: skip


def child_main(spec: dict[str, Any]) -> int:
    """One client of part 3, in a process of its own."""
    if spec["start_window"] is not None:
        from imggw_client._core import budget

        # A lane's window is set as it is made (the default is bound when the class is made),
        # and a halving falls back to no less than START_WINDOW: both follow the spec.
        window, made = spec["start_window"], budget._lane

        def lane(ceiling: float | None) -> Any:
            new = made(ceiling)
            new.window = new.round_window = window
            return new

        budget.START_WINDOW, budget._lane = window, lane
    budget_bench.watchdog(spec["cut"] + budget_bench.GRACE / 2)
    result = budget_bench.run_sdk(spec["url"], spec["n"], None, spec["surface"], spec["cut"])
    print(json.dumps(result))
    return 0


def part3(n: int) -> dict[str, Any]:
    submit = (20, 10.0)  # and 10 queries per 1 s
    rate = submit[0] / submit[1]
    cut = 60 + 5 * n / rate
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        urls, children = {}, {}
        for way, (_, surface, quirks, window) in WAYS3.items():
            urls[way] = stack.enter_context(
                budget_bench.gateway_process(
                    submit_limit="20/10", query_limit="10/1", duration=(1.0, 3.0), quirks=quirks
                )
            )
            spec = {"url": urls[way], "n": n, "surface": surface, "cut": cut,
                    "start_window": window}  # fmt: skip
            command = [sys.executable, __file__, "--child", json.dumps(spec)]
            children[way] = budget_bench.subprocess.Popen(command, stdout=-1, text=True)
        for way, (label, *_) in WAYS3.items():
            results[way] = budget_bench.collect(children[way], label, cut)
            results[way]["gateway"] = budget_bench.gateway_report(urls[way])
    for r in results.values():
        s, log = r["gateway"]["stats"], r["gateway"]["log"]
        subs, queries = log["times"]["submit"], log["times"]["query"]
        sent = len(subs) + len(queries)
        r.update(
            wall_ratio=r["seconds"] / (n / rate), submits=len(subs), queries=len(queries),
            limited=s["rate_limited"], limited_share=s["rate_limited"] / max(1, sent),
            lost=n - r["saved"], billed=s["tasks_created"],
            peak_submits=peak_in_window(subs, submit[1]), peak_queries=peak_in_window(queries, 1),
        )  # fmt: skip
        del r["gateway"]
        r.pop("trace", None)
    return {"n": n, "floor_s": n / rate, "ways": results}


def print_part3(r: dict[str, Any]) -> None:
    print(
        f"\nPart 3: {r['n']} concurrent generate + download, no RateLimit, gateway at surface "
        f"A's limits (20 submits per 10 s, 10 queries/s), tasks of 1 to 3 s; floor "
        f"{r['floor_s']:.0f} s"
    )
    print(f"  {'':<44}{'429s':>6}{'share':>7}{'submits':>8}{'queries':>8}{'wall':>8}"
          f"{'/floor':>7}{'peak s/10s':>11}{'q/1s':>5}{'lost':>5}{'billed':>7}")  # fmt: skip
    for way, (label, *_) in WAYS3.items():
        w = r["ways"][way]
        print(
            f"  {label:<44}{w['limited']:>6}{100 * w['limited_share']:>6.1f}%{w['submits']:>8}"
            f"{w['queries']:>8}{w['seconds']:>7.1f}s{w['wall_ratio']:>6.2f}x"
            f"{w['peak_submits']:>11}{w['peak_queries']:>5}{w['lost']:>5}{w['billed']:>7}"
        )
    a = r["ways"]["adaptive"]
    checks = [("wall <= 1.15x", a["wall_ratio"] <= 1.15),
              ("429s <= 10%", a["limited_share"] <= 0.10),
              ("lost 0", a["lost"] == 0), (f"billed {r['n']}", a["billed"] == r["n"])]  # fmt: skip
    print(
        "  targets (adaptive): " + ", ".join(f"{n} {'ok' if ok else 'MISSED'}" for n, ok in checks)
    )
    a = r["ways"]["provider_a"]
    checks = [("wall <= 1.15x", a["wall_ratio"] <= 1.15),
              ("429s <= 7%", a["limited_share"] <= 0.07),
              ("lost 0", a["lost"] == 0), (f"billed {r['n']}", a["billed"] == r["n"])]  # fmt: skip
    print(
        "  targets (surface A as its provider): "
        + ", ".join(f"{n} {'ok' if ok else 'MISSED'}" for n, ok in checks)
    )
    for way, w in r["ways"].items():
        for message, count in w["errors"].items():
            print(f"    {way} error x{count}: {message}")


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="full sizes (about 10 minutes)")
    parser.add_argument("--part", choices=["1", "2", "3", "4"], help="run only one part")
    parser.add_argument("--json", action="store_true")
    hidden = argparse.SUPPRESS
    parser.add_argument("--serve", help=hidden)
    parser.add_argument("--child", help=hidden)
    args = parser.parse_args()
    if args.serve:
        return serve_gateway(json.loads(args.serve))
    if args.child:
        return child_main(json.loads(args.child))
    summary: dict[str, Any] = {"full": args.full}
    show = not args.json
    if args.part in (None, "1"):
        summary["part1"] = part1(150, 16, 9 if args.full else 5)
        if show:
            print_part1(summary["part1"])
    if args.part in (None, "2"):
        summary["part2"] = part2(1000, 32, 0.03, 4 if args.full else 2)
        if show:
            print_part2(summary["part2"])
    if args.part in (None, "3"):
        summary["part3"] = part3(100)
        if show:
            print_part3(summary["part3"])
    if args.part in (None, "4"):
        waits, duration = (10_000, (20.0, 60.0)) if args.full else (1000, (2.0, 8.0))
        timeout = 2.5 * waits / 50 + duration[1] + 60
        r = budget_bench.part2(waits, 50, duration, timeout)
        r.pop("gateway", None)
        r.pop("trace", None)
        summary["part4"] = r
        if show:
            print("\nPart 4 (as bench/budget.py part 2):", end="")
            budget_bench.print_part2(r, waits, 50, duration)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
