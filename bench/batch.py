"""The durable batch runner on 2,000 lines against the in-process reference gateway (short
tasks), against a baseline measured in the same run: the same requests through a plain
AsyncClient (generate + download, same concurrency, no ledger). Each runs in its own process,
so peak RSS is its own. Prints wall time, peak RSS and the ratios.

Run: python bench/batch.py [--lines N] [--concurrency N]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GATEWAY = {"duration_min": 0.05, "duration_max": 0.3, "seed": 1}


def _clients() -> tuple[Any, dict[str, Any]]:
    from imggw_client import PollPolicy
    from imggw_client.mock import MockGateway

    gateway = MockGateway(**GATEWAY)
    return gateway, {"poll": PollPolicy(initial_interval=0.05, max_interval=0.3)}


def child(mode: str, lines: int, concurrency: int, folder: Path) -> dict[str, float]:
    import anyio

    gateway, options = _clients()
    prompts = [f"image {i}" for i in range(lines)]
    started = time.perf_counter()
    if mode == "batch":
        from imggw_client.batch import run_batch

        report = run_batch(prompts, folder, concurrency=concurrency,
                           client_factory=lambda: gateway.async_client(**options))  # fmt: skip
        assert report.exit_code == 0, report.counts
    else:

        async def plain() -> None:
            limiter = anyio.CapacityLimiter(concurrency)
            async with gateway.async_client(**options) as client:

                async def one(prompt: str) -> None:
                    async with limiter:
                        sub = await client.submit(prompt)
                    task = await client.wait(sub)
                    async with limiter:
                        await client.download(task, folder)

                async with anyio.create_task_group() as group:
                    for prompt in prompts:
                        group.start_soon(one, prompt)

        anyio.run(plain)
    elapsed = time.perf_counter() - started
    assert gateway.stats()["tasks_created"] == lines
    assert len(list(folder.glob("*.png"))) == lines
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": elapsed, "peak_rss_mib": peak_kib / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=["batch", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.lines, args.concurrency, Path(args.folder))))
        return 0
    results = {}
    for mode in ("plain", "batch"):
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--folder", folder,
                 "--lines", str(args.lines), "--concurrency", str(args.concurrency)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            results[mode] = json.loads(done.stdout)
    ratio_time = results["batch"]["seconds"] / results["plain"]["seconds"]
    ratio_rss = results["batch"]["peak_rss_mib"] / results["plain"]["peak_rss_mib"]
    summary = {**results, "time_ratio": round(ratio_time, 3), "rss_ratio": round(ratio_rss, 3),
               "lines": args.lines, "concurrency": args.concurrency}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        for mode, label in (("plain", "plain AsyncClient (baseline)"), ("batch", "durable batch")):
            r = results[mode]
            print(f"{label:<30}{r['seconds']:>8.2f} s  {r['peak_rss_mib']:>7.1f} MiB peak RSS  "
                  f"{args.lines / r['seconds']:>7.1f} lines/s")  # fmt: skip
        print(f"ratios: time {ratio_time:.2f}x, peak RSS {ratio_rss:.2f}x "
              f"({args.lines} lines, concurrency {args.concurrency})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
