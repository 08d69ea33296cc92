"""What the tracker's loop stands on (``tracking/_store.py``): a run's course (its deadline, the
time one item's step may take, retries that stop at the deadline or at a failure that ends the
run), what is worth trying again later, and the item protocol a batch's row meets."""

from __future__ import annotations

import math
import time

import pytest
import tenacity.wait

from imggw_client import (
    AuthenticationError,
    DownloadError,
    ImageRequest,
    InvalidRequestError,
    ServerError,
    UnknownOutcomeError,
)
from imggw_client.batch._lines import COLLECT
from imggw_client.tracking._store import FATAL, Course, Item, retry_later

from ..batch.ledgers import row

pytestmark = pytest.mark.anyio


async def test_an_items_step_gives_up_at_its_line_timeout_or_the_runs_deadline_if_sooner() -> None:
    now = time.monotonic()
    course = Course(deadline=now + 100, line_timeout=10, redact=str)
    assert now + 10 <= course.line_deadline() < now + 100
    assert Course(deadline=now + 5, line_timeout=10, redact=str).line_deadline() == now + 5
    assert Course(deadline=math.inf, line_timeout=None, redact=str).line_deadline() == math.inf
    assert 99 < course.remaining() <= 100


async def _failing(course: Course, until: float, tries: list[int], *, fatal_at: int) -> None:
    """A step that always fails with a 503, worth trying again; at try ``fatal_at`` another
    item's step has met a failure that ends the run."""
    async for attempt in course.retrying(until):
        with attempt:
            tries.append(len(tries) + 1)
            if len(tries) == fatal_at:
                course.stop(AuthenticationError("no", status_code=401))
            raise ServerError("boom", status_code=503)


async def test_retries_stop_once_a_failure_ends_the_run() -> None:
    course = Course(deadline=math.inf, line_timeout=None, redact=str)
    tries: list[int] = []
    with pytest.raises(ServerError):
        await _failing(course, math.inf, tries, fatal_at=2)
    assert tries == [1, 2]
    assert isinstance(course.fatal, AuthenticationError)
    assert course.cancel.cancel_called


async def test_a_retry_that_would_sleep_past_its_deadline_is_not_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pause is drawn from 0 to 0.5 s (full jitter): drawn under 0.01 s, 1 run in 50, the
    # retry fit and the test failed. The draw is the longest here, as the pause it names.
    monkeypatch.setattr(tenacity.wait.random, "uniform", lambda low, high: high)
    course = Course(deadline=math.inf, line_timeout=None, redact=str)
    tries: list[int] = []
    with pytest.raises(ServerError):
        await _failing(course, time.monotonic() + 0.01, tries, fatal_at=0)  # less than a pause
    assert tries == [1]
    assert course.fatal is None


async def test_what_is_tried_again_later_and_what_ends_the_run() -> None:
    lost = UnknownOutcomeError(
        "lost", idempotency_key="k", request=ImageRequest("a fox"), surface="beta"
    )
    assert retry_later(lost)  # the key replays it
    assert retry_later(DownloadError("reset", code="download_failed"))
    assert not retry_later(DownloadError("a page", code="not_an_image"))
    assert not retry_later(InvalidRequestError("bad", status_code=400))
    assert not retry_later(AuthenticationError("no", status_code=401))
    assert AuthenticationError in FATAL
    assert (
        Course(deadline=0, line_timeout=None, redact=lambda s: s.replace("sk", "**")).why(
            InvalidRequestError("sk-1 bad", status_code=400)
        )
        == "**-1 bad"
    )  # no reason code: its words, the key blanked


def test_a_batch_row_is_an_item_made_here_unless_it_names_a_task_made_elsewhere() -> None:
    made: Item = row(1)
    collected: Item = row(2, task_id="9", kind=COLLECT, idempotency_key=None)
    assert made.made_here
    assert not collected.made_here
