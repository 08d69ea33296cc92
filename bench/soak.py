"""Soak: N logical requests through the reference gateway on loopback with every fault kind at
30%, split over both surfaces and both clients (sync in threads, async in tasks). Asserts that
exactly N tasks were billed, no two requests share a task, nothing was lost, and every saved
file matches the bytes the gateway serves. Bounded in count and in time; loopback only.

Run: python bench/soak.py [--requests N] [--seconds S]   (exit 0 when every check holds)
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio

from imggw_client import AsyncClient, Client, DownloadedFile, PollPolicy, RetryPolicy, Task
from imggw_client.mock import FAULT_KINDS, MockGateway, MockRequest

KEY = "soak-key"
OPTIONS: dict[str, Any] = {
    "api_key": KEY,
    "timeout": 0.25,  # shorter than the slowest answers: lost answers and 409s really happen
    "poll": PollPolicy(initial_interval=0.05, max_interval=0.3),
    "retry": RetryPolicy(max_attempts=25, initial_backoff=0.02, max_backoff=0.3),
}
Result = tuple[int, Task, list[DownloadedFile]]


def sync_part(
    url: str, numbers: list[int], surface: str, folder: Path, deadline: float
) -> list[Result]:
    with Client(base_url=url, surface=surface, **OPTIONS) as client:

        def one(i: int) -> Result:
            task = client.generate(f"soak {i}", timeout=max(1.0, deadline - time.monotonic()))
            return i, task, client.download(task, folder)

        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(one, numbers))


async def async_part(
    url: str, numbers: list[int], surface: str, folder: Path, deadline: float
) -> list[Result]:
    results: list[Result] = []
    limiter = anyio.CapacityLimiter(16)
    async with AsyncClient(base_url=url, surface=surface, **OPTIONS) as client:

        async def one(i: int) -> None:
            async with limiter:
                task = await client.generate(
                    f"soak {i}", timeout=max(1.0, deadline - time.monotonic())
                )
                results.append((i, task, await client.download(task, folder)))

        async with anyio.create_task_group() as group:
            for i in numbers:
                group.start_soon(one, i)
    return results


def soak(requests: int, seconds: float, seed: int) -> dict[str, Any]:
    gateway = MockGateway(
        api_keys=[KEY],
        seed=seed,
        duration_min=0.02,
        duration_max=0.2,
        fault_rate=0.3,
        faults=FAULT_KINDS,
        latency=0.35,
        retry_after=0,
    )
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    results: list[Result] = []
    with gateway.serve() as url, tempfile.TemporaryDirectory() as folder:
        parts = [(surface, mode) for surface in ("alpha", "beta") for mode in ("sync", "async")]
        for k, (surface, mode) in enumerate(parts):
            numbers = list(range(k, requests, len(parts)))
            if mode == "sync":
                results += sync_part(url, numbers, surface, Path(folder), deadline)
            else:
                results += anyio.run(async_part, url, numbers, surface, Path(folder), deadline)
        elapsed = time.monotonic() - started
        gateway.configure(fault_rate=0.0)
        stats = gateway.stats()
        # The checks: billed once each, no sharing, nothing lost, every file the served bytes.
        assert stats["tasks_created"] == requests, stats
        assert sum(b["tasks"] for b in stats["billing"].values()) == requests
        assert sorted(i for i, _, _ in results) == list(range(requests)), "a request was lost"
        assert len({(t.surface, t.id) for _, t, _ in results}) == requests, "a task was shared"
        for _, _, files in results:
            (saved,) = files
            content = saved.path.read_bytes()
            assert len(content) == saved.size
            assert hashlib.sha256(content).hexdigest() == saved.sha256
            served = gateway.handle(MockRequest("GET", "/" + saved.url.split("/", 3)[3]))
            assert hashlib.sha256(served.body).hexdigest() == saved.sha256
        assert len(list(Path(folder).glob("*.png"))) == requests
    sent = sum(stats["requests"].values())
    return {
        "requests": requests,
        "seconds": elapsed,
        "http_requests": sent,
        "faults": stats["faults"],
        "replays": stats["replays"],
        "conflicts": stats["conflicts"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=300.0, help="the whole run's bound")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    r = soak(args.requests, args.seconds, args.seed)
    print(f"soak: {r['requests']} logical requests (both surfaces, sync and async) in "
          f"{r['seconds']:.1f} s; {r['http_requests']} HTTP requests "
          f"({r['http_requests'] / r['requests']:.2f} per logical request)")  # fmt: skip
    print(f"faults injected: {sum(r['faults'].values())} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(r['faults'].items()))}); "
          f"replays {r['replays']}, in-flight conflicts {r['conflicts']}")  # fmt: skip
    print(
        f"checks: billed == {r['requests']}, no duplicates, nothing lost, every file verified: ok"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
