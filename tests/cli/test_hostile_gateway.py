"""Terminal injection: a gateway that puts escape sequences in its task records must not reach
the user's terminal through any command's stdout or stderr. Served over a real socket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from imggw_client.mock._asgi import serve_app

from .helpers import imggw

# Retitle the window, clear the screen, return to the line start, a C1 CSI, a bidi override.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\r\x9b6n\u202e"
URL = f"http://127.0.0.1:9/img{HOSTILE}.png"


def record(task_id: str) -> dict[str, Any]:
    """Surface-B task records: 1 succeeded with a hostile URL, 2 failed with a hostile error,
    others in a hostile state the SDK does not know."""
    if task_id == "1":
        return {
            "id": "1",
            "status": "completed",
            "progress": 100,
            "cost": 0.04,
            "credits_cost": 4,
            "result": {"images": [{"url": [URL]}]},
        }
    if task_id == "2":
        error = {"code": f"bad{HOSTILE}", "message": f"it broke{HOSTILE}\nerror: forged line"}
        return {"id": "2", "status": "failed", "error": error}
    return {"id": task_id, "status": f"odd{task_id}{HOSTILE}", "progress": 5}


async def hostile_gateway(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    task_id = scope["path"].rsplit("/", 1)[-1]
    body = json.dumps({"code": 200, "data": record(task_id)}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def hostile() -> Iterator[str]:
    with serve_app(hostile_gateway) as url:
        yield url


def clean(text: str) -> bool:
    """Nothing a terminal would act on: only printable characters and our own line breaks."""
    return all(c.isprintable() or c in "\n\t" for c in text)


COMMANDS = [
    (["status", "1"], 0),
    (["poll", "1"], 0),
    (["status", "2"], 0),
    (["poll", "2"], 1),
    (["download", "2", "-o", "{tmp}"], 1),
    (["status", "3"], 0),  # each unknown state is logged once per process: 3, then 4
    (["poll", "4", "--timeout", "0.3"], 3),
    (["poll", "5", "--timeout", "0.3", "--verbose"], 3),  # debug logs and a traceback too
]


@pytest.mark.slow
def test_nothing_from_the_gateway_reaches_the_terminal_raw(hostile: str, tmp_path: Any) -> None:
    for args, code in COMMANDS:
        run = imggw(*(a.format(tmp=tmp_path) for a in args), "--base-url", hostile)
        assert run.code == code, (args, run.err)
        assert clean(run.out), (args, run.out)
        assert clean(run.err), (args, run.err)
        assert "pwned" in run.out + run.err, args  # the hostile text was shown escaped, not lost
        assert "\nerror: forged line" not in run.out + run.err, args  # no line can be forged


def test_a_url_with_control_characters_is_left_out_and_said_escaped(hostile: str) -> None:
    # Such a string is no URL anyone can fetch: the SDK leaves it out of image_urls and warns,
    # escaped; the task's record keeps it verbatim (Task.raw).
    human = imggw("status", "1", "--base-url", hostile)
    assert not any(line.startswith("image_url:") for line in human.out.splitlines())
    # urllib drops CR, LF and tab from a URL as it splits it (WHATWG): what is left is escaped.
    escaped = "http://127.0.0.1:9/img\\x1b]0;pwned\\x07\\x1b[2J\\x9b6n\\u202e.png"
    assert f"warning: 1 result URL(s) not usable, left out (the first: {escaped})" in (
        human.err.splitlines()
    )
    data = imggw("status", "1", "--base-url", hostile, "--json")
    assert clean(data.out)
    assert data.out.isascii()  # json.dumps escapes every control and non-ASCII character
    assert data.records()[0]["image_urls"] == []
