"""The shared budget's script with no ceiling behaves as the in-process budget (DESIGN 20): a
start window of requests in flight, a lone 429 paused in doubt, an overload once requests sent
after it are refused too. Against a real ``redis-server``; the script reads the store's clock,
so each step is asked at once, never after a sleep."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
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
def script(redis_store: RedisServer) -> Iterator[Any]:
    with contextlib.closing(redis_store.client()) as store:
        yield store.register_script(shared.SCRIPT)


def new() -> StoreTicket:
    """A ticket as the drivers make one: with a random token."""
    return StoreTicket(B.SUBMIT, token=secrets.token_hex(8))


def take(script: Any, ticket: StoreTicket) -> float:
    return shared.read_take(
        ticket, script(keys=KEYS, args=shared.place_args("take", LIMIT, ticket))
    )


def finish(
    script: Any, ticket: StoreTicket, *, limited: bool = False, hint: float | None = None
) -> None:
    args = shared.finished_args(LIMIT, ticket, limited=limited, retry_after=hint,
                                backoff=(0.5, 8.0))  # fmt: skip
    shared.read_ok(script(keys=KEYS, args=args))


def sent(script: Any) -> StoreTicket:
    ticket = new()
    assert take(script, ticket) == 0.0
    return ticket


def lane(script: Any) -> dict[bytes, bytes]:
    store = script.registered_client
    return store.hgetall(LANE)  # type: ignore[no-any-return]


def test_the_start_window_lets_four_go_then_one_more_for_each_answer(script: Any) -> None:
    first = [sent(script) for _ in range(B.START_WINDOW)]
    held = new()
    wait = take(script, held)
    assert 0 < wait <= 2 * B.RTT_GUESS  # held back until an answer frees a place
    finish(script, first[0])  # accepted, the window in use: it widens by one
    assert take(script, held) == 0.0
    assert take(script, new()) == 0.0  # (the widened place)
    assert lane(script)[b"mode"] == b"starting"


def test_a_lone_429_pauses_in_doubt_until_a_later_request_is_accepted(script: Any) -> None:
    lone, later = sent(script), sent(script)
    finish(script, lone, limited=True, hint=5.0)
    waiting = new()
    wait = take(script, waiting)
    assert 0 < wait <= B.RTT_GUESS + 0.01  # paused, asked again soon: `later` may lift it
    finish(script, later)  # the gateway took a request sent after the lone one: chance
    assert take(script, waiting) == 0.0
    assert lane(script)[b"rate"] == b""  # and no slower: unpaced still


def test_requests_sent_after_a_lone_429_refused_make_an_overload(script: Any) -> None:
    lone, second, third = sent(script), sent(script), sent(script)
    finish(script, lone, limited=True, hint=2.0)
    finish(script, second, limited=True, hint=2.0)
    assert lane(script)[b"doubt"] == b"1"  # one later refusal: still in doubt
    finish(script, third, limited=True, hint=2.0)
    state = lane(script)
    assert state[b"mode"] == b"recovering"  # CONFIRM refusals: an overload, paced
    assert float(state[b"rate"]) == pytest.approx(B.START_RATE * B.FIRST_DECREASE)
    wait = take(script, new())
    assert 1.9 <= wait <= 2.1  # the whole lane waits out the hint, no doubt left


def test_a_ceiling_keeps_its_exact_spacing_and_no_window(script: Any) -> None:
    limit = RateLimit(submits_per_second=10)
    waits = []
    for _ in range(3):
        ticket = new()
        args = shared.place_args("take", limit, ticket)
        waits.append(shared.read_take(ticket, script(keys=KEYS, args=args)))
    assert waits[0] == 0.0
    assert waits[1] == pytest.approx(0.101, abs=0.005)
    assert waits[2] == pytest.approx(0.202, abs=0.005)
    assert script.registered_client.zcard(shared.flying_key(LANE)) == 0


def store_now(script: Any) -> float:
    seconds, micros = script.registered_client.time()
    return float(seconds) + micros / 1e6


def went_at(at: float) -> StoreTicket:
    ticket = new()
    ticket.sent = at  # as the store's clock had it when the request went
    return ticket


def test_a_pause_with_no_hint_is_timed_to_the_window_learned_as_in_process(script: Any) -> None:
    # A run of 20 began 3 s ago, the last run had 20 taken, and probes bounded the gateway's
    # window to 7..11 s (budget.Budget._timed; the in-process twin of each step below).
    now = store_now(script)
    script.registered_client.hset(LANE, mapping={
        "mode": "recovering", "rate": "5", "ru": repr(now - 3), "rn": "20", "rl": "20",
        "clo": "7", "chi": "11",
    })  # fmt: skip
    twin = B.Budget(LIMIT)
    inproc = twin._lanes[B.SUBMIT]
    inproc.mode, inproc.rate, inproc.run_at = B.RECOVERING, 5.0, -3.0
    inproc.run, inproc.last_run = 20, 20
    inproc.cycle_lo, inproc.cycle_hi = 7.0, 11.0

    def twin_went(at: float, *, limited: bool) -> None:
        ticket = B.Ticket(B.SUBMIT, at, -1, paced=False, sent_at=at)
        twin.finished(ticket, at, limited=limited, backoff=(0.5, 8.0))

    finish(script, went_at(now), limited=True)  # the window full again: no hint
    twin_went(0.0, limited=True)
    state = lane(script)
    assert float(state[b"pu"]) - now == pytest.approx(9 - 3, abs=0.05)  # halfway, not 0.5 s
    assert inproc.paused_until == pytest.approx(9 - 3)
    probe = store_now(script)
    finish(script, went_at(probe), limited=True)  # a probe, refused: on to the upper bound
    twin_went(probe - now, limited=True)
    state = lane(script)
    assert float(state[b"pu"]) - now == pytest.approx(11 - 3, abs=0.05)
    assert inproc.paused_until == pytest.approx(11 - 3)
    assert (state[b"ho"], inproc.held_out) == (b"1", 1)
    taken = store_now(script)
    finish(script, went_at(taken), limited=False)  # a probe taken: the cycle ends
    twin_went(taken - now, limited=False)
    state = lane(script)
    assert float(state[b"chi"]) == pytest.approx(taken - now + 3, abs=0.01)
    assert inproc.cycle_hi == pytest.approx(taken - now + 3)
    assert (state[b"rl"], state[b"rn"], state[b"cy"]) == (b"20", b"1", b"0")
    assert (inproc.last_run, inproc.run, inproc.cycling) == (20, 1, False)
    assert float(state[b"ru"]) == pytest.approx(taken, abs=1e-3)


def test_a_429_before_the_run_is_full_is_not_timed_and_the_next_pause_waits_for_it(
    script: Any,
) -> None:
    now = store_now(script)
    script.registered_client.hset(LANE, mapping={
        "mode": "recovering", "rate": "5", "ru": repr(now - 1), "rn": "5", "rl": "20",
        "clo": "9", "chi": "10",
    })  # fmt: skip
    finish(script, went_at(now), limited=True)  # 5 of 20: the window is not full again
    state = lane(script)
    assert float(state[b"pu"]) - now < 1.0  # the backoff, not 10 s after the run began
    assert state[b"cy"] == b"0"
    gap = float(state[b"rg"])
    assert 0.4 < gap < 1.0  # the run's later requests go that much later: so will the next
