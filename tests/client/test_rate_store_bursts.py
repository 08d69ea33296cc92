"""The shared budget's scripts keep what processes share and nothing else (DESIGN 25): the
policy that reads them is the in-process budget's, so a lane in the store decides as an
in-process lane fed the same answers. Slots on a lease: a process killed while it holds some
frees them within seconds. Against a real ``redis-server``; the scripts read the store's clock,
so each step is asked at once, never after a sleep (but the leases, in the slow lane)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from imggw_client import RateLimit
from imggw_client._core import budget as B
from imggw_client._core import shared_budget as shared
from imggw_client._core.shared_budget import StoreTicket

from ..loopback import RedisServer

LIMIT = RateLimit()  # no ceiling
LANE = shared.lane_key("sk-bursts", "http://gw.test", B.SUBMIT)
KEYS = [LANE, shared.flying_key(LANE)]


@pytest.fixture
def scripts(redis_store: RedisServer) -> Iterator[dict[str, Any]]:
    with contextlib.closing(redis_store.client()) as store:
        yield {name: store.register_script(body) for name, body in shared.SCRIPTS.items()}


def run(
    scripts: dict[str, Any],
    steps: Generator[tuple[str, list[str]], object, Any],
    replies: list[tuple[str, object]] | None = None,
) -> Any:
    """Runs an operation's steps as the drivers do (each script's reply kept in ``replies``)."""
    answer: object = None
    try:
        while True:
            name, args = steps.send(answer)
            answer = scripts[name](keys=KEYS, args=args)
            if replies is not None:
                replies.append((name, answer))
    except StopIteration as end:
        return end.value


def new() -> StoreTicket:
    """A ticket as the drivers make one: with a random token."""
    return StoreTicket(B.SUBMIT, token=secrets.token_hex(8))


def take(scripts: dict[str, Any], ticket: StoreTicket, limit: RateLimit = LIMIT) -> float:
    return float(run(scripts, shared.take_steps(limit, ticket)))


def finish(
    scripts: dict[str, Any],
    ticket: StoreTicket,
    *,
    limited: bool = False,
    hint: float | None = None,
    replies: list[tuple[str, object]] | None = None,
) -> float | None:
    """Ends a request; returns the hint its retry owes (an isolated 429's)."""
    return run(
        scripts,
        shared.finished_steps(LIMIT, ticket, limited=limited, retry_after=hint, backoff=(0.5, 8.0)),
        replies,
    )


def sent(scripts: dict[str, Any]) -> StoreTicket:
    ticket = new()
    assert take(scripts, ticket) == 0.0
    return ticket


def lane(scripts: dict[str, Any]) -> B.Pacing:
    answer = scripts["answer"](keys=KEYS, args=["", ""])
    return shared.read_lane(LIMIT, B.SUBMIT, answer)[0]


def test_the_start_window_lets_four_go_then_one_more_for_each_answer(
    scripts: dict[str, Any],
) -> None:
    first = [sent(scripts) for _ in range(B.START_WINDOW)]
    held = new()
    assert take(scripts, held) > 0  # the window is full
    finish(scripts, first[0])  # an answer frees a place, and widens the window (it was full)
    assert lane(scripts).window == B.START_WINDOW + 1
    assert take(scripts, held) == 0.0
    assert take(scripts, new()) == 0.0  # the window's new place


def test_an_isolated_429_neither_pauses_nor_paces_the_store_lane(scripts: dict[str, Any]) -> None:
    for _ in range(10):
        finish(scripts, sent(scripts))
    assert finish(scripts, sent(scripts), limited=True, hint=2.0) == 2.0  # its retry's wait
    assert take(scripts, new()) == 0.0  # every other request goes at once
    state = lane(scripts)
    assert state.rate is None
    assert state.paused_until == -float("inf")


def test_a_store_lane_decides_as_an_in_process_lane_fed_the_same_answers(
    scripts: dict[str, Any],
) -> None:
    # One policy (DESIGN 25): the same answers make the same overload, pace and pause. The
    # twin is fed the store's clock as the script that counted each answer read it (answers
    # are counted by the whole second they come in: a clock read after it, or the request's
    # send time, may fall in another second).
    twin = B.lane_of(None)
    outcomes = [False] * 30 + [True] * 12
    for limited in outcomes:
        ticket = sent(scripts)
        replies: list[tuple[str, object]] = []
        finish(scripts, ticket, limited=limited, hint=2.0 if limited else None, replies=replies)
        counted = next(reply for name, reply in replies if name == "answer")
        answered_at = shared.read_lane(LIMIT, B.SUBMIT, counted)[2]
        assert ticket.sent is not None
        B.count(twin, answered_at, limited=limited)
        B.answered(
            twin,
            answered_at,
            sent=ticket.sent,
            limited=limited,
            retry_after=2.0 if limited else None,
            backoff=(0.5, 8.0),
        )
        if twin.rate is not None:
            break
    state = lane(scripts)
    assert state.mode == twin.mode == B.RECOVERING
    assert state.rate == pytest.approx(twin.rate)
    assert state.strikes == twin.strikes == 1
    waiting = new()
    wait = take(scripts, waiting)
    assert 1.9 <= wait <= 2.1  # the whole lane waits out the hint now


def test_a_ceiling_keeps_its_exact_spacing_and_no_window(scripts: dict[str, Any]) -> None:
    # The slots are read on the store's clock, never measured: a busy machine between two
    # takes moves ``now``, not the spacing (only a stall longer than a second would).
    limit = RateLimit(submits_per_second=1)
    step = 1.0 + B.GUARD
    tickets = [new() for _ in range(3)]
    waits = [take(scripts, ticket, limit) for ticket in tickets]
    assert waits[0] == 0.0
    assert tickets[1].slot - tickets[0].slot == pytest.approx(step, abs=1e-5)
    assert tickets[2].slot - tickets[1].slot == pytest.approx(step, abs=1e-5)
    assert 0.0 < waits[1] <= step < waits[2] <= 2 * step
    assert scripts["take"].registered_client.zcard(shared.flying_key(LANE)) == 0


def test_a_write_another_process_made_first_is_not_overwritten(scripts: dict[str, Any]) -> None:
    answer = scripts["answer"](keys=KEYS, args=["", ""])
    _, version, *_ = shared.read_lane(LIMIT, B.SUBMIT, answer)
    written = scripts["set"](keys=KEYS, args=[version, "0", "rate", "5.0", "mode", "recovering"])
    assert written == [b"1"]
    assert scripts["set"](keys=KEYS, args=[version, "0", "rate", "9.0"]) == [b"0"]
    assert lane(scripts).rate == 5.0


HOLDER = textwrap.dedent("""
    import sys, time
    from imggw_client import RateLimit
    from imggw_client._core import shared_budget as shared
    from imggw_client._core.shared_budget import StoreTicket
    import redis
    shared.LEASE = float(sys.argv[2])
    store = redis.Redis.from_url(sys.argv[1])
    scripts = {name: store.register_script(body) for name, body in shared.SCRIPTS.items()}
    keys = [shared.lane_key("sk-bursts", "http://gw.test", "submit")]
    keys.append(shared.flying_key(keys[0]))
    for _ in range(4):  # the whole start window, held
        ticket, steps, answer = StoreTicket("submit", token=str(_)), None, None
        steps = shared.take_steps(RateLimit(), ticket)
        try:
            while True:
                name, args = steps.send(answer)
                answer = scripts[name](keys=keys, args=args)
        except StopIteration as end:
            assert end.value == 0.0
    print("holding", flush=True)
    time.sleep(600)
""")


@pytest.mark.slow
def test_a_process_killed_while_it_holds_slots_frees_them_within_its_lease(
    scripts: dict[str, Any], redis_store: RedisServer
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_store.url, "1.0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "holding"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        killed = time.monotonic()
        assert take(scripts, new()) > 0  # every place of the window held by the dead process
        while take(scripts, new()) > 0:
            assert time.monotonic() - killed < 5.0, "the dead process's slots stayed held"
            time.sleep(0.05)
        assert time.monotonic() - killed <= 1.5  # its lease, not 120 s
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


def answer_with(**texts: str) -> list[str]:
    """The answer script's reply for a new lane, with some fields as the store holds them."""
    fields = ["" for _ in shared.FIELDS]
    for name, text in texts.items():
        if name in shared.FIELDS:
            fields[shared.FIELDS.index(name)] = text
    # version, queued, the store's clock, the requests in flight
    return [*fields, "0", "0", texts.get("now", "1.0"), texts.get("flying", "0")]


@pytest.mark.parametrize(
    "texts",
    [
        {"taken": "inf"},
        {"window": "1e400"},
        {"strikes": "-inf"},
        {"flying": "inf"},
        {"now": "inf"},
        # Values no process writes, which made a client sleep for ever or overflow its clock.
        {"paused_until": "1e300"},
        {"rate": "1e-300"},
        {"rate": "0"},
    ],
)
def test_a_count_or_a_clock_the_store_cannot_hold_is_a_bad_answer(texts: dict[str, str]) -> None:
    # Whoever writes to the store chooses these: a count or a clock that is not finite is a
    # store answering garbage (the driver then paces alone), never an OverflowError.
    assert shared.read_lane(LIMIT, B.SUBMIT, answer_with())[0].window == B.START_WINDOW
    with pytest.raises(shared.StoreAnswerError):
        shared.read_lane(LIMIT, B.SUBMIT, answer_with(**texts))


@pytest.mark.parametrize("wait", ["-1", "1e300", "inf"])
def test_a_take_that_says_to_wait_past_any_wait_a_lane_makes_is_a_bad_answer(wait: str) -> None:
    steps = shared.take_steps(LIMIT, shared.StoreTicket(B.SUBMIT))
    assert steps.send(None)[0] == "take"
    with pytest.raises(shared.StoreAnswerError):
        steps.send([wait, "0", "0", "1.0", "0", "0"])


def test_a_time_the_store_holds_as_never_reads_back_as_never() -> None:
    pacing = shared.read_lane(LIMIT, B.SUBMIT, answer_with(paused_at="-inf", halved_at="-inf"))[0]
    assert (pacing.paused_at, pacing.halved_at) == (-float("inf"), -float("inf"))
