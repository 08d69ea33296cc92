"""Generate many images at once with AsyncClient: a bounded number in flight, each result
downloaded as soon as its task succeeds, failures reported without stopping the others.

Needs IMGGW_API_KEY and IMGGW_BASE_URL.
Run: python examples/async_many.py --count 20 --concurrency 8 --out out/
"""

from __future__ import annotations

import argparse

import anyio

from imggw_client import AsyncClient, ImggwError


async def main(count: int, concurrency: int, out: str) -> int:
    limiter = anyio.CapacityLimiter(concurrency)
    saved, failed = [], []

    async with AsyncClient() as client:

        async def one(i: int) -> None:
            async with limiter:
                try:
                    task = await client.generate(f"a lighthouse, variation {i}")
                    files = await client.download(task, out)
                    saved.extend(files)
                except ImggwError as err:  # one failure never stops the others
                    failed.append((i, err))

        async with anyio.create_task_group() as group:
            for i in range(count):
                group.start_soon(one, i)

    for f in sorted(saved, key=lambda f: str(f.path)):
        print(f.path)
    for i, err in failed:
        print(f"request {i} failed: {err.message}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Generate many images at once.")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    raise SystemExit(anyio.run(main, args.count, args.concurrency, args.out))
