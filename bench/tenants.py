"""A process serving many tenants, a client per tenant or per request: what each client costs
to make, what each log record costs with many live keys, and what clients dropped unclosed
leave behind. Each figure beside its baseline measured in the same run.

- construction: CPU per ``Client()`` (no request), against a bare ``httpx.Client()`` (which
  reads its certificates anew each time) and one given a TLS context made once;
- a log record through the SDK's filter (``_logs.HideLinks``, on every record of the SDK's and
  the HTTP libraries' loggers) with 10 and 10,000 live clients' keys, and after those clients
  are closed, against the same record with no key watched;
- 500 clients with ``journal=`` made, used once (a submit through ``httpx.MockTransport``) and
  dropped unclosed: threads and file descriptors left, against before them.

Run: python bench/tenants.py [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from imggw_client import Client
from imggw_client._logs import HideLinks

SUBMITTED = b'{"code": 200, "data": [{"status": "submitted", "task_id": "7"}]}'


def cpu_each(make: Callable[[], object], count: int) -> float:
    """CPU seconds per call of ``make``, the median of five rounds."""
    rounds = []
    for _ in range(5):
        started = time.process_time()
        for _ in range(count):
            made = make()
            close = getattr(made, "close", None)
            if close is not None:
                close()
        rounds.append((time.process_time() - started) / count)
    return sorted(rounds)[2]


def record_cost(filter_: logging.Filter, text: str, count: int = 2000) -> float:
    """CPU seconds per record of ``text`` through ``filter_``."""
    started = time.process_time()
    for _ in range(count):
        record = logging.LogRecord("httpx", logging.INFO, __file__, 1, text, None, None)
        filter_.filter(record)
    return (time.process_time() - started) / count


def keys_figures() -> dict[str, float]:
    hide = HideLinks()
    short = "HTTP Request: POST https://gw.example/beta/v1/images/generations 200 OK"
    long = short + " " + "x" * (600 - len(short))
    figures = {"no key: short": record_cost(hide, short), "no key: 600": record_cost(hide, long)}
    for live in (10, 10_000):
        clients = [
            Client(api_key=f"sk-tenant-{n:08d}", base_url="http://gw.test") for n in range(live)
        ]
        figures[f"{live} live: short"] = record_cost(hide, short)
        figures[f"{live} live: 600"] = record_cost(hide, long)
        for client in clients:
            client.close()
        figures[f"{live} closed: short"] = record_cost(hide, short)
    return figures


def dropped_figures(count: int = 500) -> dict[str, int]:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=SUBMITTED)

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    gc.collect()
    before = (threading.active_count(), fds())
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(count):
            client = Client(
                api_key="sk-tenant-journal-0001",
                base_url="http://gw.test",
                transport=httpx.MockTransport(answer),
                journal=Path(tmp) / "journal.sqlite",
            )
            client.submit(f"a lighthouse {n}")
            del client  # dropped unclosed, as a client made per request often is
        gc.collect()
        time.sleep(0.5)  # a renewer told to stop ends at its next wake
        after = (threading.active_count(), fds())
    return {
        "threads before": before[0],
        "threads after": after[0],
        "fds before": before[1],
        "fds after": after[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    raw = cpu_each(httpx.Client, 200)
    context = httpx.create_ssl_context()
    floor = cpu_each(lambda: httpx.Client(verify=context), 200)
    ours = cpu_each(lambda: Client(api_key="sk-tenant-construct", base_url="http://gw.test"), 200)
    figures: dict[str, object] = {
        "construction ms": {
            "httpx.Client": raw * 1e3,
            "httpx.Client, one context": floor * 1e3,
            "Client": ours * 1e3,
        },
        "log record us": {k: v * 1e6 for k, v in keys_figures().items()},
        "dropped journaled clients": dropped_figures(),
    }
    if args.json:
        print(json.dumps(figures))
        return
    built = figures["construction ms"]
    assert isinstance(built, dict)
    print(
        f"construction: Client {built['Client']:.2f} ms; bare httpx.Client "
        f"{built['httpx.Client']:.2f} ms, given one TLS context "
        f"{built['httpx.Client, one context']:.2f} ms"
    )
    costs = figures["log record us"]
    assert isinstance(costs, dict)
    for name, micros in costs.items():
        print(f"log record, {name}: {micros:.1f} us")
    print(f"500 journaled clients dropped unclosed: {figures['dropped journaled clients']}")


if __name__ == "__main__":
    main()
