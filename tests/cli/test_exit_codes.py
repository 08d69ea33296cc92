"""The CLI exits by condition (DESIGN 18), whatever else is on its command line: an expired
result 1, credits ran out 6 on every command, a task the key cannot see 1 (over an unfinished
task's 3); each alone and beside other ids. Over loopback against the reference gateway, its
clock moved by hand so that a task is done, expired or running exactly when the test says."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from imggw_cli import _exit
from imggw_client._core import reasons
from imggw_client.mock import MockGateway
from imggw_client.mock._serving import refuse

from .helpers import CANARY, imggw

POOR = "777"  # a task whose every query the gateway answers 402 (the balance hit 0)


@dataclass
class Tasks:
    url: str
    done: str  # succeeded, results kept
    expired: str  # succeeded, results past the retention (links answer 410)
    running: str
    unknown: str = "999"  # never made: the key cannot see it


@pytest.fixture
def tasks() -> Iterator[Tasks]:
    gw = MockGateway(
        api_keys=[CANARY], manual_clock=True, duration_min=30, duration_max=30, retention=600
    )
    answer = gw.handle

    def broke(request: Any) -> Any:
        if request.method == "GET" and request.path.endswith(f"/tasks/{POOR}"):
            return gw._error("beta", refuse(reasons.INSUFFICIENT_CREDITS))
        return answer(request)

    gw.handle = broke  # type: ignore[method-assign]
    with gw.serve() as url:

        def submit(prompt: str) -> str:
            run = imggw("submit", prompt, "--base-url", url, "--json")
            assert run.code == 0, run.err
            task_id: str = run.records()[0]["task_id"]
            return task_id

        expired = submit("a cat")
        gw.advance(640)  # done at 30, kept until 630, answered (410) until 690
        done = submit("a dog")
        gw.advance(40)  # done at 670
        running = submit("a fox")  # done at 710, which this clock never reaches
        yield Tasks(url, done, expired, running)


def download(tasks: Tasks, folder: Path, *ids: str) -> int:
    run = imggw("download", *ids, "--base-url", tasks.url, "-o", str(folder))
    assert "Traceback" not in run.err
    return run.code


@pytest.mark.slow
def test_an_expired_result_exits_1_alone_and_beside_other_ids(tasks: Tasks, tmp_path: Path) -> None:
    assert download(tasks, tmp_path / "a", tasks.expired) == 1
    assert download(tasks, tmp_path / "b", tasks.done, tasks.expired) == 1
    assert len(list((tmp_path / "b").glob("*.png"))) == 1  # the other one is saved
    # A later run resumes the unfinished one: 3 goes before a task that failed or expired.
    assert download(tasks, tmp_path / "c", tasks.expired, tasks.running) == 3


@pytest.mark.slow
def test_a_task_the_key_cannot_see_exits_1_on_every_command_and_over_3(
    tasks: Tasks, tmp_path: Path
) -> None:
    for command in (["status"], ["poll", "-t", "5"]):
        run = imggw(*command, tasks.unknown, "--base-url", tasks.url)
        assert run.code == 1, run.err
        assert "check the task id, --surface and --base-url" in run.err
    assert download(tasks, tmp_path / "a", tasks.unknown) == 1
    assert download(tasks, tmp_path / "b", tasks.done, tasks.unknown) == 1
    # `download 10 1 999`: unfinished beside unknown is 1, so a retry-on-3 loop stops
    assert download(tasks, tmp_path / "c", tasks.running, tasks.done, tasks.unknown) == 1
    assert download(tasks, tmp_path / "d", tasks.running, tasks.done) == 3


@pytest.mark.slow
@pytest.mark.gateway(credits=0, duration_max=0.05)
def test_credits_ran_out_exits_6_on_every_command(
    served_gateway: tuple[MockGateway, str], tasks: Tasks, tmp_path: Path
) -> None:
    poor, url = served_gateway
    generate = imggw("generate", "a cat", "--base-url", url, "-o", str(tmp_path / "g"))
    submit = imggw("submit", "a cat", "--base-url", url)
    source = tmp_path / "prompts.txt"
    source.write_text("a cat\na dog\n")
    batch = imggw("batch", str(source), "-o", str(tmp_path / "batch"), "--base-url", url)
    assert (generate.code, submit.code, batch.code) == (6, 6, 6), generate.err
    assert generate.err.rstrip().endswith(
        "(insufficient_credits): top up the account, then run the same command again"
    )
    assert poor.stats()["tasks_created"] == 0
    status = imggw("status", POOR, "--base-url", tasks.url)
    assert status.code == 6
    assert download(tasks, tmp_path / "a", POOR) == 6
    # beside every other condition: no id can be had until the account is topped up
    assert download(tasks, tmp_path / "b", tasks.done, tasks.running, tasks.unknown, POOR) == 6


def test_the_precedence_of_several_ids_is_one_table() -> None:
    c = _exit.Condition
    assert _exit.several([]) == _exit.several([c.OK, c.OK]) == 0
    assert [_exit.CODES[x] for x in _exit.PRECEDENCE] == [4, 6, 2, 1, 3, 1, 5]
    assert _exit.several([c.ERROR, c.OK]) == 5  # a network error is 5 beside a saved task too
    assert _exit.several([c.ERROR, c.FAILED, c.UNFINISHED]) == 3
    assert _exit.several([c.UNFINISHED, c.UNKNOWN_TASK]) == 1
    assert _exit.several([c.UNKNOWN_TASK, c.USAGE, c.CREDITS]) == 6
    assert set(_exit.PRECEDENCE) == set(c) - {c.OK}
    for code in (1, 2, 3, 4, 5, 6):
        assert _exit.CODES[_exit.condition_of_code(code)] == code
