"""Downloads over loopback: 50 results of 8 MB from the reference gateway (its own process),
concurrency 8; AsyncClient.download against raw httpx streaming the same URLs to files,
interleaved in one run: throughput and the ratio. Then memory: one 256 MB result downloaded in a
fresh process; peak RSS must stay flat in the file size (at most +32 MiB over the same process
before the download).

Run: python bench/downloads.py [--files N] [--size-mb N] [--big-mb N]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

KEY = "bench-key"


@contextmanager
def gateway(size: int) -> Iterator[str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "imggw_client.mock", "--port", "0", "--api-key", KEY,
         "--duration-min", "0", "--duration-max", "0", "--result-size", str(size)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        yield server.stdout.readline().strip()
    finally:
        server.terminate()
        server.wait(timeout=30)


async def make_tasks(url: str, n: int) -> list[object]:
    from imggw_client import AsyncClient

    async with AsyncClient(api_key=KEY, base_url=url) as client:
        return [await client.generate(f"image {i}") for i in range(n)]


async def sdk_round(url: str, tasks: list[object], folder: Path, concurrency: int) -> float:
    import anyio

    from imggw_client import AsyncClient, Task

    limiter = anyio.CapacityLimiter(concurrency)
    async with AsyncClient(api_key=KEY, base_url=url) as client:

        async def one(task: Task) -> None:
            async with limiter:
                await client.download(task, folder, overwrite=True)

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for task in tasks:
                group.start_soon(one, task)
        return time.perf_counter() - started


async def raw_round(tasks: list[object], folder: Path, concurrency: int) -> float:
    import anyio
    import httpx

    limiter = anyio.CapacityLimiter(concurrency)
    async with httpx.AsyncClient(timeout=30) as http:

        async def one(url: str, name: str) -> None:
            async with limiter, http.stream("GET", url) as response:
                response.raise_for_status()
                with (folder / name).open("wb") as out:
                    async for chunk in response.aiter_bytes():
                        out.write(chunk)

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for task in tasks:
                group.start_soon(one, task.image_urls[0], f"raw-{task.id}.png")  # type: ignore[attr-defined]
        return time.perf_counter() - started


def throughput(args: argparse.Namespace) -> dict[str, float]:
    import anyio

    size = args.size_mb * 1_000_000
    with gateway(size) as url, tempfile.TemporaryDirectory() as folder:
        tasks = anyio.run(make_tasks, url, args.files)
        times: dict[str, list[float]] = {"raw": [], "sdk": []}
        for _ in range(args.rounds):
            times["raw"].append(anyio.run(raw_round, tasks, Path(folder), args.concurrency))
            times["sdk"].append(anyio.run(sdk_round, url, tasks, Path(folder), args.concurrency))
    total_mb = args.files * size / 1e6
    best = {mode: min(values) for mode, values in times.items()}
    return {"raw_mb_s": total_mb / best["raw"], "sdk_mb_s": total_mb / best["sdk"],
            "ratio": best["raw"] / best["sdk"]}  # fmt: skip


def memory_child(url: str, folder: str) -> dict[str, float]:
    from imggw_client import Client

    with Client(api_key=KEY, base_url=url) as client:
        task = client.generate("a big one", wait_timeout=60)
        client.get(task.id)  # warm everything up before the baseline reading
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        (saved,) = client.download(task, folder)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"before_mib": before, "after_mib": after, "file_mb": saved.size / 1e6}


def memory(args: argparse.Namespace) -> dict[str, float]:
    with gateway(args.big_mb * 1_000_000) as url, tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, __file__, "--memory-child", url, folder],
                              capture_output=True, text=True, check=True)  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout)
    result["growth_mib"] = result["after_mib"] - result["before_mib"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--size-mb", type=int, default=8)
    parser.add_argument("--big-mb", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(*args.memory_child)))
        return 0
    speed = throughput(args)
    rss = memory(args)
    if args.json:
        print(json.dumps({"throughput": speed, "memory": rss}))
        return 0
    print(f"{args.files} x {args.size_mb} MB over loopback, concurrency {args.concurrency}:")
    print(f"  raw httpx streaming (baseline) {speed['raw_mb_s']:8.1f} MB/s")
    sdk_line = f"{speed['sdk_mb_s']:8.1f} MB/s  ratio {speed['ratio']:.2f}x"
    print(f"  AsyncClient.download           {sdk_line}")
    print("  (the SDK also hashes, checks the size, fsyncs and renames atomically)")
    verdict = "ok" if rss["growth_mib"] <= 32 else "OVER"
    growth = f"{rss['before_mib']:.1f} -> {rss['after_mib']:.1f} MiB (+{rss['growth_mib']:.1f} MiB)"
    print(f"one {rss['file_mb']:.0f} MB file: peak RSS {growth}; target <= +32 MiB: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
