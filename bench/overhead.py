"""SDK overhead: submit+get pairs through imggw_client.Client against raw httpx making the same
requests, interleaved in one run, over loopback (uvicorn on 127.0.0.1) and in-process
(httpx.MockTransport). Prints the ratios. Targets: <= 1.10x loopback, <= 1.35x in-process.

Run: python bench/overhead.py [--rounds N] [--per-round N]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _common import SUBMIT_BODY, TASK_BODY, interleaved, serve

from imggw_client import Client

KEY = "bench-key-0123456789"
BODY = {"model": "imagegen-2", "prompt": "a lighthouse at dusk", "size": "16:9",
        "resolution": "2k", "n": 1}  # fmt: skip


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


def in_process_handler(request: httpx.Request) -> httpx.Response:
    body = SUBMIT_BODY if request.method == "POST" else TASK_BODY
    return httpx.Response(200, content=body, headers={"content-type": "application/json"})


def measure(
    base: str, make_http: Callable[[], httpx.Client], rounds: int, per_round: int
) -> tuple[float, float]:
    with make_http() as raw_http, make_http() as sdk_http:
        client = Client(api_key=KEY, base_url=base, http_client=sdk_http)
        times = interleaved(
            {"raw httpx": raw_pair(raw_http, base), "imggw": sdk_pair(client)},
            rounds=rounds,
            per_round=per_round,
        )
    return times["raw httpx"], times["imggw"]


def figures(raw: float, sdk: float, *, target: float) -> dict[str, float]:
    return {"raw_us": raw * 1e6, "sdk_us": sdk * 1e6, "ratio": sdk / raw, "target": target}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    results = {}
    with serve("_common:fixed_app") as base:
        raw, sdk = measure(base, httpx.Client, args.rounds, args.per_round)
    results["loopback"] = figures(raw, sdk, target=1.10)
    raw, sdk = measure(
        "http://bench.local",
        lambda: httpx.Client(transport=httpx.MockTransport(in_process_handler)),
        args.rounds,
        args.per_round * 5,
    )
    results["in-process"] = figures(raw, sdk, target=1.35)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'mode':<12}{'raw httpx':>14}{'imggw':>14}{'ratio':>8}{'target':>8}")
        for mode, r in results.items():
            verdict = "ok" if r["ratio"] <= r["target"] else "OVER"
            print(f"{mode:<12}{r['raw_us']:>11.1f} us{r['sdk_us']:>11.1f} us{r['ratio']:>7.2f}x"
                  f"{r['target']:>7.2f}x {verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
