"""A submit cancelled or interrupted after its request left names its key (DESIGN 18, issue 27
item 8): a note on the exception (PEP 678) with the key and the call that resends it, and one
WARNING on the ``imggw_client`` logger. Resending with that key creates no second task.

Over a real socket: the reference gateway, whose answer to the first submit waits (the task
made, billed) until the test has cancelled the call; an event says when the submit arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest

from imggw_client import AsyncClient, Client, Submission
from imggw_client.mock import MockGateway

from ..loopback import serve_asgi

pytestmark = pytest.mark.anyio

KEY = "sk-interrupt-7d1c4e9a0b2f3865"  # never in a note nor a log line
PROMPT = "a private prompt about a lighthouse"  # never in a note nor a log line
KEY_IN_NOTE = re.compile(r"idempotency_key='([0-9a-f]{32})'")


class HeldSubmits:
    """An ASGI app over the reference gateway whose answer to the first submit is held: the
    gateway has made (and billed) the task, then ``arrived`` is set, ``on_arrival`` runs (on
    the server's thread), and the answer waits for ``release``."""

    def __init__(self, gateway: MockGateway) -> None:
        self.app = gateway.asgi()
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.on_arrival: Callable[[], None] = lambda: None
        self.held = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or self.held:
            await self.app(scope, receive, send)
            return
        self.held += 1

        async def held(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.arrived.set()
                self.on_arrival()
                await anyio.to_thread.run_sync(self.release.wait)
            await send(message)

        with contextlib.suppress(OSError, RuntimeError):  # the client is gone by then
            await self.app(scope, receive, held)


@contextlib.contextmanager
def held_gateway() -> Iterator[tuple[MockGateway, HeldSubmits, str]]:
    gateway = MockGateway(api_keys=[KEY], duration_min=30, duration_max=30)
    holder = HeldSubmits(gateway)
    with serve_asgi(holder) as url:
        try:
            yield gateway, holder, url
        finally:
            holder.release.set()  # the held answer goes (nowhere), and the server can stop


def notes_of(exc: BaseException | None) -> list[str]:
    """The notes on ``exc`` and on the exceptions it was raised from (asyncio.timeout raises
    TimeoutError from the cancellation that carries the note)."""
    notes: list[str] = []
    while exc is not None:
        notes += getattr(exc, "__notes__", [])
        exc = exc.__cause__ or exc.__context__
    return notes


def the_key_said(notes: list[str], caplog: pytest.LogCaptureFixture, surface: str) -> str:
    """The key that the one note and the one WARNING name, after checking what they say."""
    [note] = notes
    key = KEY_IN_NOTE.findall(note)[0]
    assert (
        f"client.submit(PROMPT, aspect_ratio='3:2', resolution='2k', surface='{surface}', "
        f"idempotency_key='{key}')" in note
    )
    assert (
        f"imggw submit PROMPT --surface {surface} --aspect-ratio 3:2 --resolution 2k "
        f"--idempotency-key {key}" in note
    )
    warnings = [
        r for r in caplog.records if r.name == "imggw_client" and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    said = warnings[0].getMessage()
    assert key in said
    assert surface in said
    for text in (note, said):
        assert KEY not in text
        assert PROMPT not in text
    return key


async def resend(url: str, key: str, surface: str) -> Submission:
    async with AsyncClient(api_key=KEY, base_url=url) as client:
        return await client.submit(
            PROMPT, aspect_ratio="3:2", resolution="2k", surface=surface, idempotency_key=key
        )


async def wait_for(event: threading.Event) -> None:
    await anyio.to_thread.run_sync(event.wait)


@pytest.mark.parametrize("surface", ["alpha", "beta"])
async def test_a_cancelled_submit_names_its_key_and_the_resend_bills_nothing(
    surface: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "imggw_client")
    with held_gateway() as (gateway, holder, url):
        async with AsyncClient(api_key=KEY, base_url=url) as client:
            call = asyncio.ensure_future(
                client.submit(PROMPT, aspect_ratio="3:2", resolution="2k", surface=surface)
            )
            await wait_for(holder.arrived)
            assert gateway.stats()["tasks_created"] == 1  # billed: the answer is what waits
            call.cancel()
            with pytest.raises(asyncio.CancelledError) as info:
                await call
        key = the_key_said(notes_of(info.value), caplog, surface)
        sub = await resend(url, key, surface)
        assert sub.replayed is True
        assert gateway.stats()["tasks_created"] == 1
        assert gateway.stats()["replays"] == 1


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is new in Python 3.11")
async def test_a_submit_ended_by_asyncio_timeout_names_its_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "imggw_client")
    loop = asyncio.get_running_loop()
    with held_gateway() as (gateway, holder, url):

        async def submit_in_time(client: AsyncClient) -> None:
            async with asyncio.timeout(None) as scope:
                # The deadline passes once the submit reached the gateway: no clock races.
                holder.on_arrival = lambda: loop.call_soon_threadsafe(scope.reschedule, loop.time())
                await client.submit(PROMPT, aspect_ratio="3:2", resolution="2k")

        async with AsyncClient(api_key=KEY, base_url=url) as client:
            with pytest.raises(TimeoutError) as info:
                await submit_in_time(client)
        key = the_key_said(notes_of(info.value), caplog, "beta")
        assert (await resend(url, key, "beta")).replayed is True
        assert gateway.stats()["tasks_created"] == 1


async def test_a_submit_in_a_cancelled_anyio_scope_names_its_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cancel scope swallows its cancellation: the note is on the exception inside it, and
    the WARNING is all that reaches the caller."""
    caplog.set_level(logging.WARNING, "imggw_client")
    loop = asyncio.get_running_loop()
    seen: list[BaseException] = []
    with held_gateway() as (gateway, holder, url):
        async with AsyncClient(api_key=KEY, base_url=url) as client:
            with anyio.CancelScope() as scope:
                holder.on_arrival = lambda: loop.call_soon_threadsafe(scope.cancel)
                try:
                    await client.submit(PROMPT, aspect_ratio="3:2", resolution="2k")
                except BaseException as exc:
                    seen.append(exc)
                    raise
            assert scope.cancelled_caught
        key = the_key_said(notes_of(seen[0]), caplog, "beta")
        assert (await resend(url, key, "beta")).replayed is True
        assert gateway.stats()["tasks_created"] == 1


async def test_a_cancelled_generate_names_its_key_in_the_submit_phase(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "imggw_client")
    with held_gateway() as (gateway, holder, url):
        async with AsyncClient(api_key=KEY, base_url=url) as client:
            call = asyncio.ensure_future(
                client.generate(PROMPT, aspect_ratio="3:2", resolution="2k", surface="alpha")
            )
            await wait_for(holder.arrived)
            call.cancel()
            with pytest.raises(asyncio.CancelledError) as info:
                await call
        key = the_key_said(notes_of(info.value), caplog, "alpha")
        assert (await resend(url, key, "alpha")).replayed is True
        assert gateway.stats()["tasks_created"] == 1


async def test_a_key_the_caller_chose_is_noted_and_said_below_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller holds that key already (a batch's ledger, the CLI): a run that stops many
    submits at once does not warn once each."""
    caplog.set_level(logging.DEBUG, "imggw_client")
    mine = "my-own-key-0001"
    with held_gateway() as (_, holder, url):
        async with AsyncClient(api_key=KEY, base_url=url) as client:
            call = asyncio.ensure_future(client.submit(PROMPT, idempotency_key=mine))
            await wait_for(holder.arrived)
            call.cancel()
            with pytest.raises(asyncio.CancelledError) as info:
                await call
    [note] = notes_of(info.value)
    assert f"idempotency_key='{mine}'" in note
    said = [r for r in caplog.records if r.name == "imggw_client" and mine in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]


@pytest.mark.gateway(api_keys=[KEY], duration_min=30, duration_max=30)
@pytest.mark.slow
async def test_a_generate_cancelled_while_it_waits_names_its_task(
    gateway: MockGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Its caller never saw the task id: the note and the WARNING give it, with the key."""
    caplog.set_level(logging.WARNING, "imggw_client")
    polled = asyncio.Event()
    async with gateway.async_client() as client:
        call = asyncio.ensure_future(
            client.generate(PROMPT, surface="alpha", on_update=lambda task: polled.set())
        )
        await polled.wait()  # the wait is under way
        call.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await call
    [note] = notes_of(info.value)
    assert "task 1 (surface alpha, idempotency_key='" in note
    assert "client.wait('1', surface='alpha') or imggw poll 1 --surface alpha" in note
    [warning] = [r for r in caplog.records if r.name == "imggw_client"]
    assert "task 1 (surface alpha" in warning.getMessage()
    assert KEY not in note + warning.getMessage()
    assert PROMPT not in note + warning.getMessage()
    assert gateway.stats()["tasks_created"] == 1


@pytest.mark.gateway(api_keys=[KEY])
async def test_a_submit_cancelled_before_it_was_sent_says_nothing(
    gateway: MockGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled while its budget held it back: nothing left, so no key to name."""
    from imggw_client import RateLimit

    caplog.set_level(logging.WARNING, "imggw_client")
    async with gateway.async_client(rate_limit=RateLimit(submits_per_second=0.001)) as client:
        await client.submit(PROMPT)  # the budget's one slot for a long while
        with anyio.move_on_after(0.05):  # cancels the next one while it waits for a slot
            with pytest.raises(BaseException) as info:  # noqa: PT011 - the backend's cancellation
                await client.submit(PROMPT)
    assert notes_of(info.value) == []
    assert [r for r in caplog.records if r.name == "imggw_client"] == []
    assert gateway.stats()["tasks_created"] == 1


def test_an_interrupted_blocking_submit_names_its_key(caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C in a script: SIGINT reaches the main thread while it waits for the answer."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C is delivered to the main thread")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt here")
    caplog.set_level(logging.WARNING, "imggw_client")
    main = threading.main_thread().ident
    assert main is not None
    with held_gateway() as (gateway, holder, url):
        holder.on_arrival = lambda: signal.pthread_kill(main, signal.SIGINT)
        with Client(api_key=KEY, base_url=url) as client:
            with pytest.raises(KeyboardInterrupt) as info:
                client.submit(PROMPT, aspect_ratio="3:2", resolution="2k", surface="alpha")
            key = the_key_said(notes_of(info.value), caplog, "alpha")
            holder.release.set()
            again = client.submit(
                PROMPT, aspect_ratio="3:2", resolution="2k", surface="alpha", idempotency_key=key
            )
        assert again.replayed is True
        assert gateway.stats()["tasks_created"] == 1
