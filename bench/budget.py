"""The request budget against a gateway that enforces per-key limits (DESIGN 9).

Part 1: N concurrent ``generate``s, each then downloading its image, against the reference
gateway limiting submits and queries per key (default the provider's documented limits: 20
submits per 10 s, 10 queries per 1 s), tasks of 1 to 3 s. Each way runs in its own process
against its own gateway (in a process of its own, over loopback): no ``rate_limit`` (adaptive
only); a ``RateLimit`` at the gateway's limits; a naive baseline (raw httpx, an idempotency
key, polls at a fixed 2 s, a 429 retried after 1 s); and the adaptive client once more against
a gateway that behaves like surface A's provider (surface A, no Retry-After, the 429 as a body
code on HTTP 200). The ways run side by side (a few requests per second each; ``--serial`` runs
them one after another). Targets: at the gateway's limits, zero 429s and wall <= 1.15x the
floor (N / submit rate); adaptive only, 429s <= 10% of requests (DESIGN 20: a burst goes at
the gateway's speed until it pushes back) and wall <= 1.5x the floor;
every way: nothing lost (every task finished and its PNG saved), N tasks billed.

Part 2: W concurrent waits on tasks of 20 to 60 s under ``RateLimit(queries_per_second=Q)``
against ``query_limit="Q/1"`` (submits unlimited); the gateway's process records the arrival
of every query. Targets: at most Q queries in any 1 s window (sliding), no 429, nothing lost;
the client's peak RSS is reported.

429s are counted by the gateway (its ``rate_limited``, and per kind by a recorder wrapped
around its ASGI app); requests per task count submits and queries (downloads go elsewhere and
are not limited). Every process reads the same clock (CLOCK_MONOTONIC).

Run: python bench/budget.py [--tasks N] [--waits W] [--quick] [--json]
(full: 100 generates, 10,000 waits, 7 to 11 minutes; --quick: 60 generates, 1,000 waits on
tasks of 2 to 8 s, about a minute). Every client is cut short at a time limit (what has not
finished by then counts as lost), so a run is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import child_gateway, gateway_report, peak_in_window

KEY = "bench-key"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GRACE = 120.0  # a client cut short at its time limit has this long to report, then is killed
SUBMIT_BOUND = 256  # part 2: submits in flight at once (as bench/scale.py)
# way: (label, configured at the gateway's limits?, surface, gateway quirks)
WAYS: dict[str, tuple[str, bool, str, tuple[str, ...]]] = {
    "adaptive": ("no rate_limit (adaptive only)", False, "beta", ()),
    "configured": ("RateLimit at the gateway's limits", True, "beta", ()),
    "naive": ("naive raw httpx, fixed 2 s (baseline)", False, "beta", ()),
    "provider_a": ("no rate_limit, surface A as its provider", False, "alpha",
                   ("no_retry_after", "alpha_http200")),
}  # fmt: skip


# --------------------------------------------------------------------------- the gateway


def serve_gateway(args: argparse.Namespace) -> int:
    """The reference gateway in this process, inside a recorder that notes the arrival time
    and the 429 (on A also the HTTP 200 with code 429) of every submit and query, returned by
    ``GET /_bench/log``. Prints the URL, then serves until stdin closes."""
    from imggw_client.mock import MockGateway
    from imggw_client.mock._asgi import serve_app
    from imggw_client.mock._serving import match_route

    gateway = MockGateway(
        api_keys=[KEY],
        seed=args.seed,
        duration_min=args.duration[0],
        duration_max=args.duration[1],
        submit_limit=args.gw_submit_limit,
        query_limit=args.gw_query_limit,
        quirks=tuple(q for q in args.quirks.split(",") if q),
    )
    inner = gateway.asgi()
    times: dict[str, list[float]] = {"submit": [], "query": []}
    limited: dict[str, list[float]] = {"submit": [], "query": []}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/_bench/log":
            body = json.dumps({"times": times, "limited": limited}).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        route = match_route(scope["path"]) if scope["type"] == "http" else None
        if route is None or route.method != scope["method"]:
            await inner(scope, receive, send)
            return
        kind, arrived, status = route.operation, time.monotonic(), 0
        times[kind].append(arrived)

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if status == 429 or (status == 200 and body.startswith(b'{"code":429,')):
                    limited[kind].append(arrived)  # on A also HTTP 200 with code 429
            await send(message)

        await inner(scope, receive, watch)

    with serve_app(app, request_timeout=30.0) as url:
        print(url, flush=True)
        sys.stdin.read()  # until the parent closes it (or dies)
    return 0


@contextlib.contextmanager
def gateway_process(
    *,
    submit_limit: str | None,
    query_limit: str | None,
    duration: tuple[float, float],
    quirks: tuple[str, ...] = (),
    seed: int = 1,
) -> Iterator[str]:
    """The reference gateway in a child process on 127.0.0.1; yields its URL."""
    command = [sys.executable, __file__, "--serve", "--seed", str(seed), "--quirks",
               ",".join(quirks), "--duration", str(duration[0]), str(duration[1])]  # fmt: skip
    if submit_limit:
        command += ["--gw-submit-limit", submit_limit]
    if query_limit:
        command += ["--gw-query-limit", query_limit]
    with child_gateway(command) as url:
        yield url


# --------------------------------------------------------------------------- the clients


def lanes(client: Any) -> dict[str, dict[str, Any]]:
    """The budget's lanes (private state, read for the report)."""
    budget, now = client._flows.budget, time.monotonic()
    with budget._lock:
        return {
            kind: {
                "mode": lane.mode,
                "rate": lane.rate,
                "strikes": lane.strikes,
                "paused_for": round(max(0.0, lane.paused_until - now), 3),
            }
            for kind, lane in budget._lanes.items()
        }


