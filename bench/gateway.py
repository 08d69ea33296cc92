"""Query throughput of the reference gateway under uvicorn, against a trivial ASGI app that
returns fixed JSON, served the same way (its own process, 127.0.0.1), measured in the same run
with the same load generator. Target: at least 0.5x the trivial app.

Run: python bench/gateway.py [--seconds S] [--connections N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import serve


async def load(base: str, seconds: float, connections: int) -> float:
    """Queries per second from ``connections`` keep-alive connections, each sending one query
    after another. A raw-socket client: httpx itself would be the bottleneck, not the server."""
    host, port = base.removeprefix("http://").split(":")
    request = (
        f"GET /beta/v1/tasks/1 HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Authorization: Bearer bench-key\r\n\r\n"
    ).encode()
    count = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal count
        reader, writer = await asyncio.open_connection(host, int(port))
        while time.perf_counter() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:40]
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            count += 1
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(connections)))
    return count / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"trivial": [], "gateway": []}
    with serve("_common:fixed_app") as trivial, serve("_gateway_app:app") as gateway:
        for _ in range(args.rounds):  # interleaved, so both see the same machine
            rates["trivial"].append(asyncio.run(load(trivial, args.seconds, args.connections)))
            rates["gateway"].append(asyncio.run(load(gateway, args.seconds, args.connections)))
    trivial_qps, gateway_qps = max(rates["trivial"]), max(rates["gateway"])
    result = {"trivial_qps": round(trivial_qps), "gateway_qps": round(gateway_qps),
              "ratio": round(gateway_qps / trivial_qps, 3), "target": 0.5}  # fmt: skip
    if args.json:
        print(json.dumps(result))
    else:
        verdict = "ok" if result["ratio"] >= 0.5 else "UNDER"
        print(f"trivial ASGI app  {trivial_qps:8.0f} queries/s")
        print(f"reference gateway {gateway_qps:8.0f} queries/s  ratio {result['ratio']:.2f}x "
              f"(target >= 0.50x) {verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
