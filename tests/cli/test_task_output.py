"""What status, poll and generate say about a task besides its state: when its links expire
(human lines and ``--json`` ``expires_at``), and its cost and credits."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from imggw_cli._output import task_lines, task_record
from imggw_cli._when import links_expire, span
from imggw_client import Client, Task, TaskStatus
from imggw_client.mock import MockGateway

from .helpers import imggw

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def task(**fields: Any) -> Task:
    return Task(
        id="7",
        surface="beta",
        status=TaskStatus.SUCCEEDED,
        image_urls=["http://cdn.test/7.png"],
        **fields,
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3, "0 s"),
        (0, "0 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (86399, "23 h 59 min"),
        (86400, "1 d"),
        (90061, "1 d 1 h"),
    ],
)
def test_spans_read_in_their_two_largest_units_rounded_down(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_links_expire_in_the_future_or_expired_in_the_past() -> None:
    assert links_expire(NOON + timedelta(hours=24) - timedelta(seconds=30), NOON) == (
        "links expire in 23 h 59 min (2030-01-02T11:59:30Z)"
    )
    assert links_expire(NOON - timedelta(minutes=5, seconds=20), NOON) == (
        "links expired 5 min ago (2030-01-01T11:54:40Z)"
    )
    other_zone = timezone(timedelta(hours=2))
    assert links_expire(datetime(2030, 1, 1, 15, 0, tzinfo=other_zone), NOON) == (
        "links expire in 1 h (2030-01-01T13:00:00Z)"
    )


def test_task_lines_say_when_the_links_expire_and_what_the_task_cost(cli_now: datetime) -> None:
    soon = cli_now + timedelta(hours=24) - timedelta(seconds=30)
    lines = task_lines(task(expires_at=soon, cost=0.04, credits=4.0))
    assert lines[3:] == [
        f"links expire in 23 h 59 min ({soon.isoformat().replace('+00:00', 'Z')})",
        "cost: 0.04",
        "credits: 4",
    ]
    assert task_lines(task(expires_at=cli_now - timedelta(minutes=5, seconds=1)))[3].startswith(
        "links expired 5 min ago ("
    )
    assert not any("expire" in line for line in task_lines(task()))


def test_task_record_adds_cost_credits_and_expires_at_to_the_pinned_fields() -> None:
    record = task_record(task(expires_at=NOON, cost=0.04, credits=4.0))
    assert record == {
        "task_id": "7",
        "status": "succeeded",
        "progress": None,
        "image_urls": ["http://cdn.test/7.png"],
        "error": None,
        "cost": 0.04,
        "credits": 4.0,
        "expires_at": "2030-01-01T12:00:00Z",
    }
    bare = task_record(task())
    assert (bare["cost"], bare["credits"], bare["expires_at"]) == (None, None, None)


@pytest.mark.slow
def test_status_poll_and_generate_json_carry_cost_and_credits(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    task_id = imggw("submit", "a cat", "--base-url", url, "--json").records()[0]["task_id"]
    poll = imggw("poll", task_id, "--base-url", url, "--json").records()[0]
    status = imggw("status", task_id, "--base-url", url, "--json").records()[0]
    generate = imggw("generate", "a dog", "--base-url", url, "-o", str(tmp_path), "--json")
    for record in (poll, status, generate.records()[0]):
        assert isinstance(record["cost"], float)
        assert isinstance(record["credits"], float)
        assert record["expires_at"].endswith("Z")  # the reference gateway always sets it
    human = imggw("status", task_id, "--base-url", url).out.splitlines()
    assert f"cost: {status['cost']:g}" in human
    assert f"credits: {status['credits']:g}" in human


@pytest.fixture
def expiring(monkeypatch: pytest.MonkeyPatch, cli_now: datetime) -> datetime:
    """Tasks whose links expire in a day less half a minute, whatever the gateway says."""
    soon = cli_now + timedelta(hours=24) - timedelta(seconds=30)
    for name in ("get", "wait"):
        real = getattr(Client, name)

        def stamped(self: Client, *args: Any, _real: Any = real, **kwargs: Any) -> Task:
            found: Task = _real(self, *args, **kwargs)
            return found.model_copy(update={"expires_at": soon})

        monkeypatch.setattr(Client, name, stamped)
    return soon


@pytest.mark.slow
def test_status_poll_and_generate_say_when_the_links_expire(
    served_gateway: tuple[MockGateway, str], expiring: datetime, tmp_path: Path
) -> None:
    _, url = served_gateway
    stamp = expiring.isoformat().replace("+00:00", "Z")
    line = f"links expire in 23 h 59 min ({stamp})"
    task_id = imggw("submit", "a cat", "--base-url", url, "--json").records()[0]["task_id"]
    poll = imggw("poll", task_id, "--base-url", url)
    assert line in poll.out.splitlines()
    assert line in imggw("status", task_id, "--base-url", url).out.splitlines()
    assert imggw("status", task_id, "--base-url", url, "--json").records()[0]["expires_at"] == stamp
    generate = imggw("generate", "a dog", "--base-url", url, "-o", str(tmp_path))
    assert generate.code == 0, generate.err
    assert line in generate.err.splitlines()  # stdout keeps the saved paths only
    assert all(Path(path).exists() for path in generate.out.splitlines())
    quiet = imggw("generate", "a fox", "--base-url", url, "-o", str(tmp_path), "--json", "-q")
    assert quiet.err == ""
    assert quiet.records()[0]["expires_at"] == stamp
