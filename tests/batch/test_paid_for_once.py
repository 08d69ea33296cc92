"""Paid for, never lost: a re-created folder replays its tasks, input read as what it is, a
wrong base URL that stops the run instead of failing its lines, manifests that pipe into a
collect, reports that name what really changed, one word per line state, and a ledger that
leaves no trace where nothing ran and keeps its log small. Over loopback against the reference
gateway, through the command line where it is the user's way in."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from imggw_client import AsyncClient, PollPolicy, RetryPolicy
from imggw_client._journal.schema import RUN_NAME
from imggw_client.batch import (
    LEDGER_NAME,
    BatchInputError,
    BatchReport,
    InputChangedError,
    run_batch,
    run_shard,
)
from imggw_client.batch._identity import derive_run_id, idempotency_key
from imggw_client.batch._ledger import Ledger
from imggw_client.batch.scale._storage import destination_name
from imggw_client.mock import MockGateway

from ..cli.helpers import CANARY, imggw, imggw_batch

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}


pytestmark = pytest.mark.gateway(
    api_keys=[CANARY, "sk-second-key-0077"], duration_min=0.02, duration_max=0.08
)


def prompts(path: Path, count: int) -> Path:
    path.write_text("".join(f"prompt {i}\n" for i in range(count)))
    return path


def manifest(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]


def requests(gw: MockGateway) -> int:
    return sum(gw.stats()["requests"].values())


def batch(gw: MockGateway, source: Any, out: Path, **kw: Any) -> BatchReport:
    return run_batch(source, out, client_factory=lambda: gw.async_client(**FAST), **kw)


# ---------------------------------------------------------------------------- 4: lost folders


@pytest.mark.slow
def test_a_rerun_on_a_deleted_and_recreated_folder_replays_every_task(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 20)
    out = tmp_path / "out"
    first = imggw_batch(source, out, gateway_url, "-q")
    assert first.code == 0, first.err
    assert gateway.stats()["tasks_created"] == 20
    shutil.rmtree(out)  # the disk is lost: run id, ledger, images, everything
    again = imggw_batch(source, out, gateway_url, "-q")
    assert again.code == 0, again.err
    assert gateway.stats()["tasks_created"] == 20  # the same keys: the gateway replayed them all
    assert gateway.stats()["replays"] >= 20
    assert len(list(out.glob("*.png"))) == 20


@pytest.mark.slow
def test_the_run_id_follows_from_folder_gateway_and_key_and_the_key_is_never_kept(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 3)
    out = tmp_path / "out"
    assert batch(gateway, source, out).exit_code == 0
    with gateway.client() as client:
        base_url, fingerprint = client.base_url, client.key_fingerprint
    run_id = json.loads((out / RUN_NAME).read_text())["run_id"]
    assert run_id == derive_run_id(destination_name(out), base_url, fingerprint)
    # The key is written nowhere; its (slow) fingerprint only in run.json, which tells a run
    # made with another key (DESIGN 18).
    assert json.loads((out / RUN_NAME).read_text())["key_fingerprint"] == fingerprint
    for path in out.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert CANARY.encode() not in data
            assert path.name == RUN_NAME or fingerprint.encode() not in data
    with Ledger.open(out) as ledger:
        keys = [row.idempotency_key for row in ledger.iter_rows()]
    shutil.rmtree(out)
    other = run_batch(
        source,
        out,
        client_factory=lambda: gateway.async_client(api_key="sk-second-key-0077", **FAST),
    )
    assert other.exit_code == 0
    assert gateway.stats()["tasks_created"] == 6  # another key: another run, its own tasks
    with Ledger.open(out) as ledger:
        assert not {row.idempotency_key for row in ledger.iter_rows()} & set(keys)
    assert batch(gateway, source, tmp_path / "elsewhere").exit_code == 0  # another folder too
    assert gateway.stats()["tasks_created"] == 9


def test_an_existing_run_json_keeps_its_id(gateway: MockGateway, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / RUN_NAME).write_text(json.dumps({"format": 1, "run_id": "an-older-random-id"}))
    report = batch(gateway, prompts(tmp_path / "in.txt", 2), out)
    assert report.exit_code == 0
    assert json.loads((out / RUN_NAME).read_text())["run_id"] == "an-older-random-id"
    with Ledger.open(out) as ledger:
        for row in ledger.iter_rows():
            expected = idempotency_key("an-older-random-id", row.identity, row.digest)
            assert row.idempotency_key == expected


@pytest.mark.slow
def test_new_run_makes_new_keys_and_is_refused_where_a_run_is_kept(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 3)
    out = tmp_path / "out"
    assert imggw_batch(source, out, gateway_url, "-q").code == 0
    sent = requests(gateway)
    refused = imggw_batch(source, out, gateway_url, "--new-run")
    assert refused.code == 2
    assert refused.err.count("\n") == 1
    assert "use another folder" in refused.err
    assert requests(gateway) == sent
    shutil.rmtree(out)
    fresh = imggw_batch(source, out, gateway_url, "--new-run", "-q")
    assert fresh.code == 0, fresh.err
    assert gateway.stats()["tasks_created"] == 6  # asked for: a new run, billed anew


@pytest.mark.slow
def test_shards_on_a_recreated_folder_replay_their_tasks(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(6)))
    out = tmp_path / "out"

    def shards() -> None:
        for index in (1, 2):
            report = run_shard(
                source,
                out,
                index=index,
                count=2,
                client_factory=lambda: gateway.async_client(**FAST),
            )
            assert report.exit_code == 0

    shards()
    assert gateway.stats()["tasks_created"] == 6
    shutil.rmtree(out)
    shards()
    assert gateway.stats()["tasks_created"] == 6


# ---------------------------------------------------------------------------- 5: the format


@pytest.mark.slow
def test_a_jsonl_file_named_json_is_read_as_jsonl(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "p.json"
    source.write_text(
        '{"prompt": "a dog", "id": "d1", "aspect_ratio": "16:9"}\n{"prompt": "a cat", "id": "c1"}\n'
    )
    run = imggw(
        "batch", str(source), "-o", str(tmp_path / "out"), "--base-url", gateway_url, "--json"
    )
    assert run.code == 0, run.err
    records = run.records()
    assert [(r["prompt"], r["id"], r["aspect_ratio"]) for r in records] == [
        ("a dog", "d1", "16:9"),
        ("a cat", "c1", "auto"),
    ]


@pytest.mark.slow
def test_a_text_file_of_json_objects_is_refused_before_anything_is_paid(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "p.txt"
    source.write_text('{"prompt": "a dog", "aspect_ratio": "16:9"}\n# a note\n{"prompt": "x"}\n')
    out = tmp_path / "out"
    refused = imggw_batch(source, out, gateway_url)
    assert refused.code == 2
    assert refused.err.count("\n") == 1
    assert "--format jsonl" in refused.err
    assert gateway.stats()["requests"] == {}
    run = imggw_batch(
        source,
        out,
        gateway_url,
        "--format",
        "jsonl",
        "--json",
    )
    assert run.code == 0, run.err
    assert [(r["prompt"], r["aspect_ratio"]) for r in run.records()] == [
        ("a dog", "16:9"),
        ("x", "auto"),
    ]


@pytest.mark.slow
def test_text_prompts_on_standard_input_may_begin_with_a_quote_or_a_bracket(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    piped = '"Hello," said the fox\n[cinematic] a fox\n{"prompt": "a cat", "id": "c"}\n'
    run = imggw(
        "batch", "-", "-o", str(tmp_path / "out"), "--base-url", gateway_url, "--json", stdin=piped
    )
    assert run.code == 0, run.err
    assert [r["prompt"] for r in run.records()] == [
        '"Hello," said the fox',
        "[cinematic] a fox",
        "a cat",
    ]
    declared = imggw(
        "batch",
        "-",
        "-o",
        str(tmp_path / "jsonl"),
        "--base-url",
        gateway_url,
        "--format",
        "jsonl",
        stdin=piped,
    )
    assert declared.code == 2  # declared JSONL: a line that is not JSON is a mistake
    assert "line 1: not a JSON object" in declared.err
    assert gateway.stats()["tasks_created"] == 3


# ---------------------------------------------------------------------------- 6: a wrong URL


@pytest.mark.slow
def test_a_submit_answered_404_stops_the_run_and_the_right_url_resumes_every_line(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "three.txt", 3)
    out = tmp_path / "out"
    wrong = imggw("--base-url", f"{gateway_url}/api", "batch", str(source), "-o", str(out), "-q")
    assert wrong.code == 4
    assert wrong.err.count("\n") == 1
    assert f"{gateway_url}/api" in wrong.err
    assert gateway.stats()["tasks_created"] == 0
    assert {r["status"] for r in manifest(out)} == {"pending"}
    with Ledger.open(out) as ledger:
        assert {(row.state, row.error_code) for row in ledger.iter_rows()} == {("unknown", None)}
    right = imggw("--base-url", gateway_url, "batch", str(source), "-o", str(out), "-q")
    assert right.code == 0, right.err
    assert gateway.stats()["tasks_created"] == 3
    assert {r["status"] for r in manifest(out)} == {"succeeded"}


def test_lines_an_older_version_failed_on_a_404_submit_are_submitted_again(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "three.txt", 3)
    out = tmp_path / "out"
    assert batch(gateway, source, out, timeout=0).counts == {"pending": 3}
    with closing(sqlite3.connect(out / LEDGER_NAME)) as db, db:
        db.execute(
            "UPDATE tasks SET state='failed', error_code='not_found', "
            "error_message='No such route.'"
        )
    report = batch(gateway, source, out)
    assert report.counts == {"saved": 3}
    assert gateway.stats()["tasks_created"] == 3


# ---------------------------------------------------------------------------- 10: manifests


@pytest.mark.slow
def test_a_manifest_with_skipped_bad_lines_pipes_into_a_collect(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a cat"}\nnot json\n{"prompt": "a dog"}\n')
    out = tmp_path / "out"
    first = imggw_batch(source, out, gateway_url, "--skip-bad-lines", "-q")
    assert first.code == 1
    assert manifest(out)[1]["task_id"] is None
    collected = imggw(
        "download",
        "--from",
        str(out / "manifest.jsonl"),
        "--wait",
        "-o",
        str(tmp_path / "again"),
        "--base-url",
        gateway_url,
        "-q",
    )
    assert collected.code == 0, collected.err
    records = manifest(tmp_path / "again")
    assert [(r["line"], r["status"]) for r in records] == [(1, "succeeded"), (3, "succeeded")]
    assert gateway.stats()["tasks_created"] == 2


# ---------------------------------------------------------------------------- 12: reports


def test_bad_lines_are_named_up_to_ten_and_all_listed_in_a_file(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"prompt": "p{i}", "colour": "red"}}\n' for i in range(25)))
    out = tmp_path / "out"
    with pytest.raises(BatchInputError) as info:
        batch(gateway, source, out)
    message = info.value.message
    assert message.startswith("25 bad lines: line 1: unknown field 'colour'; line 2: ")
    assert "line 10: unknown field" in message
    assert "line 11:" not in message
    assert f"all 25 are listed in {out / 'bad-lines.txt'}" in message
    listed = (out / "bad-lines.txt").read_text().splitlines()
    assert listed == [f"line {n}: unknown field 'colour'" for n in range(1, 26)]
    assert gateway.stats()["requests"] == {}


def test_a_repeated_json_key_is_named_as_such(gateway: MockGateway, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a cat"}\n{"prompt": "a", "prompt": "b"}\n')
    with pytest.raises(BatchInputError, match=r"^line 2: repeated key 'prompt'; nothing was sent"):
        batch(gateway, source, tmp_path / "out")


@pytest.mark.slow
def test_a_changed_input_names_only_the_lines_that_changed(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"

    def write(ids: list[str]) -> None:
        source.write_text("".join(json.dumps({"id": i, "prompt": f"p {i}"}) + "\n" for i in ids))

    ids = [f"i{n}" for n in range(1, 101)]
    write(ids)
    out = tmp_path / "out"
    assert imggw_batch(source, out, gateway_url, "-q").code == 0
    edited = [*ids[:2], "new", *ids[2:50], *ids[51:]]  # one inserted at 3, i51 (line 51) gone
    write(edited)
    refused = imggw_batch(source, out, gateway_url)
    assert refused.code == 2
    assert "1 line(s) new or changed: 3;" in refused.err
    assert "1 line(s) removed, as the run's input numbered them: 51" in refused.err
    run = imggw_batch(source, out, gateway_url, "--allow-changes")
    assert run.code == 0, run.err
    assert "submitted as new requests: 3\n" in run.err
    assert "nothing sent: 51\n" in run.err
    assert gateway.stats()["tasks_created"] == 101


@pytest.mark.slow
def test_a_rerun_on_another_surface_is_reported_as_a_change_of_surface(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 5)
    out = tmp_path / "out"
    assert imggw_batch(source, out, gateway_url, "-q").code == 0
    sent = requests(gateway)
    moved = imggw_batch(source, out, gateway_url, "--surface", "alpha")
    assert moved.code == 2
    assert "this folder's run was made on surface beta, and this run is on alpha" in moved.err
    assert "--surface beta" in moved.err
    assert "5 line" not in moved.err
    assert requests(gateway) == sent
    run_json = out / RUN_NAME  # a run.json of an older imggw: the ledger tells the surface
    record = json.loads(run_json.read_text())
    del record["surface"]
    run_json.write_text(json.dumps(record))
    with pytest.raises(InputChangedError) as info:
        run_batch(
            source,
            out,
            surface="alpha",
            client_factory=lambda: AsyncClient(api_key=CANARY, base_url=gateway_url, **FAST),
        )
    assert (info.value.surface_was, info.value.surface) == ("beta", "alpha")
    assert requests(gateway) == sent


# ---------------------------------------------------------------------------- 13: words


@pytest.mark.slow
@pytest.mark.gateway(api_keys=[CANARY], duration_min=0.02, duration_max=0.05, retention=0.0)
def test_an_expired_line_is_failed_in_the_manifest_and_apart_in_the_status(
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
) -> None:
    _, url = served_gateway
    source = prompts(tmp_path / "in.txt", 1)
    out = tmp_path / "out"
    run = imggw_batch(source, out, url)
    assert run.code == 1
    (record,) = manifest(out)
    assert (record["status"], record["error"]["code"]) == ("failed", "result_expired")
    status = imggw("batch", "status", str(out), "--json")
    assert status.code == 1  # expired alone exits as a failure does
    # batch status counts it apart from failures, as the gallery does (DESIGN 21).
    (counted,) = status.records()
    assert counted["counts"] == {"pending": 0, "running": 0, "succeeded": 0, "failed": 0}
    assert counted["expired"] == 1
    assert "batch: 1/1 finished (failed 1)" in run.err
    assert "failed (1 of them: results expired)" in run.err
    assert "done" not in run.err
    assert "expired before download" not in run.err


@pytest.mark.slow
def test_the_progress_line_says_succeeded_for_saved_lines_and_never_done(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    run = imggw(
        "batch",
        str(prompts(tmp_path / "in.txt", 3)),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        gateway_url,
    )
    assert run.code == 0, run.err
    assert "batch: 3/3 finished (succeeded 3)" in run.err
    assert "done" not in run.err


@pytest.mark.slow
def test_files_deleted_after_the_gateway_forgot_them_are_not_called_expired_before_download(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 2)
    out = tmp_path / "out"
    assert imggw_batch(source, out, gateway_url, "-q").code == 0
    for png in out.glob("*.png"):
        png.unlink()
    gateway.reset()  # the gateway's retention is over: tasks and files forgotten
    run = imggw_batch(source, out, gateway_url)
    assert run.code == 1
    assert "expired before download" not in run.err
    for record in manifest(out):
        assert record["status"] == "failed"
        assert record["error"]["message"].startswith("the files saved earlier are gone")


@pytest.mark.slow
def test_a_cost_the_gateway_does_not_state_is_unknown_not_zero(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", 2)
    run = imggw(
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        gateway_url,
        "--surface",
        "alpha",
    )
    assert run.code == 0, run.err
    # Nothing charged yet costs 0; two lines charged credits with no cost stated: unknown.
    last = next(line for line in run.err.splitlines() if line.startswith("batch: 2/2"))
    # (The learned durations, if any, follow the spending.)
    assert last.split("; tasks take about")[0].endswith("; credits 8, cost unknown")
    summary = [line for line in run.err.splitlines() if "│ cost" in line]
    assert len(summary) == 1
    assert "unknown" in summary[0]
    report = run_batch(
        source,
        tmp_path / "api",
        surface="alpha",
        client_factory=lambda: AsyncClient(api_key=CANARY, base_url=gateway_url, **FAST),
    )
    assert (report.credits, report.cost_unknown) == (8.0, 2)


# ---------------------------------------------------------------------------- 14: leftovers


def test_a_refused_input_leaves_no_ledger_and_no_folder(
    gateway: MockGateway, gateway_url: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": ""}\n')
    out = tmp_path / "out"
    refused = imggw_batch(bad, out, gateway_url)
    assert refused.code == 2
    assert not out.exists()
    kept = tmp_path / "kept"  # a folder that was there stays, with no ledger in it
    kept.mkdir()
    assert imggw_batch(bad, kept, gateway_url).code == 2
    assert not (kept / LEDGER_NAME).exists()
    assert gateway.stats()["requests"] == {}


WAL_BOUND = 1 << 20  # bytes


@pytest.mark.slow
@pytest.mark.gateway(duration_min=0.01, duration_max=0.03)
def test_the_ledger_log_stays_small_while_a_run_goes(gateway: MockGateway, tmp_path: Path) -> None:
    source = prompts(tmp_path / "in.txt", 400)
    out = tmp_path / "out"
    wal = out / f"{LEDGER_NAME}-wal"
    largest = [0]
    stop = threading.Event()

    def look(_: object = None) -> None:
        with contextlib.suppress(OSError):  # not made yet, or gone with the last connection
            largest[0] = max(largest[0], wal.stat().st_size)

    def watch() -> None:
        while not stop.wait(0.005):
            look()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        report = batch(gateway, source, out, concurrency=16, on_progress=look)
    finally:
        stop.set()
        watcher.join()
    assert report.counts == {"saved": 400}
    assert 0 < largest[0] < WAL_BOUND, largest[0]
