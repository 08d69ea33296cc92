"""Shards with no engine (``--shard I/N``): cut the same way by every process, one run id for
a folder however many start at once, results and manifests in a local or remote (fsspec)
folder, keys that replay after every ledger is lost, changed input refused without consent."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from imggw_cli._app import app
from imggw_client import RequestValidationError
from imggw_client._journal.schema import RUN_NAME
from imggw_client.batch import (
    BatchOptions,
    InputChangedError,
    StorageError,
    merge,
    parse_shard,
    run_shard,
    shard_range,
    status,
)
from imggw_client.batch._identity import RunIdentity, claim
from imggw_client.batch._plan import Scan, scan_input
from imggw_client.batch.scale._storage import open_storage
from imggw_client.mock import MockGateway

from .conftest import FAST, KEY, check_from_storage, local_env, write_prompts

IMGGW = [sys.executable, "-m", "imggw_cli"]

pytestmark = pytest.mark.gateway(api_keys=[KEY], duration_min=0.02, duration_max=0.05)


def shard(
    gw: MockGateway, source: Path, dest: str | Path, index: int, count: int, **kw: Any
) -> Any:
    return run_shard(
        source, dest, index=index, count=count, client_factory=lambda: gw.async_client(**FAST), **kw
    )


def test_shards_are_contiguous_ranges_that_cover_the_input() -> None:
    for total in (0, 1, 7, 10, 1001):
        for count in (1, 2, 3, 7):
            ranges = [shard_range(i, count, total) for i in range(1, count + 1)]
            assert [n for r in ranges for n in r] == list(range(1, total + 1))
    assert parse_shard(" 2/4 ") == (2, 4)
    for bad in ("0/3", "4/3", "x", "1/0", "2"):
        with pytest.raises(ValueError, match="I/N"):
            parse_shard(bad)


def test_concurrent_first_runs_agree_on_one_run_id(tmp_path: Path) -> None:
    storage = open_storage(tmp_path / "out")
    source = write_prompts(tmp_path / "in.jsonl", 5)
    won: list[tuple[RunIdentity, bool]] = []
    start = threading.Barrier(6)

    def racer(i: int) -> None:
        work = tmp_path / f"w{i}"
        work.mkdir()
        scan: Scan = scan_input(
            str(source), work, surface="beta", record=None, options=BatchOptions()
        )
        start.wait()
        # Each racer derives its own id here: which one wins must not matter to the others.
        won.append(
            claim(storage, scan.digests, scan.plan.input_digest, run_id=f"run-{i}", surface="beta")
        )

    racers = [threading.Thread(target=racer, args=(i,)) for i in range(6)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(timeout=30)
    assert sum(created for _, created in won) == 1
    assert len({identity.run_id for identity, _ in won}) == 1
    assert json.loads((tmp_path / "out" / RUN_NAME).read_text())["run_id"] == won[0][0].run_id


@pytest.mark.slow
@pytest.mark.gateway(
    api_keys=[KEY],
    seed=5,
    duration_min=0.1,
    duration_max=0.4,
    fault_rate=0.1,
    faults=["lost", "reset", "503"],
    retry_after=0,
)
def test_three_shard_processes_at_once_then_merge_give_the_full_manifest(
    gateway_process: str, tmp_path: Path
) -> None:
    url, lines = gateway_process, 30
    source = write_prompts(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out"
    base = [*IMGGW, "batch", str(source), "-o", str(out), "--base-url", url, "-q", "-c", "4"]
    children = [
        subprocess.Popen(
            [*base, "--shard", f"{i}/3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=local_env(),
        )
        for i in (1, 2, 3)
    ]
    for child in children:
        stdout, stderr = child.communicate(timeout=90)
        assert child.returncode == 0, stderr[-2000:]
        assert stdout.strip().endswith("manifest.jsonl")
    merged = subprocess.run(
        [*IMGGW, "--json", "batch", "merge", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        env=local_env(),
        check=False,
    )
    assert merged.returncode == 0, merged.stderr
    records = [json.loads(line) for line in merged.stdout.splitlines()]
    assert records == check_from_storage(str(out), None, lines)
    assert [r["prompt"] for r in records] == [f"image {i}" for i in range(lines)]
    stats = httpx.get(f"{url}/_mock/stats").json()
    assert stats["tasks_created"] == lines  # one run id, one key a line: billed once each
    assert (out / "index.html").is_file()
    for i in (1, 2, 3):
        assert (out / "shards" / f"000{i}-of-0003" / "manifest.jsonl").is_file()


# Every answer is lost: the gateway makes each task, the shards never learn their ids.
@pytest.mark.slow
@pytest.mark.gateway(fault_rate=1.0, faults=["lost"])
def test_every_sqlite_file_deleted_mid_run_and_a_rerun_creates_no_new_task(
    gateway: MockGateway,
    tmp_path: Path,
) -> None:
    source = write_prompts(tmp_path / "in.jsonl", 8)
    out = tmp_path / "out"
    for i in (1, 2):
        assert shard(gateway, source, out, i, 2, timeout=0.4).exit_code == 3
    assert gateway.stats()["tasks_created"] == 8
    doomed = [p for p in out.rglob("*") if ".sqlite" in p.name]
    assert len(doomed) >= 2
    for path in doomed:
        path.unlink()
    gateway.configure(fault_rate=0.0)
    for i in (1, 2):
        assert shard(gateway, source, out, i, 2).exit_code == 0
    assert gateway.stats()["tasks_created"] == 8  # the same keys, derived again: all replays
    assert merge(out).exit_code == 0
    check_from_storage(str(out), None, 8)


@pytest.mark.slow
@pytest.mark.gateway(duration_max=0.1)
def test_memory_storage_results_uploaded_checkpointed_and_merged(
    gateway: MockGateway, tmp_path: Path
) -> None:
    import fsspec

    source = write_prompts(tmp_path / "in.jsonl", 9)
    dest = "memory://imggw-shards-test"
    scratch = tmp_path / "scratch"
    for i in (1, 2, 3):
        report = shard(gateway, source, dest, i, 3, scratch=scratch)
        assert report.exit_code == 0
        assert report.lines == shard_range(i, 3, 9)
    st = status(dest)
    assert (st.total, st.counts["succeeded"], st.exit_code) == (9, 9, 0)
    assert merge(dest).exit_code == 0
    check_from_storage(dest, None, 9)
    fs = fsspec.filesystem("memory")
    for i in (1, 2, 3):  # each shard's ledger checkpointed, its manifest written
        assert fs.exists(f"/imggw-shards-test/shards/000{i}-of-0003/ledger.sqlite")
        assert fs.exists(f"/imggw-shards-test/shards/000{i}-of-0003/manifest.jsonl")
    assert fs.exists("/imggw-shards-test/index.html")
    assert not list(scratch.rglob("*.png"))  # local copies gone once uploaded
    # Resuming with every file checked by sha256 in storage: nothing to redo, nothing billed.
    assert shard(gateway, source, dest, 2, 3, scratch=scratch, verify=True).exit_code == 0
    assert gateway.stats()["tasks_created"] == 9
    fs.rm("/imggw-shards-test", recursive=True)


@pytest.mark.slow
def test_a_changed_input_is_refused_without_allow_changes_and_run_with_it(
    gateway: MockGateway,
    tmp_path: Path,
) -> None:
    source = write_prompts(tmp_path / "in.jsonl", 6)
    out = tmp_path / "out"
    for i in (1, 2):
        assert shard(gateway, source, out, i, 2).exit_code == 0
    assert gateway.stats()["tasks_created"] == 6
    lines = source.read_text().splitlines()
    lines[1] = json.dumps({"prompt": "an edited line", "aspect_ratio": "3:2"})
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputChangedError) as refused:
        shard(gateway, source, out, 1, 2)
    assert refused.value.lines == [2]
    assert gateway.stats()["tasks_created"] == 6  # nothing was sent
    assert shard(gateway, source, out, 2, 2).exit_code == 0  # its range did not change
    report = shard(gateway, source, out, 1, 2, allow_changes=True)
    assert (report.exit_code, report.changed_lines) == (0, [2])
    assert gateway.stats()["tasks_created"] == 7  # the changed line, a new request
    assert shard(gateway, source, out, 1, 2).exit_code == 0  # accepted now: no flag needed
    assert gateway.stats()["tasks_created"] == 7
    records = check_from_storage(str(merge(out).manifest).rsplit("/", 1)[0], None, 6)
    assert records[1]["prompt"] == "an edited line"


def test_a_shard_on_a_fresh_folder_records_the_runs_name_and_input(
    gateway: MockGateway, tmp_path: Path
) -> None:
    # As a single run does: a rerun and `batch status`'s resume hint go by them.
    source = write_prompts(tmp_path / "in.jsonl", 4)
    out = tmp_path / "out"
    assert shard(gateway, source, out, 1, 2, name="img-{line}").exit_code == 0
    recorded = json.loads((out / RUN_NAME).read_text())
    assert (recorded["name"], recorded["input"]) == ("img-{line}", str(source))
    assert shard(gateway, source, out, 2, 2, name="img-{line}").exit_code == 0
    assert json.loads((out / RUN_NAME).read_text()) == recorded
    saved = sorted(p.name for p in out.rglob("*.png"))
    assert saved == [f"img-{line}.png" for line in range(1, 5)]


def test_batch_status_json_reads_progress_from_the_folder_alone(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ["a", "b", "c #fail", "d", "e", "f"])
    )
    out = tmp_path / "out"
    assert shard(gateway, source, out, 1, 3).exit_code == 0  # lines 1-2
    assert shard(gateway, source, out, 2, 3).exit_code == 1  # lines 3-4, one failed
    result = CliRunner().invoke(app, ["batch", "status", str(out), "--json"])
    assert result.exit_code == 3, result.output  # shard 3 has not run: unfinished
    (line,) = result.stdout.splitlines()
    record = json.loads(line)
    assert record["total"] == 6
    assert record["counts"] == {"pending": 2, "running": 0, "succeeded": 3, "failed": 1}
    assert [s["shard"] for s in record["shards"]] == ["0001-of-0003", "0002-of-0003"]
    human = CliRunner().invoke(app, ["batch", "status", str(out)])
    assert "6 lines: 2 pending, 0 running, 3 succeeded, 1 failed" in human.stdout
    missing = CliRunner().invoke(app, ["batch", "status", str(tmp_path / "nothing")])
    assert missing.exit_code == 2


@pytest.mark.parametrize("damage", ["{not json", '{"line": 1, "task_id": "7", "sta', "[" * 5000])
def test_a_damaged_shard_manifest_is_one_clear_error_naming_it(
    gateway: MockGateway, tmp_path: Path, damage: str
) -> None:
    source = write_prompts(tmp_path / "in.jsonl", 2)
    out = tmp_path / "out"
    assert shard(gateway, source, out, 1, 1).exit_code == 0
    manifest = out / "shards" / "0001-of-0001" / "manifest.jsonl"
    manifest.write_text(manifest.read_text() + damage + "\n")
    for read in (status, merge):
        with pytest.raises(StorageError, match=r"0001-of-0001/manifest\.jsonl is damaged"):
            read(out)
    result = CliRunner().invoke(app, ["batch", "status", str(out)])
    assert result.exit_code == 4
    assert "Traceback" not in result.output
    manifest.unlink()  # as the message says: the same command writes it again
    assert shard(gateway, source, out, 1, 1).exit_code == 0
    assert status(out).counts["succeeded"] == 2
    assert gateway.stats()["tasks_created"] == 2


def test_a_remote_folders_backend_failure_is_a_storage_error(
    gateway: MockGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec.implementations.memory as memory

    class NoCredentials(Exception):  # what a cloud library raises: not an OSError
        pass

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise NoCredentials("Unable to locate credentials")

    monkeypatch.setattr(memory.MemoryFileSystem, "cat_file", refuse)
    with pytest.raises(StorageError, match=r"cannot read memory://imggw-no-creds/run\.json"):
        shard(
            gateway,
            write_prompts(tmp_path / "in.jsonl", 1),
            "memory://imggw-no-creds",
            1,
            1,
            scratch=tmp_path / "scratch",
        )
    assert gateway.stats()["tasks_created"] == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("workers", 0),
        ("workers", True),
        ("shard_retries", -1),
        ("shard_size", 0),
        ("checkpoint_every", 0),
        ("checkpoint_every", -1.0),
        ("checkpoint_every", math.nan),
    ],
)
def test_sharded_run_options_are_checked_before_anything_starts(
    tmp_path: Path, option: str, value: object
) -> None:
    from imggw_client.batch import run_sharded

    source = write_prompts(tmp_path / "in.jsonl", 2)
    where = {"workers": 1} if option != "workers" else {}
    with pytest.raises(RequestValidationError, match=option):
        run_sharded(source, tmp_path / "out", **where, **{option: value})  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_the_driver_slices_the_input_it_checked_not_a_later_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imggw_client.batch.scale import _dask

    source = write_prompts(tmp_path / "in.jsonl", 4)
    checked = source.read_text()
    scan = _dask.scan_input

    def scan_then_edit(*args: Any, **kwargs: Any) -> Any:
        found = scan(*args, **kwargs)
        source.write_text(checked.replace("image 2", "an unchecked edit"))  # meanwhile
        return found

    monkeypatch.setattr(_dask, "scan_input", scan_then_edit)
    storage = open_storage(tmp_path / "out")
    work = tmp_path / "work"
    work.mkdir()
    prepared = _dask._prepare(
        str(source),
        storage,
        work,
        surface="beta",
        shard_size=2,
        options=BatchOptions(),
        run_id=lambda: "run-1",
        with_entries=False,
    )
    assert prepared.count == 2
    sliced = "".join(p.read_text() for p in sorted((tmp_path / "out").glob("shards/*/*.jsonl")))
    assert sliced == checked


def test_shard_options_that_do_not_go_together_are_refused(tmp_path: Path) -> None:
    source = write_prompts(tmp_path / "in.jsonl", 2)
    runner = CliRunner()
    for extra, says in [
        (["--shard", "1/2", "--engine", "dask", "--workers", "1"], "not both"),
        (["--workers", "2"], "go with --engine dask"),
        (["--engine", "dask"], "--address"),
        (["--shard", "3/2"], "I/N"),
    ]:
        result = runner.invoke(
            app,
            ["batch", str(source), "-o", str(tmp_path / "o"), *extra],
            env={"IMGGW_API_KEY": KEY},
        )
        assert result.exit_code == 2, (extra, result.output)
        assert says in result.stderr, (extra, result.stderr)
    piped = runner.invoke(
        app,
        ["batch", "-", "-o", str(tmp_path / "o"), "--shard", "1/2"],
        env={"IMGGW_API_KEY": KEY},
        input="a cat\n",
    )
    assert piped.exit_code == 2
    assert "standard input" in piped.stderr


@pytest.mark.slow
def test_the_sdk_and_the_single_machine_cli_never_import_dask(tmp_path: Path) -> None:
    code = (
        "import sys, json\n"
        "import imggw_client, imggw_client.batch, imggw_cli._app\n"
        "from imggw_client.batch import run_batch, run_shard, merge, status\n"
        "from imggw_client.mock import MockGateway\n"
        "gw = MockGateway(duration_min=0.01, duration_max=0.02)\n"
        f"src = {str(tmp_path / 'in.txt')!r}\n"
        "open(src, 'w').write('a cat\\na dog\\n')\n"
        f"run_batch(src, {str(tmp_path / 'one')!r}, client_factory=gw.async_client)\n"
        f"run_shard(src, {str(tmp_path / 'two')!r}, index=1, count=1,"
        " client_factory=gw.async_client)\n"
        f"merge({str(tmp_path / 'two')!r}); status({str(tmp_path / 'two')!r})\n"
        "bad = {'dask', 'distributed', 'fsspec'} & set(sys.modules)\n"
        "sys.exit(json.dumps(sorted(bad)) if bad else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
