"""Progress that never goes silent (DESIGN 21): off a terminal, ``imggw batch`` (and ``download
--from``) writes a progress line at least every ``--progress-every`` seconds while no line
moves, and warns once when the gateway has answered nothing for a minute, with one note when
it answers again. The display on a fake clock; the command over real sockets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from imggw_cli import _batch_run, _output
from imggw_cli._batch_run import batch_display
from imggw_cli._globals import Globals
from imggw_cli._output import Output
from imggw_client.batch import BatchProgress, _run
from imggw_client.mock import MockGateway

from ..held import held_gateway
from .helpers import CANARY, IMGGW, imggw, process_env

SILENT = "warning: no answer from the gateway for 1 min; still trying"


def snapshot(running: int = 2, saved: int = 0, silent: float = 0.0) -> BatchProgress:
    counts: dict[Any, int] = {"running": running, "saved": saved}
    return BatchProgress(
        total=running + saved,
        counts={k: n for k, n in counts.items() if n},
        credits=0.0,
        cost=0.0,
        elapsed=1.0,
        finished_this_run=saved,
        gateway_silent_for=silent,
    )


def shown(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_a_line_comes_every_progress_every_seconds_while_nothing_moves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = SimpleNamespace(now=0.0)
    with batch_display(Output(Globals()), progress_every=30, clock=lambda: clock.now) as told:
        for second in range(0, 95):  # the engine tells a snapshot every second
            clock.now = float(second)
            told(snapshot())
    # t = 0, 30, 60, 90: the same counts, told again as time goes by
    assert [line.startswith("batch: 0/2 finished (running 2)") for line in shown(capsys)] == [
        True
    ] * 4


def test_moves_are_said_at_most_every_two_seconds_and_the_last_one_is_not_lost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = SimpleNamespace(now=0.0)
    with batch_display(Output(Globals()), progress_every=30, clock=lambda: clock.now) as told:
        told(snapshot(running=2))  # t=0: said
        clock.now = 1.0
        told(snapshot(running=1, saved=1))  # a move 1 s after: not yet
        clock.now = 2.0
        told(snapshot(running=1, saved=1))  # the next tick, nothing moved since: said now
        clock.now = 3.0
        told(snapshot(running=1, saved=1))  # said already
        clock.now = 3.5
        told(snapshot(running=0, saved=2))  # the last line finished: said at once
    lines = shown(capsys)
    assert [line.split(";")[0] for line in lines] == [
        "batch: 0/2 finished (running 2)",
        "batch: 1/2 finished (running 1, succeeded 1)",
        "batch: 2/2 finished (succeeded 2)",
    ]


@pytest.mark.parametrize("quiet", [False, True])
def test_a_silent_gateway_is_warned_about_once_and_its_answer_noted_once(
    capsys: pytest.CaptureFixture[str], quiet: bool
) -> None:
    with batch_display(Output(Globals(quiet=quiet)), progress_every=1e9) as told:
        for silent in (0.0, 30.0, 59.0, 60.2, 61.2, 90.0, 0.0, 0.0, 3.0):
            told(snapshot(silent=silent))
        for silent in (70.0, 0.0):  # silent again later: warned again, once
            told(snapshot(silent=silent))
    lines = [line for line in shown(capsys) if not line.startswith("batch:")]
    answered = "the gateway answers again, after 1 min without an answer"
    expected = [SILENT, answered, SILENT, answered]
    assert lines == ([SILENT, SILENT] if quiet else expected)  # a warning even with --quiet


def test_the_silence_events_are_json_objects(capsys: pytest.CaptureFixture[str]) -> None:
    _output.use(_output.JSON)
    try:
        with batch_display(Output(Globals()), progress_every=1e9) as told:
            for silent in (0.0, 61.0, 75.5, 0.0):
                told(snapshot(silent=silent))
    finally:
        _output.use(_output.TEXT)
    records = [json.loads(line) for line in shown(capsys)]
    events = [(r["event"], r["level"], r.get("silent_for")) for r in records]
    assert events == [
        ("batch_progress", "info", None),
        ("gateway_silent", "warning", 61.0),
        ("gateway_answers", "info", 75.5),
    ]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_progress_every_exits_2_in_one_line_and_sends_nothing(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, value: str
) -> None:
    gw, url = served_gateway
    source = tmp_path / "in.txt"
    source.write_text("a cat\n")
    for command in (["batch", str(source)], ["download", "--from", str(source)]):
        run = imggw(
            *command, "-o", str(tmp_path / "out"), "--progress-every", value, "--base-url", url
        )
        assert run.code == 2, run.err
        assert run.err.strip().splitlines() == [
            f"error: --progress-every must be a number of seconds > 0 (got {value!r}); "
            "nothing was sent"
        ]
    assert gw.stats()["requests"] == {}


@pytest.mark.slow
@pytest.mark.gateway(duration_min=4, duration_max=4)
def test_progress_lines_come_while_tasks_run_and_nothing_changes(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    """Tasks of 4 s, a line at least every 0.5 s: lines with the same counts, elapsed going
    on (the engine ticks every second), in the JSON log of a real process."""
    _, url = served_gateway
    source = tmp_path / "in.txt"
    source.write_text("a cat\n")
    done = subprocess.run(
        [
            *IMGGW,
            "--log-format",
            "json",
            "batch",
            str(source),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            url,
            "--progress-every",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=process_env(CANARY),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    running = [r for r in records if r["event"] == "batch_progress" and r["counts"]["running"]]
    assert len(running) >= 2, done.stderr  # nothing moved between them: said all the same
    assert len({json.dumps(r["counts"]) for r in running}) == 1
    elapsed = [r["elapsed"] for r in running]
    assert elapsed == sorted(elapsed)
    assert elapsed[0] < elapsed[-1]
    assert not any(r["event"] == "gateway_silent" for r in records)  # slow tasks: no silence


@pytest.mark.slow
def test_a_gateway_that_stops_answering_is_one_warning_then_one_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit's answer held on a real socket until the warning is out: one
    ``gateway_silent`` object, one ``gateway_answers`` after it, no line per request."""
    monkeypatch.setattr(_batch_run, "GATEWAY_SILENT", 0.3)  # a minute, shortened
    monkeypatch.setattr(_run, "PROGRESS_TICK", 0.05)
    gw = MockGateway(api_keys=[CANARY], duration_min=0.02, duration_max=0.05)
    source = tmp_path / "in.txt"
    source.write_text("a cat\n")
    with held_gateway(gw) as (holder, url):
        warn = Output.warn

        def warned(self: Output, text: str, *, event: str = "warning", **fields: Any) -> None:
            warn(self, text, event=event, **fields)
            if event == "gateway_silent":
                holder.release.set()  # the gateway answers once the silence was told

        monkeypatch.setattr(Output, "warn", warned)
        try:
            run = imggw(
                "--log-format",
                "json",
                "batch",
                str(source),
                "-o",
                str(tmp_path / "out"),
                "--base-url",
                url,
            )
        finally:
            _output.use(_output.TEXT)  # the command set it for this process
    assert run.code == 0, run.err
    events = [json.loads(line)["event"] for line in run.err.splitlines()]
    told = [event for event in events if event.startswith("gateway_")]
    assert told == ["gateway_silent", "gateway_answers"]
    assert holder.arrived.is_set()
