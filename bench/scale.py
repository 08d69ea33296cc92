"""10,000 concurrent waits in one process: AsyncClient against the in-process reference gateway
(tasks of 1 to 3 s), submits bounded; wall time and peak RSS. Baseline, in the same run and
its own process: the same tasks with hand-written raw-httpx polling at a fixed 1 s. Targets:
peak RSS at most 200 MiB, no task lost.

Run: python bench/scale.py [--tasks N]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SUBMIT_BOUND = 256  # submits in flight at once


def child(mode: str, n: int) -> dict[str, float]:
    import anyio
    import httpx

    from imggw_client.mock import IN_PROCESS_URL, MockGateway

    gateway = MockGateway(api_keys=["k"], duration_min=1.0, duration_max=3.0, seed=1)
    finished: list[str] = []
    limiter = anyio.CapacityLimiter(SUBMIT_BOUND)
    started = time.perf_counter()

    async def sdk() -> None:
        async with gateway.async_client() as client:

            async def one(i: int) -> None:
                async with limiter:
                    sub = await client.submit(f"image {i}")
                task = await client.wait(sub, wait_timeout=120)
                finished.append(task.id)

            async with anyio.create_task_group() as group:
                for i in range(n):
                    group.start_soon(one, i)

    async def raw() -> None:
        headers = {"Authorization": "Bearer k"}
        async with httpx.AsyncClient(transport=gateway.transport(), base_url=IN_PROCESS_URL,
                                     headers=headers) as http:  # fmt: skip

            async def one(i: int) -> None:
                body = {"model": "imagegen-2", "prompt": f"image {i}", "size": "auto",
                        "resolution": "1k", "n": 1}  # fmt: skip
                async with limiter:
                    answer = await http.post("/beta/v1/images/generations", json=body)
                task_id = answer.json()["data"][0]["task_id"]
                while True:
                    await anyio.sleep(1.0)
                    record = (await http.get(f"/beta/v1/tasks/{task_id}")).json()["data"]
                    if record["status"] == "completed":
                        finished.append(task_id)
                        return

            async with anyio.create_task_group() as group:
                for i in range(n):
                    group.start_soon(one, i)

    anyio.run(sdk if mode == "sdk" else raw)
    elapsed = time.perf_counter() - started
    stats = gateway.stats()
    return {
        "seconds": elapsed,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "finished": len(set(finished)),
        "tasks_created": stats["tasks_created"],
        "queries": sum(v for k, v in stats["requests"].items() if k.startswith("GET")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=["sdk", "raw"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tasks)))
        return 0
    results = {}
    for mode in ("raw", "sdk"):
        command = [sys.executable, __file__, "--child", mode, "--tasks", str(args.tasks)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[mode] = json.loads(done.stdout)
    sdk, raw = results["sdk"], results["raw"]
    summary = {**results, "time_ratio": round(sdk["seconds"] / raw["seconds"], 3),
               "rss_ratio": round(sdk["peak_rss_mib"] / raw["peak_rss_mib"], 3),
               "lost": args.tasks - sdk["finished"]}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
        return 0
    for mode, label in (("raw", "raw httpx, fixed 1 s (baseline)"), ("sdk", "AsyncClient.wait")):
        r = results[mode]
        print(f"{label:<34}{r['seconds']:>7.2f} s {r['peak_rss_mib']:>7.1f} MiB peak RSS "
              f"{r['queries']:>7} queries  {r['finished']}/{args.tasks} finished")  # fmt: skip
    rss_ok = "ok" if sdk["peak_rss_mib"] <= 200 else "OVER"
    lost_ok = "ok" if summary["lost"] == 0 else f"LOST {summary['lost']}"
    print(
        f"ratios: time {summary['time_ratio']:.2f}x, peak RSS {summary['rss_ratio']:.2f}x; "
        f"target: peak RSS <= 200 MiB ({rss_ok}), no task lost ({lost_ok})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
