"""The gateway's silence (``_core/silence.py``), on numbers for a clock: counted from the first
request sent since the last answer, held by requests still in flight after an answer, kept
through failed attempts (a retry's sleep), and over only when an answer leaves nothing in
flight."""

from __future__ import annotations

import pytest

from imggw_client._core.silence import Silence, answered


@pytest.mark.parametrize(
    ("status", "is_answer"),
    [(200, True), (404, True), (429, True), (500, False), (503, False), (None, False)],
)
def test_an_answer_is_any_reply_but_a_5xx(status: int | None, is_answer: bool) -> None:
    assert answered(status) is is_answer


def test_nothing_asked_is_no_silence_however_long() -> None:
    silence = Silence()
    assert silence.silent_for(1_000.0) == 0.0
    silence.asked(10.0)
    silence.heard(10.5, answer=True)
    assert silence.silent_for(500.0) == 0.0  # answered, and asked nothing since: idle, not silent


def test_a_silence_counts_from_the_first_request_since_the_last_answer() -> None:
    silence = Silence()
    silence.asked(100.0)  # after a long idle spell: that spell is no silence
    assert silence.silent_for(130.0) == 30.0
    silence.heard(131.0, answer=False)  # connection refused; the retry sleeps
    assert silence.silent_for(161.0) == 61.0  # nothing in flight, still no answer
    silence.asked(162.0)  # the retry: the silence goes on from where it began
    silence.heard(170.0, answer=False)
    assert silence.silent_for(200.0) == 100.0
    silence.asked(201.0)
    silence.heard(202.0, answer=True)
    assert silence.silent_for(300.0) == 0.0


def test_requests_hung_behind_an_answer_are_silence_from_that_answer() -> None:
    silence = Silence()
    for _ in range(3):  # three polls go; the gateway answers one, then hangs
        silence.asked(0.0)
    silence.heard(1.0, answer=True)
    assert silence.silent_for(61.0) == 60.0  # two still unanswered, sent before that answer
    silence.heard(62.0, answer=False)  # one times out
    silence.heard(63.0, answer=True)  # the other is answered: nothing left in flight
    assert silence.silent_for(100.0) == 0.0
