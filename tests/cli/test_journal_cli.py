"""The command line's journal (DESIGN 19): ``submit`` and ``generate`` record before sending,
``status``/``poll``/``download`` update what they see; ``imggw tasks`` lists it and ``imggw
tasks collect`` saves what is left, a submit killed mid-request included. A default journal that
cannot be opened is a warning; one the user named is an error before anything is sent."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imggw_client.mock import MockGateway, MockRequest, MockResponse

from ..held import held_gateway
from ..journals import rows
from .helpers import CANARY, IMGGW, imggw, process_env


def journal_file() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "imggw" / "journal.sqlite"


def test_submit_records_before_sending_and_tasks_lists_it(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    path = journal_file()
    at_arrival: list[list[dict[str, Any]]] = []
    handle = gw.handle

    def spy(request: MockRequest) -> MockResponse:
        if request.method == "POST":
            at_arrival.append(rows(path))
        return handle(request)

    gw.handle = spy  # type: ignore[method-assign]
    sent = imggw("submit", "a lighthouse", "--base-url", url, "--json")
    assert sent.code == 0, sent.err
    (record,) = sent.records()
    ((row,),) = at_arrival
    assert (row["idempotency_key"], row["state"], row["task_id"]) == (
        record["idempotency_key"],
        "unknown",
        None,
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    listed = imggw("tasks", "--json")
    assert listed.code == 0, listed.err
    (entry,) = listed.records()
    assert entry["task_id"] == record["task_id"]
    assert entry["idempotency_key"] == record["idempotency_key"]
    assert set(entry) >= {
        "task_id",
        "surface",
        "idempotency_key",
        "status",
        "submitted_at",
        "expires_at",
        "files",
        "request",
    }
    # status and download update what they see; the list says so.
    assert imggw("poll", record["task_id"], "--base-url", url).code == 0
    saved = imggw("download", record["task_id"], "-o", str(tmp_path / "out"), "--base-url", url)
    assert saved.code == 0, saved.err
    (entry,) = imggw("tasks", "--json").records()
    assert entry["state"] == "saved"
    assert entry["files"] == saved.out.split()
    text = imggw("tasks")
    assert record["task_id"] in text.out
    assert "saved" in text.out
    assert imggw("tasks", "--unfinished", "--json").out == ""


@pytest.mark.parametrize("off", [["--no-journal"], ["--mock"]])
def test_no_journal_is_kept_when_asked_or_for_mock_tasks(
    served_gateway: tuple[MockGateway, str], off: list[str]
) -> None:
    _, url = served_gateway
    args = ["submit", "a fox", *off] + ([] if "--mock" in off else ["--base-url", url])
    assert imggw(*args).code == 0
    assert not journal_file().exists()
    refused = imggw("tasks", "collect", *off)
    assert refused.code == 2
    assert "no journal" in refused.err


def test_imggw_journal_off_and_a_named_path(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    assert imggw("submit", "a", "--base-url", url, env={"IMGGW_JOURNAL": "off"}).code == 0
    assert not journal_file().exists()
    named = tmp_path / "mine.sqlite"
    assert imggw("submit", "b", "--base-url", url, env={"IMGGW_JOURNAL": str(named)}).code == 0
    assert [r["prompt"] for r in rows(named)] == ["b"]


def test_a_default_journal_that_cannot_be_opened_warns_and_a_named_one_stops(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, url = served_gateway
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocked))  # a file where the folder would go
    went = imggw("submit", "a fox", "--base-url", url)
    assert went.code == 0, went.err
    assert "warning: cannot use the journal" in went.err
    assert gw.stats()["tasks_created"] == 1
    stopped = imggw(
        "submit", "a cat", "--base-url", url, env={"IMGGW_JOURNAL": str(blocked / "journal.sqlite")}
    )
    assert stopped.code == 4, stopped.err
    assert "cannot use the journal" in stopped.err
    assert gw.stats()["tasks_created"] == 1  # nothing sent


@pytest.mark.slow
def test_a_submit_killed_mid_request_is_collected_once(tmp_path: Path) -> None:
    gw = MockGateway(api_keys=[CANARY], duration_min=0.05, duration_max=0.2)
    env = process_env(CANARY)
    with held_gateway(gw) as (holder, url):
        app = subprocess.Popen(
            [*IMGGW, "submit", "a paid lighthouse", "--base-url", url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert holder.arrived.wait(60)
        os.kill(app.pid, signal.SIGKILL)
        out, _ = app.communicate(timeout=30)
        assert out == b""  # no id was printed: only the journal knows the submit
        holder.release.set()  # the task exists and is paid for; its answer went nowhere
        (row,) = rows(journal_file())
        assert (row["state"], row["task_id"]) == ("unknown", None)
        collected = subprocess.run(
            [
                *IMGGW,
                "tasks",
                "collect",
                "-o",
                str(tmp_path / "out"),
                "--wait",
                "--base-url",
                url,
                "--json",
            ],
            env=env,
            capture_output=True,
            timeout=120,
        )
    assert collected.returncode == 0, collected.stderr.decode()
    (record,) = [json.loads(line) for line in collected.stdout.splitlines()]
    assert gw.stats()["tasks_created"] == 1  # replayed with its key, never billed again
    (saved,) = record["files"]
    assert Path(saved["path"]).name == f"{record['task_id']}-0.png"  # as generate names it
    assert Path(saved["path"]).stat().st_size == saved["size"] > 0
    assert CANARY.encode() not in collected.stdout + collected.stderr


@pytest.mark.gateway(duration_min=30, duration_max=30)
def test_collect_exits_3_while_tasks_run_and_1_when_one_failed(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    assert imggw("submit", "slow", "--base-url", url).code == 0
    running = imggw("tasks", "collect", "-o", str(tmp_path), "--base-url", url)
    assert running.code == 3, running.err
    assert "still running" in running.err
    gw.configure(duration_min=0.01, duration_max=0.02, failure_rate=1.0)
    assert imggw("submit", "doomed", "--base-url", url).code == 0
    gw.configure(failure_rate=0.0, duration_min=30, duration_max=30)
    failed = imggw("tasks", "collect", "-o", str(tmp_path), "--base-url", url)
    assert failed.code == 1, failed.err
    assert "failed" in failed.err


@pytest.mark.slow
def test_many_processes_at_once_share_the_default_journal(
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, url = served_gateway
    env = process_env(CANARY)
    procs = [
        subprocess.Popen(
            [*IMGGW, "submit", f"prompt {n}", "--base-url", url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(8)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        assert b"locked" not in err
    assert len({r["task_id"] for r in rows(journal_file())}) == 8
