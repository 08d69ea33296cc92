"""Soak: N logical requests through the reference gateway on loopback with every fault kind at
30%, split over both surfaces and both clients (sync in threads, async in tasks). Checks that
exactly N tasks were billed, no two requests share a task, nothing was lost, and every saved
file matches the bytes the gateway serves. Bounded in count and in time; loopback only.

Run: python bench/soak.py [--requests N] [--seconds S] [--json]   (exit 0 when every check
holds; --json prints the counts the checks are made of as one JSON object)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio

from imggw_client import (
    AsyncClient,
    Client,
    DownloadedFile,
    ImggwError,
    PollPolicy,
    RetryPolicy,
    Task,
)
from imggw_client.mock import FAULT_KINDS, MockGateway, MockRequest

KEY = "soak-key"
OPTIONS: dict[str, Any] = {
    "api_key": KEY,
    "timeout": 0.25,  # shorter than the slowest answers: lost answers and 409s really happen
    "poll": PollPolicy(initial_interval=0.05, max_interval=0.3),
    "retry": RetryPolicy(max_attempts=25, initial_backoff=0.02, max_backoff=0.3),
}
Result = tuple[int, Task, list[DownloadedFile]]
Failure = tuple[int, ImggwError]  # a request that ended without its image: counted as lost


def sync_part(
    url: str, numbers: list[int], surface: str, folder: Path, deadline: float
) -> list[Result | Failure]:
    with Client(base_url=url, surface=surface, **OPTIONS) as client:

        def one(i: int) -> Result | Failure:
            try:
                task = client.generate(
                    f"soak {i}", wait_timeout=max(1.0, deadline - time.monotonic())
                )
                return i, task, client.download(task, folder)
            except ImggwError as err:
                return i, err

        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(one, numbers))


async def async_part(
    url: str, numbers: list[int], surface: str, folder: Path, deadline: float
) -> list[Result | Failure]:
    results: list[Result | Failure] = []
    limiter = anyio.CapacityLimiter(16)
    async with AsyncClient(base_url=url, surface=surface, **OPTIONS) as client:

        async def one(i: int) -> None:
            async with limiter:
                try:
                    task = await client.generate(
                        f"soak {i}", timeout=max(1.0, deadline - time.monotonic())
                    )
                    results.append((i, task, await client.download(task, folder)))
                except ImggwError as err:
                    results.append((i, err))

        async with anyio.create_task_group() as group:
            for i in numbers:
                group.start_soon(one, i)
    return results


def soak(requests: int, seconds: float, seed: int) -> dict[str, Any]:
    """Runs the soak; returns what the checks are made of (see ``failed_checks``)."""
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
    outcomes: list[Result | Failure] = []
    with gateway.serve() as url, tempfile.TemporaryDirectory() as folder:
        parts = [(surface, mode) for surface in ("alpha", "beta") for mode in ("sync", "async")]
        for k, (surface, mode) in enumerate(parts):
            numbers = list(range(k, requests, len(parts)))
            if mode == "sync":
                outcomes += sync_part(url, numbers, surface, Path(folder), deadline)
            else:
                outcomes += anyio.run(async_part, url, numbers, surface, Path(folder), deadline)
        elapsed = time.monotonic() - started
        gateway.configure(fault_rate=0.0)
        stats = gateway.stats()
        results: list[Result] = []
        errors: list[str] = []
        for outcome in outcomes:
            if len(outcome) == 3:
                results.append(outcome)
            else:
                errors.append(f"request {outcome[0]}: {outcome[1]}")
        verified = 0
        for _, _, files in results:
            (saved,) = files
            content = saved.path.read_bytes()
            served = gateway.handle(MockRequest("GET", "/" + saved.url.split("/", 3)[3]))
            digest = hashlib.sha256(content).hexdigest()
            verified += (
                len(content) == saved.size
                and digest == saved.sha256
                and hashlib.sha256(served.body).hexdigest() == saved.sha256
            )
        pngs = len(list(Path(folder).glob("*.png")))
    answered = [i for i, _, _ in results]
    return {
        "requests": requests,
        "billed": stats["tasks_created"],
        "billed_per_key": sum(b["tasks"] for b in stats["billing"].values()),
        # a request answered twice, or two requests sharing one task
        "duplicates": (len(answered) - len(set(answered)))
        + (len(results) - len({(t.surface, t.id) for _, t, _ in results})),
        "lost": len(set(range(requests)) - set(answered)),
        "verified": verified,
        "files": pngs,
        "errors": errors[:10],
        "seconds": round(elapsed, 3),
        "http_requests": sum(stats["requests"].values()),
        "faults": stats["faults"],
        "replays": stats["replays"],
        "conflicts": stats["conflicts"],
    }


def failed_checks(r: dict[str, Any]) -> list[str]:
    """The checks a soak's counts fail: billed once each, none shared, none lost, every file
    the bytes the gateway serves."""
    n = r["requests"]
    checks = {
        f"billed == {n}": r["billed"] == n and r["billed_per_key"] == n,
        "no duplicates": r["duplicates"] == 0,
        "nothing lost": r["lost"] == 0,
        "every file verified": r["verified"] == n and r["files"] == n,
    }
    return [name for name, ok in checks.items() if not ok]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=300.0, help="the whole run's bound")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="the counts as one JSON object")
    args = parser.parse_args()
    r = soak(args.requests, args.seconds, args.seed)
    failed = failed_checks(r)
    if args.json:
        print(json.dumps(r))
        return 1 if failed else 0
    print(f"soak: {r['requests']} logical requests (both surfaces, sync and async) in "
          f"{r['seconds']:.1f} s; {r['http_requests']} HTTP requests "
          f"({r['http_requests'] / r['requests']:.2f} per logical request)")  # fmt: skip
    print(f"faults injected: {sum(r['faults'].values())} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(r['faults'].items()))}); "
          f"replays {r['replays']}, in-flight conflicts {r['conflicts']}")  # fmt: skip
    if failed:
        print(f"checks failed: {', '.join(failed)}; {r}")
        return 1
    print(
        f"checks: billed == {r['requests']}, no duplicates, nothing lost, every file verified: ok"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
