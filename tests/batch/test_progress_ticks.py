"""A run tells its progress while no line moves (``batch/_run.Progress.tick``), and each
snapshot says how long the gateway has been asked and has answered nothing (the client's
``_send`` sees every reply): what a display turns into periodic lines and one warning."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest

from imggw_client import AsyncClient, PollPolicy
from imggw_client.batch import BatchProgress, _run, arun_batch
from imggw_client.batch._schema import LineState
from imggw_client.mock import IN_PROCESS_URL, MockGateway

# Its tasks run until told: no line moves.
pytestmark = [pytest.mark.anyio, pytest.mark.gateway(manual_clock=True)]


class HeldQueries(httpx.AsyncBaseTransport):
    """The gateway in process, its status queries held (a gateway hung) until released."""

    def __init__(self, gw: MockGateway, *, held: bool) -> None:
        self.inner = gw.transport()
        self.released = anyio.Event()
        if not held:
            self.released.set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            await self.released.wait()
        return await self.inner.handle_async_request(request)


async def told_until(
    tmp_path: Path, transport: HeldQueries, gw: MockGateway, *steps: Callable[[BatchProgress], bool]
) -> list[BatchProgress]:
    """Runs two lines on ``gw`` (whose tasks never finish unless told), telling snapshots
    until each of ``steps`` in turn has held for one (a step's truth may act: release a
    hold); then stops the run."""
    seen: list[BatchProgress] = []
    todo = list(steps)
    done = anyio.Event()

    def on_progress(progress: BatchProgress) -> None:
        seen.append(progress)
        if todo and todo[0](progress):
            todo.pop(0)
            if not todo:
                done.set()

    client = AsyncClient(
        api_key=gw.config.api_keys[0],
        base_url=IN_PROCESS_URL,
        transport=transport,
        poll=PollPolicy(initial_interval=0.05, max_interval=0.1),
    )
    async with client, anyio.create_task_group() as group:
        group.start_soon(
            functools.partial(
                arun_batch,
                ["a cat", "a dog"],
                tmp_path / "out",
                client=client,
                on_progress=on_progress,
            )
        )
        with anyio.fail_after(60):  # a run that never gets there fails, never hangs
            await done.wait()
        group.cancel_scope.cancel()
    return seen


async def test_snapshots_are_told_while_no_line_moves(
    gateway: MockGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_run, "PROGRESS_TICK", 0.05)
    monkeypatch.setattr(_run, "PROGRESS_EVERY", 0.01)
    idle: list[BatchProgress] = []

    def both_running(progress: BatchProgress) -> bool:
        if progress.counts == {LineState.RUNNING: 2}:
            idle.append(progress)
        return len(idle) >= 4

    await told_until(tmp_path, HeldQueries(gateway, held=False), gateway, both_running)
    # Four snapshots while no line moved: told by the tick alone, each later than the last.
    elapsed = [p.elapsed for p in idle]
    assert elapsed == sorted(elapsed)
    assert elapsed[0] < elapsed[-1]


async def test_a_snapshot_says_how_long_the_gateway_has_answered_nothing(
    gateway: MockGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_run, "PROGRESS_TICK", 0.05)
    monkeypatch.setattr(_run, "PROGRESS_EVERY", 0.01)
    transport = HeldQueries(gateway, held=True)  # the submits answered, then every query hangs

    def silent(progress: BatchProgress) -> bool:
        if progress.gateway_silent_for >= 0.3:
            transport.released.set()  # it answers again
            return True
        return False

    def answering(progress: BatchProgress) -> bool:
        return progress.gateway_silent_for == 0.0

    seen = await told_until(tmp_path, transport, gateway, silent, answering)
    first = next(n for n, p in enumerate(seen) if p.gateway_silent_for >= 0.3)
    # lines in flight, nothing moved: only the silence
    assert seen[first].counts == {LineState.RUNNING: 2}
    assert seen[0].gateway_silent_for == 0.0  # nothing asked yet: no silence
