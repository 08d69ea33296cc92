"""repr and str of the public models show result links without query strings or userinfo
(DESIGN 18): a gateway may put a key in a link (``?api_key=...``); the data keeps it whole."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from imggw_client import DownloadedFile, Submission, Task, TaskFailedError, TaskStatus
from imggw_client._core.text import link_for_display

SECRET = "sk-link-canary-93be"
LINKS = [
    f"https://cdn.example/r/1.png?api_key={SECRET}",
    f"https://cdn.example/r/2.png?sig=abc&X-Key={SECRET}#frag",
    f"https://reader:{SECRET}@cdn.example/r/3.png",
    f"https://{SECRET}@cdn.example/r/4.png",
    f"https://reader:{SECRET[:6]}/{SECRET[6:]}@cdn.example/r/5.png",  # "/" in the password
    f"https://reader:{SECRET[:6]}#{SECRET[6:]}@cdn.example/r/6.png",  # "#" in the password
    f"https://reader:1234/{SECRET}@cdn.example/r/7.png",  # a password that reads as a port
]


def shown(*objects: object) -> str:
    return "".join(repr(o) + str(o) + f"{o}" for o in objects)


def pieces(secret: str) -> list[str]:
    return [secret, secret[:6], secret[6:]]


def test_task_repr_and_str_show_links_without_query_or_userinfo() -> None:
    task = Task(id="7", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=LINKS)
    text = shown(task, [task], {"t": task})
    for piece in pieces(SECRET):
        assert piece not in text, text
    for n in range(1, 8):
        assert f"https://cdn.example/r/{n}.png" in text
    assert task.image_urls == LINKS  # the data itself is unchanged
    assert pickle.loads(pickle.dumps(task)).image_urls == LINKS


def test_a_failed_tasks_error_shows_its_task_without_the_key() -> None:
    task = Task(id="7", surface="beta", status=TaskStatus.FAILED, image_urls=LINKS[:1])
    err = TaskFailedError(task)
    assert SECRET not in repr(err) + str(err) + repr(err.task)


@pytest.mark.parametrize("link", LINKS)
def test_downloaded_file_repr_and_str_show_its_link_without_the_key(link: str) -> None:
    saved = DownloadedFile(path=Path("out/7-0.png"), url=link, sha256="0" * 64, size=10)
    text = shown(saved)
    for piece in pieces(SECRET):
        assert piece not in text, text
    assert "cdn.example/r/" in text
    assert saved.url == link
    assert saved.model_dump()["url"] == link


def test_submission_repr_holds_no_link() -> None:
    sub = Submission(task_id="7", idempotency_key="k-1", surface="alpha")
    assert "http" not in repr(sub) + str(sub)


@pytest.mark.parametrize(
    ("link", "display"),
    [
        ("https://cdn.example/r/@2x.png?sig=1", "https://cdn.example/r/@2x.png"),
        ("https://cdn.example:8443/a.png?k=1", "https://cdn.example:8443/a.png"),
        ("not a url?k=1", "not a url"),
    ],
)
def test_links_without_secrets_are_shown_as_they_are_less_the_query(
    link: str, display: str
) -> None:
    assert link_for_display(link) == display


def test_a_link_holding_its_clients_key_stays_blanked_in_reprs_after_the_client_is_gone() -> None:
    # A key in a link's path is no query or userinfo: only the key itself can be blanked, and
    # the process-wide registry lets a key go when its client closes. The task read with it
    # keeps it blanked for as long as the task lives; another task's repr is left as it was.
    from imggw_client._core import surfaces
    from imggw_client._core.text import KNOWN_KEYS
    from imggw_client._core.wire import Reply

    key = "sk-path-canary-4f1e"
    assert key not in KNOWN_KEYS  # no client of this key is live
    link = f"https://cdn.example/{key}/1.png"
    record = {"id": "7", "status": "completed", "result": {"images": [{"url": [link]}]}}
    body = {"code": 200, "data": record}
    reply = Reply(status=200, headers={}, content=json.dumps(body).encode())
    task = surfaces.read_task("beta", reply, "7", 0.0, (key,))
    assert task.image_urls == [link]  # the data is unchanged
    assert key not in shown(task, TaskFailedError(task))
    assert "https://cdn.example/[redacted]/1.png" in repr(task)
    plain = Task(id="8", surface="beta", status=TaskStatus.SUCCEEDED, image_urls=task.image_urls)
    assert key in repr(plain)  # not read by a client of that key: nothing tells it is one
