"""``imggw batch`` options that choose its mode: a plain run, one shard, a run on an engine. A
combination that would switch modes behind the user's back is refused (exit 2, one line), and
a missing Dask is a configuration matter (exit 4, what to install)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import imggw_client.batch
from imggw_cli._batch import BATCH_INTERRUPTED

from .helpers import imggw


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("a cat\na dog\n")
    return path


def test_scratch_with_a_local_folder_alone_is_refused(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = imggw("batch", str(source), "-o", str(out), "--scratch", str(tmp_path / "s"), "--mock")
    assert run.code == 2
    assert run.out == ""
    assert run.err == (
        "error: --scratch is for a remote DEST, --shard or --engine: a local DEST needs none\n"
    )
    assert not out.exists()  # no shard of one made: a later plain run finds nothing to redo


@pytest.mark.parametrize(
    "command", [["batch", "{source}", "-o", "", "--mock"], ["batch", "status", ""]]
)
def test_an_empty_dest_is_refused_not_taken_as_the_current_folder(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # `-o "$UNSET"` wrote the whole run here
    run = imggw(*(arg.format(source=source) for arg in command))
    assert run.code == 2
    assert run.out == ""
    assert "the output folder is empty: name a folder" in run.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_scratch_still_goes_with_shard(source: Path, tmp_path: Path) -> None:
    run = imggw(
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--shard",
        "1/1",
        "--scratch",
        str(tmp_path / "s"),
        "--mock",
        "-q",
    )
    assert run.code == 0, run.err


def test_standard_input_to_a_remote_folder_says_it_cannot_be_sharded() -> None:
    run = imggw("batch", "-", "-o", "memory://imggw-cli-stdin", "--mock", stdin="a cat\n")
    assert run.code == 2
    assert run.out == ""
    assert "No such file" not in run.err
    assert run.err == (
        "error: standard input cannot be sharded (a remote DEST, --shard and --engine run "
        "shards): give FILE, not -\n"
    )


def test_without_dask_the_engine_exits_4_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, source: Path, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the extra were not installed
    # Every module of the Dask engine imports it (the driver, its dispatch, its budget): none
    # may be left imported. An imported submodule is also an attribute of its package: gone
    # too, as never imported.
    for name in [n for n in sys.modules if n.startswith("imggw_client.batch.scale._dask")]:
        monkeypatch.delitem(sys.modules, name)
        monkeypatch.delattr(imggw_client.batch, name.rpartition(".")[2], raising=False)
    run = imggw(
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--engine",
        "dask",
        "--workers",
        "1",
        "--base-url",
        "http://127.0.0.1:9",
    )
    assert run.code == 4
    assert run.out == ""
    assert run.err == "error: --engine dask needs Dask: pip install 'imggw[dask]'\n"


def test_another_missing_module_is_not_taken_for_a_missing_dask(
    monkeypatch: pytest.MonkeyPatch, source: Path, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "imggw_client.batch.scale._dask", None)
    run = imggw(
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--engine",
        "dask",
        "--workers",
        "1",
        "--base-url",
        "http://127.0.0.1:9",
    )
    assert isinstance(run.exception, ModuleNotFoundError)
    assert "imggw[dask]" not in run.err


@pytest.mark.parametrize("size", [None, "5"])
def test_the_engine_gets_the_environments_base_url_and_only_a_given_shard_size(
    monkeypatch: pytest.MonkeyPatch, source: Path, tmp_path: Path, size: str | None
) -> None:
    from imggw_client.batch.scale import _dask

    seen: dict[str, Any] = {}

    async def arun_sharded(source: str, dest: str, **options: Any) -> Any:
        seen.update(options)
        raise KeyboardInterrupt  # the run ends here: what it was given is what counts

    monkeypatch.setattr(_dask, "arun_sharded", arun_sharded)
    sizing = [] if size is None else ["--shard-size", size]
    run = imggw(
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--engine",
        "dask",
        "--address",
        "tcp://127.0.0.1:9",
        *sizing,
        env={"IMGGW_BASE_URL": "http://gateway.invalid:8080"},
    )
    assert run.code == 130
    assert run.err.splitlines()[-1] == f"error: {BATCH_INTERRUPTED}"
    assert seen["client"].base_url == "http://gateway.invalid:8080"
    if size is None:
        assert "shard_size" not in seen  # the engine's own default applies
        assert f"shards of {_dask.DEFAULT_SHARD_SIZE} lines" in run.err
    else:
        assert seen["shard_size"] == 5
