"""Exactly once under faults: every logical request billed once, every result saved and verified."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from imggw_client import AsyncClient, Client, PollPolicy, RateLimit, RetryPolicy, Task, TaskStatus
from imggw_client.mock import FAULT_KINDS, MockGateway, MockRequest

from .helpers import png_size

# Seconds a test: a thousand requests under faults (the slow lane, tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RATIOS_1K = [
    "auto",
    "1:1",
    "3:2",
    "2:3",
    "4:3",
    "3:4",
    "5:4",
    "4:5",
    "16:9",
    "9:16",
    "2:1",
    "1:2",
    "3:1",
    "1:3",
    "21:9",
    "9:21",
]
PATIENT = RetryPolicy(max_attempts=20, initial_backoff=0.005, max_backoff=0.05)
QUICK_POLL = PollPolicy(initial_interval=0.01, max_interval=0.05)
# A ceiling far above what these runs send keeps the budget out of the way: random 429 faults
# must not slow them (the budget's answer to 429s has its own tests and benchmark).
OUT_OF_THE_WAY = RateLimit(submits_per_second=100_000, queries_per_second=100_000)
# The gateway of the runs below: quick tasks, 30 % of requests struck by a fault of any kind.
FAULTY: dict[str, Any] = {
    "duration_min": 0.0,
    "duration_max": 0.05,
    "fault_rate": 0.3,
    "faults": FAULT_KINDS,
    "retry_after": 0,
}


async def run_many(
    client: AsyncClient, n: int, folder: Path, concurrency: int
) -> dict[int, tuple[Task, Any]]:
    limiter = anyio.CapacityLimiter(concurrency)
    done: dict[int, tuple[Task, Any]] = {}

    async def one(i: int) -> None:
        async with limiter:
            task = await client.generate(
                f"logical request {i}",
                aspect_ratio=RATIOS_1K[i % 16],
                surface="alpha" if i % 2 else "beta",
                wait_timeout=120,
            )
            files = await client.download(task, folder)
            done[i] = (task, files)

    async with anyio.create_task_group() as group:
        for i in range(n):
            group.start_soon(one, i)
    return done


def verify(gateway: MockGateway, done: dict[int, tuple[Task, Any]], n: int) -> None:
    stats = gateway.stats()
    assert stats["tasks_created"] == n
    assert sum(b["tasks"] for b in stats["billing"].values()) == n
    assert len(done) == n
    assert len({task.id for task, _ in done.values()}) == n  # no logical request shares a task
    gateway.configure(fault_rate=0.0)
    for i, (task, files) in done.items():
        assert task.status is TaskStatus.SUCCEEDED
        (saved,) = files
        content = saved.path.read_bytes()
        assert len(content) == saved.size
        assert hashlib.sha256(content).hexdigest() == saved.sha256
        served = gateway.handle(MockRequest("GET", "/" + saved.url.split("/", 3)[3]))
        assert served.status == 200
        assert hashlib.sha256(served.body).hexdigest() == saved.sha256  # the bytes served
        width, height = png_size(content)
        ratio = RATIOS_1K[i % 16]
        if ratio not in ("auto", "1:1"):
            w, h = (int(x) for x in ratio.split(":"))
            assert (width >= height) == (w >= h)


@pytest.mark.gateway(seed=11, latency=0.02, **FAULTY)
async def test_1000_logical_requests_with_30_percent_faults_of_every_kind(
    gateway: MockGateway, tmp_path: Path
) -> None:
    async with gateway.async_client(
        poll=QUICK_POLL, retry=PATIENT, rate_limit=OUT_OF_THE_WAY
    ) as client:
        done = await run_many(client, 1000, tmp_path, concurrency=64)
    faults = gateway.stats()["faults"]
    assert set(faults) == set(FAULT_KINDS)  # every kind struck
    assert sum(faults.values()) > 1000
    verify(gateway, done, 1000)
    assert len(list(tmp_path.glob("*.png"))) == 1000
    assert list(tmp_path.glob(".*.part")) == []


@pytest.mark.gateway(seed=12, latency=0.3, **FAULTY)
async def test_exactly_once_over_loopback_with_lost_answers_and_timeouts(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gateway, url = served_gateway
    async with AsyncClient(
        api_key="test-key",
        base_url=url,
        timeout=0.15,
        poll=QUICK_POLL,
        retry=PATIENT,
        rate_limit=OUT_OF_THE_WAY,
    ) as client:
        done = await run_many(client, 150, tmp_path, concurrency=16)
    verify(gateway, done, 150)


@pytest.mark.gateway(
    seed=4, fault_rate=0.5, faults=["latency"], latency=0.6, duration_min=0.0, duration_max=0.01
)
def test_answers_that_come_too_late_are_replayed_not_rebilled(
    served_gateway: tuple[MockGateway, str],
) -> None:
    """The client gives up on slow answers while the gateway has already created the task:
    its retries meet 409 (still in flight) or a replay, and never a second task."""
    gateway, url = served_gateway
    with Client(api_key="test-key", base_url=url, timeout=0.25, retry=PATIENT) as client:
        subs = [client.submit(f"request {i}") for i in range(12)]
    stats = gateway.stats()
    assert stats["tasks_created"] == 12
    assert len({s.task_id for s in subs}) == 12
    assert stats["conflicts"] + stats["replays"] > 0  # the unknown-outcome path really ran
    assert any(s.replayed for s in subs)
