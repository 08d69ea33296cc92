"""SDK overhead: submit+get pairs through imggw_client.Client against raw httpx making the same
requests, interleaved in one run, over loopback (uvicorn on 127.0.0.1) and in-process
(httpx.MockTransport). Prints the ratios. Targets (DESIGN 25): <= 1.08x loopback wall time,
<= 1.25x in-process CPU time.

In-process the figure is CPU time (``time.process_time``): the machine is shared, and another
process's load lengthens wall time without the SDK doing more. Over loopback it is wall time,
the gateway's process pinned to one core and this one to another where there are two
(``os.sched_setaffinity``), so that neither waits for the other's core.

Then the in-process figures again under each OpenTelemetry mode (DESIGN 17), each in its own
process (a process sets its global providers once): ``off`` (the API not importable, as
without ``imggw[otel]``), ``api`` (the API, no provider configured: what most users run) and
``sdk`` (the OpenTelemetry SDK with an in-memory span exporter and metric reader: every span and
metric recorded). Target: ``off`` and ``api`` within the noise of each other; ``sdk`` is the
cost of being traced, recorded here.

And, with ``--instructions PAIRS``, only the instructions each contender runs per in-process
pair, counted by valgrind's callgrind: a figure no other process's load moves; with ``--async``
too, ``AsyncClient`` against ``httpx.AsyncClient`` the same way (the pairs awaited in one
``asyncio.run``).

Run: python bench/overhead.py [--rounds N] [--per-round N] [--json] [--instructions PAIRS]
[--async]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import SUBMIT_BODY, TASK_BODY, serve

TELEMETRY = ("off", "api", "sdk")
if "--telemetry" in sys.argv and sys.argv[sys.argv.index("--telemetry") + 1] == "off":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # as without the extra

from imggw_client import AsyncClient, Client  # noqa: E402

KEY = "bench-key-0123456789"
BODY = {
    "model": "imagegen-2",
    "prompt": "a lighthouse at dusk",
    "size": "16:9",
    "resolution": "2k",
    "n": 1,
}


def raw_pair(http: httpx.Client, base: str) -> Callable[[], None]:
    """What a careful user would write by hand: same requests, same parsing."""
    import uuid

    auth = {"Authorization": f"Bearer {KEY}"}

    def pair() -> None:
        headers = {**auth, "Idempotency-Key": uuid.uuid4().hex}
        submitted = http.post(f"{base}/beta/v1/images/generations", json=BODY, headers=headers)
        task_id = submitted.json()["data"][0]["task_id"]
        record = http.get(f"{base}/beta/v1/tasks/{task_id}", headers=auth).json()
        assert record["data"]["status"] == "processing"

    return pair


def sdk_pair(client: Client) -> Callable[[], None]:
    def pair() -> None:
        sub = client.submit("a lighthouse at dusk", aspect_ratio="16:9", resolution="2k")
        assert client.get(sub.task_id).progress == 40

    return pair


def async_raw_pair(http: httpx.AsyncClient, base: str) -> Callable[[], Awaitable[None]]:
    """:func:`raw_pair`, awaited."""
    import uuid

    auth = {"Authorization": f"Bearer {KEY}"}

    async def pair() -> None:
        headers = {**auth, "Idempotency-Key": uuid.uuid4().hex}
        url = f"{base}/beta/v1/images/generations"
        submitted = await http.post(url, json=BODY, headers=headers)
        task_id = submitted.json()["data"][0]["task_id"]
        record = (await http.get(f"{base}/beta/v1/tasks/{task_id}", headers=auth)).json()
        assert record["data"]["status"] == "processing"

    return pair


def async_sdk_pair(client: AsyncClient) -> Callable[[], Awaitable[None]]:
    async def pair() -> None:
        sub = await client.submit("a lighthouse at dusk", aspect_ratio="16:9", resolution="2k")
        assert (await client.get(sub.task_id)).progress == 40

    return pair


def in_process_handler(request: httpx.Request) -> httpx.Response:
    body = SUBMIT_BODY if request.method == "POST" else TASK_BODY
    return httpx.Response(200, content=body, headers={"content-type": "application/json"})


def interleaved(
    contenders: dict[str, Callable[[], None]],
    *,
    rounds: int,
    per_round: int,
    clock: Callable[[], float],
) -> dict[str, float]:
    """Median seconds of ``clock`` per call of each contender, in alternating rounds."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():  # warm up connections, caches and imports
        for _ in range(per_round // 4 + 1):
            fn()
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            started = clock()
            for _ in range(per_round):
                fn()
            samples[name].append((clock() - started) / per_round)
    return {name: statistics.median(values) for name, values in samples.items()}


def measure(
    base: str,
    make_http: Callable[[], httpx.Client],
    rounds: int,
    per_round: int,
    clock: Callable[[], float],
) -> tuple[float, float]:
    with make_http() as raw_http, make_http() as sdk_http:
        client = Client(api_key=KEY, base_url=base, http_client=sdk_http)
        times = interleaved(
            {"raw httpx": raw_pair(raw_http, base), "imggw": sdk_pair(client)},
            rounds=rounds,
            per_round=per_round,
            clock=clock,
        )
    return times["raw httpx"], times["imggw"]


def two_cores() -> tuple[int, int] | None:
    """Two cores this process may run on (the client's, the gateway's), or None."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[1]) if len(allowed) >= 2 else None


@contextlib.contextmanager
def pinned_gateway() -> Iterator[tuple[str, str]]:
    """The minimal gateway under uvicorn in its own process, pinned to one core and this
    process to another where two are free to us (the child inherits the affinity this
    process has while it starts); yields its base URL and what was pinned."""
    cores = two_cores()
    if cores is None:
        with serve("_common:fixed_app") as base:
            yield base, "not pinned (one core)"
        return
    allowed = os.sched_getaffinity(0)
    client, gateway = cores
    os.sched_setaffinity(0, {gateway})
    try:
        with serve("_common:fixed_app") as base:
            os.sched_setaffinity(0, {client})
            yield base, f"client on core {client}, gateway on core {gateway}"
    finally:
        os.sched_setaffinity(0, allowed)


def figures(raw: float, sdk: float, *, target: float) -> dict[str, float]:
    return {"raw_us": raw * 1e6, "sdk_us": sdk * 1e6, "ratio": sdk / raw, "target": target}


def in_process(rounds: int, per_round: int) -> dict[str, float]:
    """CPU time per pair through ``httpx.MockTransport``: no network, the SDK's own cost."""
    raw, sdk = measure(
        "http://bench.local",
        lambda: httpx.Client(transport=httpx.MockTransport(in_process_handler)),
        rounds,
        per_round,
        time.process_time,
    )
    return figures(raw, sdk, target=1.25)


def install_sdk() -> None:
    """The OpenTelemetry SDK with in-memory exporters: every span and metric is recorded."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def telemetry_modes(rounds: int, per_round: int) -> dict[str, dict[str, float]]:
    """The in-process figures under each OpenTelemetry mode, each in a process of its own."""
    found = {}
    for mode in TELEMETRY:
        command = [sys.executable, __file__, "--telemetry", mode]
        command += ["--rounds", str(rounds), "--per-round", str(per_round)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        found[f"otel {mode}"] = json.loads(done.stdout)
    return found


def run_pairs(contender: str, pairs: int) -> None:
    """(internal) ``pairs`` in-process pairs of one contender after 50 to warm up: what
    :func:`instructions` counts."""
    if contender.endswith("-async"):
        asyncio.run(run_async_pairs(contender, pairs))
        return
    http = httpx.Client(transport=httpx.MockTransport(in_process_handler))
    base = "http://bench.local"
    if contender == "raw":
        pair = raw_pair(http, base)
    else:
        pair = sdk_pair(Client(api_key=KEY, base_url=base, http_client=http))
    for _ in range(50):
        pair()
    # The imports' objects out of the collector's way: a full collection falling inside one
    # count and not the other would move a few hundred pairs' figure by tens of thousands.
    gc.freeze()
    for _ in range(pairs):
        pair()


async def run_async_pairs(contender: str, pairs: int) -> None:
    """(internal) :func:`run_pairs` for ``raw-async`` and ``imggw-async``, on one event loop."""
    http = httpx.AsyncClient(transport=httpx.MockTransport(in_process_handler))
    base = "http://bench.local"
    if contender == "raw-async":
        pair = async_raw_pair(http, base)
    else:
        pair = async_sdk_pair(AsyncClient(api_key=KEY, base_url=base, http_client=http))
    for _ in range(50):
        await pair()
    gc.freeze()  # as in run_pairs
    for _ in range(pairs):
        await pair()


def instructions(pairs: int, *, asynchronous: bool = False) -> dict[str, float]:
    """Instructions per in-process pair (valgrind's callgrind), each contender's run less the
    same run with no pair but the warm-up: a count no other process's load moves.
    ``asynchronous``: ``AsyncClient`` and ``httpx.AsyncClient`` instead."""

    def count(contender: str, n: int) -> int:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
        command += [sys.executable, __file__, "--count-pairs", contender, str(n)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return int(done.stderr.split("Collected : ")[1].split()[0])

    contenders = ("raw-async", "imggw-async") if asynchronous else ("raw", "imggw")
    raw, sdk = ((count(c, pairs) - count(c, 0)) / pairs for c in contenders)
    return {"raw_ir": raw, "sdk_ir": sdk, "ratio": sdk / raw, "target": 1.25}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--telemetry", choices=TELEMETRY, help="(internal) one mode, in-process")
    parser.add_argument(
        "--instructions",
        type=int,
        metavar="PAIRS",
        help="only count instructions per in-process pair over PAIRS pairs (needs valgrind)",
    )
    parser.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="with --instructions: AsyncClient against httpx.AsyncClient",
    )
    parser.add_argument("--count-pairs", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count_pairs:
        run_pairs(args.count_pairs[0], int(args.count_pairs[1]))
        return 0
    if args.instructions:
        found = instructions(args.instructions, asynchronous=args.asynchronous)
        which = "AsyncClient, " if args.asynchronous else ""
        print(
            json.dumps(found)
            if args.json
            else f"instructions per in-process submit+get ({which}{args.instructions} pairs): "
            f"raw httpx {found['raw_ir']:,.0f}, imggw {found['sdk_ir']:,.0f}, "
            f"ratio {found['ratio']:.3f}x"
        )
        return 0
    if args.telemetry:
        if args.telemetry == "sdk":
            install_sdk()
        print(json.dumps(in_process(args.rounds, args.per_round * 5)))
        return 0
    results: dict[str, dict[str, float]] = {}
    with pinned_gateway() as (base, pinning):
        raw, sdk = measure(base, httpx.Client, args.rounds, args.per_round, time.perf_counter)
    results["loopback"] = figures(raw, sdk, target=1.08)
    results["in-process"] = in_process(args.rounds, args.per_round * 5)
    results.update(telemetry_modes(args.rounds, args.per_round))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"loopback: wall time, {pinning}; in-process: CPU time; load average {load}")
        print(f"{'mode':<12}{'raw httpx':>14}{'imggw':>14}{'ratio':>8}{'target':>8}")
        for mode, r in results.items():
            verdict = "ok" if r["ratio"] <= r["target"] else "OVER"
            us = f"{r['raw_us']:>11.1f} us{r['sdk_us']:>11.1f} us"
            print(f"{mode:<12}{us}{r['ratio']:>7.2f}x{r['target']:>7.2f}x {verdict}")
        off, api, sdk_ = (results[f"otel {m}"] for m in TELEMETRY)
        # Each mode against raw httpx in its own process: the ratios compare, not the us.
        recording = sdk_["sdk_us"] - sdk_["raw_us"] * off["ratio"]
        print(
            "otel (in-process CPU, per submit+get, each against its own raw httpx): "
            f"api/off {api['ratio'] / off['ratio']:.2f}x; sdk/off "
            f"{sdk_['ratio'] / off['ratio']:.2f}x (recording costs about {recording:.0f} us "
            "a pair: two spans and their metrics)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