def usage() -> dict[str, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_mib": ru.ru_maxrss / 1024}


WATCHDOG: list[Any] = []  # the running client's report of what it did so far


def watchdog(after: float) -> None:
    """If the client still runs ``after`` seconds from now (its event loop too busy even to
    cancel), prints what it did so far and ends the process, so that the run stays bounded."""

    def fire() -> None:
        report = WATCHDOG[0]() if WATCHDOG else {}
        print(json.dumps({**report, "cut_short": True, "stuck": True, **usage()}), flush=True)
        os._exit(0)

    timer = threading.Timer(after, fire)
    timer.daemon = True
    timer.start()


def run_sdk(
    url: str, n: int, limit: dict[str, float] | None, surface: str, cut: float
) -> dict[str, Any]:
    """N concurrent generate + download through one AsyncClient (cut short after ``cut`` s)."""
    import anyio

    from imggw_client import AsyncClient, ImggwError, RateLimit

    saved: list[Path] = []
    errors: Counter[str] = Counter()
    trace: list[tuple[float, Any]] = []
    cut_short: list[bool] = []

    async def main(out: Path) -> tuple[float, float, Any]:
        rate_limit = RateLimit(**limit) if limit else None
        async with AsyncClient(
            api_key=KEY, base_url=url, surface=surface, rate_limit=rate_limit
        ) as client:

            async def one(i: int) -> None:
                try:
                    task = await client.generate(f"budget bench {i}", wait_timeout=600)
                    saved.extend(f.path for f in await client.download(task, out))
                except ImggwError as err:
                    errors[f"{type(err).__name__}: {err.message}"] += 1

            async def sample() -> None:
                while True:
                    trace.append((round(time.monotonic() - started, 2), lanes(client)))
                    await anyio.sleep(0.5)

            started = time.monotonic()
            WATCHDOG.append(lambda: {"started": started, "seconds": time.monotonic() - started,
                                     "saved": len(saved), "errors": dict(errors),
                                     "lanes": lanes(client), "trace": trace})  # fmt: skip
            async with anyio.create_task_group() as outer:
                outer.start_soon(sample)
                with anyio.move_on_after(cut) as scope:
                    async with anyio.create_task_group() as group:
                        for i in range(n):
                            group.start_soon(one, i)
                outer.cancel_scope.cancel()
            cut_short.append(scope.cancelled_caught)
            return started, time.monotonic(), lanes(client)

    with tempfile.TemporaryDirectory() as tmp:
        started, ended, final = anyio.run(main, Path(tmp))
        good = sum(1 for p in saved if p.read_bytes()[:8] == PNG_SIGNATURE)
    return {"started": started, "seconds": ended - started, "saved": good,
            "errors": dict(errors), "lanes": final, "trace": trace,
            "cut_short": any(cut_short), **usage()}  # fmt: skip


def run_naive(url: str, n: int, cut: float) -> dict[str, Any]:
    """The baseline, no SDK: raw httpx submits with an idempotency key, polls each task at a
    fixed 2 s, retries any 429 after 1 s, and downloads the image."""
    import uuid

    import anyio
    import httpx

    saved: list[Path] = []
    errors: Counter[str] = Counter()
    seen_429 = 0
    cut_short: list[bool] = []

    async def send(http: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
        nonlocal seen_429
        while True:
            response = await http.request(method, path, **kw)
            if response.status_code != 429:
                response.raise_for_status()
                return response
            seen_429 += 1
            await anyio.sleep(1.0)

    async def main(out: Path) -> tuple[float, float]:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:

            async def one(i: int) -> None:
                body = {"model": "imagegen-2", "prompt": f"budget bench {i}", "size": "auto",
                        "resolution": "1k", "n": 1}  # fmt: skip
                key = {"Idempotency-Key": uuid.uuid4().hex}
                try:
                    answer = await send(http, "POST", "/beta/v1/images/generations", json=body,
                                        headers=key)  # fmt: skip
                    task_id = answer.json()["data"][0]["task_id"]
                    while True:
                        await anyio.sleep(2.0)
                        record = (await send(http, "GET", f"/beta/v1/tasks/{task_id}")).json()
                        if record["data"]["status"] in ("completed", "failed"):
                            break
                    link = record["data"]["result"]["images"][0]["url"][0]
                    image = await http.get(link)
                    image.raise_for_status()
                    path = out / f"{task_id}.png"
                    path.write_bytes(image.content)
                    saved.append(path)
                except (httpx.HTTPError, KeyError, TypeError) as err:
                    errors[f"{type(err).__name__}: {err}"] += 1

            started = time.monotonic()
            WATCHDOG.append(lambda: {"started": started, "seconds": time.monotonic() - started,
                                     "saved": len(saved), "errors": dict(errors),
                                     "client_429": seen_429})  # fmt: skip
            with anyio.move_on_after(cut) as scope:
                async with anyio.create_task_group() as group:
                    for i in range(n):
                        group.start_soon(one, i)
            cut_short.append(scope.cancelled_caught)
            return started, time.monotonic()

    with tempfile.TemporaryDirectory() as tmp:
        started, ended = anyio.run(main, Path(tmp))
        good = sum(1 for p in saved if p.read_bytes()[:8] == PNG_SIGNATURE)
    return {"started": started, "seconds": ended - started, "saved": good,
            "errors": dict(errors), "client_429": seen_429, "cut_short": any(cut_short),
            **usage()}  # fmt: skip


def run_waits(url: str, n: int, qps: float, timeout: float, cut: float) -> dict[str, Any]:
    """W concurrent waits under RateLimit(queries_per_second=qps): every task submitted (at
    most SUBMIT_BOUND in flight) and then waited on, all at once."""
    import anyio

    from imggw_client import AsyncClient, ImggwError, RateLimit

    finished: set[str] = set()
    errors: Counter[str] = Counter()
    trace: list[tuple[float, Any]] = []
    cut_short: list[bool] = []
    heads: list[float] = []  # when the write gate let each query's head go (the client's view)

    async def main() -> tuple[float, float, Any]:
        limiter = anyio.CapacityLimiter(SUBMIT_BOUND)
        rate_limit = RateLimit(queries_per_second=qps)
        async with AsyncClient(api_key=KEY, base_url=url, rate_limit=rate_limit) as client:
            budget = client._flows.budget
            gate = budget.writing

            def writing(ticket: Any, now: float) -> float:
                wait: float = gate(ticket, now)
                if wait == 0 and ticket.kind == "query":
                    heads.append(now)
                return wait

            budget.writing = writing  # (private, read for the report)

            async def one(i: int) -> None:
                try:
                    async with limiter:
                        submission = await client.submit(f"budget waits {i}")
                    finished.add((await client.wait(submission, wait_timeout=timeout)).id)
                except ImggwError as err:
                    errors[f"{type(err).__name__}: {err.message}"] += 1

            async def sample() -> None:
                while True:
                    trace.append((round(time.monotonic() - started, 1), lanes(client)))
                    await anyio.sleep(5.0)

            started = time.monotonic()
            WATCHDOG.append(lambda: {"started": started, "seconds": time.monotonic() - started,
                                     "finished": len(finished), "errors": dict(errors),
                                     "lanes": lanes(client), "trace": trace})  # fmt: skip
            async with anyio.create_task_group() as outer:
                outer.start_soon(sample)
                with anyio.move_on_after(cut) as scope:
                    async with anyio.create_task_group() as group:
                        for i in range(n):
                            group.start_soon(one, i)
                outer.cancel_scope.cancel()
            cut_short.append(scope.cancelled_caught)
            return started, time.monotonic(), lanes(client)

    started, ended, final = anyio.run(main)
    return {"started": started, "seconds": ended - started, "finished": len(finished),
            "errors": dict(errors), "lanes": final, "trace": trace, "heads": heads,
            "cut_short": any(cut_short), **usage()}  # fmt: skip


def child_main(spec: dict[str, Any]) -> int:
    watchdog(spec["cut"] + GRACE / 2)
    if spec["way"] == "naive":
        result = run_naive(spec["url"], spec["n"], spec["cut"])
    elif spec["way"] == "waits":
        result = run_waits(spec["url"], spec["n"], spec["qps"], spec["timeout"], spec["cut"])
    else:
        result = run_sdk(spec["url"], spec["n"], spec["limit"], spec["surface"], spec["cut"])
    print(json.dumps(result))
    return 0


def client_process(spec: dict[str, Any]) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "--child", json.dumps(spec)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def collect(child: subprocess.Popen[str], what: str, cut: float) -> dict[str, Any]:
    try:
        out, _ = child.communicate(timeout=cut + GRACE)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise RuntimeError(f"{what}: no result within {cut + GRACE:.0f} s (killed)") from None
    if child.returncode != 0:
        raise RuntimeError(f"{what}: the client process exited with {child.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


# --------------------------------------------------------------------------- part 1


def part1(
    n: int, submit: tuple[int, float], query: tuple[int, float], serial: bool
) -> dict[str, Any]:
    submit_rate, query_rate = submit[0] / submit[1], query[0] / query[1]
    cut = 60 + 5 * n / submit_rate  # bounded: what has not finished by then is lost
    limit = {"submits_per_second": submit_rate, "queries_per_second": query_rate}
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        urls, children = {}, {}
        for way, (label, configured, surface, quirks) in WAYS.items():
            urls[way] = stack.enter_context(
                gateway_process(
                    submit_limit=f"{submit[0]}/{submit[1]:g}",
                    query_limit=f"{query[0]}/{query[1]:g}",
                    duration=(1.0, 3.0),
                    quirks=quirks,
                )
            )
            spec = {"way": way, "url": urls[way], "n": n, "surface": surface,
                    "limit": limit if configured else None, "cut": cut}  # fmt: skip
            children[way] = client_process(spec)
            if serial:
                results[way] = collect(children[way], label, cut)
        for way, (label, *_) in WAYS.items():
            if way not in results:
                results[way] = collect(children[way], label, cut)
        for way in WAYS:
            results[way]["gateway"] = gateway_report(urls[way])
    for r in results.values():
        stats, log = r["gateway"]["stats"], r["gateway"]["log"]
        submits, queries = log["times"]["submit"], log["times"]["query"]
        sent = len(submits) + len(queries)
        r.update(
            floor_s=n / submit_rate,
            wall_ratio=r["seconds"] / (n / submit_rate),
            submits=len(submits),
            queries=len(queries),
            requests_per_task=sent / n,
            limited=stats["rate_limited"],
            limited_by_kind={kind: len(ts) for kind, ts in log["limited"].items()},
            limited_share=stats["rate_limited"] / max(1, sent),
            lost=n - r["saved"],
            billed=stats["tasks_created"],
            peak_submits=peak_in_window(submits, submit[1]),
            peak_queries=peak_in_window(queries, query[1]),
        )
    return results


def part1_checks(way: str, r: dict[str, Any], n: int) -> list[tuple[str, bool]]:
    checks = [("lost 0", r["lost"] == 0), (f"billed {n}", r["billed"] == n)]
    if way == "configured":
        checks += [("0 429s", r["limited"] == 0), ("wall <= 1.15x", r["wall_ratio"] <= 1.15)]
    elif way != "naive":
        checks += [("429s <= 10%", r["limited_share"] <= 0.10)]
        checks += [("wall <= 1.5x", r["wall_ratio"] <= 1.5)]
    return checks


def print_part1(
    results: dict[str, Any], n: int, submit: tuple[int, float], query: tuple[int, float]
) -> None:
    rate = submit[0] / submit[1]
    print(
        f"Part 1: {n} concurrent generate + download; the gateway allows {submit[0]} submits "
        f"per {submit[1]:g} s and {query[0]} queries per {query[1]:g} s per key; tasks of 1 to "
        f"3 s, short so that the wall time measures pacing, not task length; floor = {n} / "
        f"{rate:g} submits/s = {n / rate:.1f} s; wall = first request to last file saved"
    )
    head = (
        f"{'':<42}{'429s':>6}{'share':>7}{'req/task':>9}{'submits':>8}{'queries':>8}"
        f"{'wall':>8}{'/floor':>7}{'peak s/' + format(submit[1], 'g') + 's':>12}"
        f"{'q/' + format(query[1], 'g') + 's':>6}{'lost':>5}{'billed':>7}"
    )
    print(head)
    for way, (label, *_) in WAYS.items():
        r = results[way]
        print(
            f"{label:<42}{r['limited']:>6}{100 * r['limited_share']:>6.1f}%"
            f"{r['requests_per_task']:>9.2f}{r['submits']:>8}{r['queries']:>8}"
            f"{r['seconds']:>7.1f}s{r['wall_ratio']:>6.2f}x{r['peak_submits']:>12}"
            f"{r['peak_queries']:>6}{r['lost']:>5}{r['billed']:>7}"
        )
    for way, (label, *_) in WAYS.items():
        r = results[way]
        verdicts = ", ".join(
            f"{name} {'ok' if ok else 'MISSED'}" for name, ok in part1_checks(way, r, n)
        )
        by_kind = " + ".join(f"{count} {kind}" for kind, count in r["limited_by_kind"].items())
        seen = f", {r['client_429']} seen by the client" if "client_429" in r else ""
        cut = f" (CUT SHORT at {r['seconds']:.0f} s{', stuck' if r.get('stuck') else ''})"
        cut = cut if r["cut_short"] else ""
        print(f"  {label}: 429s {by_kind}{seen}; {verdicts}{cut}")
        for message, count in r["errors"].items():
            print(f"    error x{count}: {message}")


# --------------------------------------------------------------------------- part 2


def part2(w: int, qps: int, duration: tuple[float, float], timeout: float) -> dict[str, Any]:
    with gateway_process(submit_limit=None, query_limit=f"{qps}/1", duration=duration) as url:
        cut = timeout + 30  # bounded: what has not finished by then is lost
        spec = {"way": "waits", "url": url, "n": w, "qps": qps, "timeout": timeout, "cut": cut}
        r = collect(client_process(spec), "waits", cut)
        report = gateway_report(url)
    stats, log = report["stats"], report["log"]
    queries, started = log["times"]["query"], r["started"]
    per_second = Counter(int(t - started) for t in queries)
    r.update(
        queries=len(queries),
        queries_per_wait=len(queries) / w,
        peak_queries=peak_in_window(queries, 1.0),
        peak_heads=peak_in_window(r.pop("heads", []), 1.0),
        calendar_peak=max(per_second.values(), default=0),
        mean_qps=len(queries) / max(1e-9, r["seconds"]),
        floor_s=w / qps,
        limited=stats["rate_limited"],
        billed=stats["tasks_created"],
        lost=w - r["finished"],
        gateway=report,
    )
    return r


def print_part2(r: dict[str, Any], w: int, qps: int, duration: tuple[float, float]) -> None:
    print(
        f"\nPart 2: {w} concurrent waits on tasks of {duration[0]:g} to {duration[1]:g} s, "
        f'RateLimit(queries_per_second={qps}) against query_limit="{qps}/1", submits '
        f"unlimited ({SUBMIT_BOUND} in flight); the arrival of every query recorded by the gateway"
    )
    print(
        f"  queries {r['queries']} ({r['queries_per_wait']:.2f} per wait); peak in any 1 s "
        f"window {r['peak_queries']} (limit {qps}; busiest calendar second "
        f"{r['calendar_peak']}; the client's write gate let at most {r['peak_heads']} heads "
        f"go in a 1 s window); mean {r['mean_qps']:.1f}/s"
    )
    print(
        f"  429s {r['limited']}, lost {r['lost']}, billed {r['billed']}; wall {r['seconds']:.1f} s "
        f"(one query per wait at the limit: {r['floor_s']:.0f} s); client peak RSS "
        f"{r['peak_rss_mib']:.1f} MiB, CPU {r['cpu_s']:.1f} s; query pace at the end "
        f"{r['lanes']['query']['rate']:g}/s ({r['lanes']['query']['mode']})"
    )
    checks = [
        (f"peak <= {qps}", r["peak_queries"] <= qps),
        ("0 429s", r["limited"] == 0),
        ("lost 0", r["lost"] == 0),
        (f"billed {w}", r["billed"] == w),
    ]
    cut = f" (CUT SHORT at {r['seconds']:.0f} s)" if r["cut_short"] else ""
    print(
        "  targets: " + ", ".join(f"{name} {'ok' if ok else 'MISSED'}" for name, ok in checks) + cut
    )
    for message, count in r["errors"].items():
        print(f"    error x{count}: {message}")


# --------------------------------------------------------------------------- main


def limit_arg(value: str) -> tuple[int, float]:
    count, _, seconds = value.partition("/")
    try:
        return int(count), float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError("expected N/S, such as 20/10") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, help="part 1: concurrent generates [100; quick 60]")
    parser.add_argument("--waits", type=int, help="part 2: concurrent waits [10000; quick 1000]")
    parser.add_argument("--submit-limit", type=limit_arg, default=(20, 10.0), help="[20/10]")
    parser.add_argument("--query-limit", type=limit_arg, default=(10, 1.0), help="[10/1]")
    parser.add_argument("--waits-qps", type=int, default=50, help="part 2 query limit [50]")
    parser.add_argument("--quick", action="store_true", help="everything smaller, about 1 min")
    parser.add_argument("--serial", action="store_true", help="part 1: one way after another")
    parser.add_argument("--part", choices=["1", "2"], help="run only one part")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--trace", action="store_true", help="with --json: keep the budget's lanes sampled "
        "over time and the arrival of every request"
    )  # fmt: skip
    hidden = argparse.SUPPRESS
    parser.add_argument("--dump", help=hidden)  # a file for everything, traces included
    parser.add_argument("--serve", action="store_true", help=hidden)
    parser.add_argument("--child", help=hidden)
    parser.add_argument("--seed", type=int, default=1, help=hidden)
    parser.add_argument("--duration", type=float, nargs=2, default=(1.0, 3.0), help=hidden)
    parser.add_argument("--quirks", default="", help=hidden)
    parser.add_argument("--gw-submit-limit", help=hidden)
    parser.add_argument("--gw-query-limit", help=hidden)
    args = parser.parse_args()
    if args.serve:
        return serve_gateway(args)
    if args.child:
        return child_main(json.loads(args.child))
    tasks = args.tasks or (60 if args.quick else 100)
    waits = args.waits or (1000 if args.quick else 10_000)
    duration = (2.0, 8.0) if args.quick else (20.0, 60.0)
    summary: dict[str, Any] = {"tasks": tasks, "waits": waits}
    if args.part in (None, "1"):
        summary["part1"] = part1(tasks, args.submit_limit, args.query_limit, args.serial)
        if not args.json:
            print_part1(summary["part1"], tasks, args.submit_limit, args.query_limit)
    if args.part in (None, "2"):
        # generous (the healthy run takes about 1.7x one query per wait at the limit), bounded
        timeout = 2.5 * waits / args.waits_qps + duration[1] + 60
        summary["part2"] = part2(waits, args.waits_qps, duration, timeout)
        if not args.json:
            print_part2(summary["part2"], waits, args.waits_qps, duration)
    if args.dump:
        Path(args.dump).write_text(json.dumps(summary))
    if args.json:
        if not args.trace:
            for r in [*summary.get("part1", {}).values(), summary.get("part2", {})]:
                r.pop("trace", None)
                r.get("gateway", {}).pop("log", None)
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
