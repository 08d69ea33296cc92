"""Where a run works (``batch/_store.py``): what counts as a result kept whole, the saved
lines whose files are gone, leftovers of cut downloads, and the manifest and gallery a run
writes at its end (or now and then while it goes)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from imggw_client._files import StorageError
from imggw_client.batch import _store
from imggw_client.batch._gallery import GALLERY_NAME
from imggw_client.batch._ledger import STOPPED_BY
from imggw_client.batch._schema import LEDGER_NAME, SAVED, UNKNOWN, read_meta
from imggw_client.batch._store import GalleryPace, LocalStore, Workspace, file_sha256

from .ledgers import planned, row


def saved(folder: Path, line: int, content: bytes) -> dict[str, object]:
    (folder / f"{line}-0.png").write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    return {"path": f"{line}-0.png", "sha256": digest, "size": len(content)}


def test_a_result_is_whole_by_its_size_or_with_hashes_by_its_sha256(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    kept = saved(tmp_path, 1, b"\x89PNG one")
    name, size, digest = str(kept["path"]), int(kept["size"]), str(kept["sha256"])  # type: ignore[call-overload]
    assert store.is_whole(name, size, digest, hashes=True)
    (tmp_path / name).write_bytes(b"\x89PNG two")  # same size, other bytes
    assert store.is_whole(name, size, digest, hashes=False)
    assert not store.is_whole(name, size, digest, hashes=True)
    assert not store.is_whole("missing.png", size, digest, hashes=False)
    assert file_sha256(tmp_path / "missing.png") is None
    (tmp_path / "link.png").symlink_to(tmp_path / name)
    with pytest.raises(StorageError):  # a link where a result was is refused, never counted
        store.is_whole("link.png", size, digest, hashes=False)


def test_saved_lines_whose_files_are_gone_are_found_and_leftovers_swept(tmp_path: Path) -> None:
    whole = saved(tmp_path, 1, b"one")
    gone = saved(tmp_path, 2, b"two")
    (tmp_path / "2-0.png").unlink()
    (tmp_path / ".3-0.png.abc.part").write_bytes(b"cut short")
    (tmp_path / "keep.part").write_bytes(b"not ours")
    rows = [
        row(1, SAVED, task_id="1", files=[whole]),
        row(2, SAVED, task_id="2", files=[gone]),
        row(3, UNKNOWN),
    ]
    with planned(tmp_path, rows) as ledger:
        work = Workspace(tmp_path, ledger, None, LocalStore(tmp_path))  # type: ignore[arg-type]
        assert [r.line for r in work.damaged(hashes=False)] == [2]
        work.sweep_partial_files()
    assert not (tmp_path / ".3-0.png.abc.part").exists()
    assert (tmp_path / "keep.part").exists()


def test_a_ledger_entry_that_names_no_file_of_the_folder_is_downloaded_again(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"one")
    digest = hashlib.sha256(b"one").hexdigest()
    odd = [
        {"path": str(outside), "sha256": digest, "size": 3},  # a path elsewhere, whole there
        {"path": "../elsewhere.png", "sha256": digest, "size": 3},
        {"path": "3-0.png", "size": 3},  # no sha256: not an entry a run writes
    ]
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "3-0.png").write_bytes(b"one")
    rows = [row(n, SAVED, task_id=str(n), files=[entry]) for n, entry in enumerate(odd, 1)]
    with planned(folder, rows) as ledger:
        work = Workspace(folder, ledger, None, LocalStore(folder))  # type: ignore[arg-type]
        assert [r.line for r in work.damaged(hashes=False)] == [1, 2, 3]


def test_the_end_of_a_run_writes_its_manifest_gallery_and_what_stopped_it(tmp_path: Path) -> None:
    ended: list[Path] = []

    class Store(LocalStore):
        def finish(self, manifest: Path) -> None:
            ended.append(manifest)

    with planned(tmp_path, [row(1), row(2)]) as ledger:
        work = Workspace(tmp_path, ledger, None, Store(tmp_path), gallery="my run")  # type: ignore[arg-type]
        manifest = work.write_outputs("max_credits")
    assert ended == [manifest]
    assert [json.loads(line)["line"] for line in manifest.read_text().splitlines()] == [1, 2]
    assert "my run" in (tmp_path / GALLERY_NAME).read_text()
    assert read_meta(tmp_path / LEDGER_NAME, STOPPED_BY) == "max_credits"
    with planned(tmp_path, [row(1), row(2)]) as ledger:
        Workspace(tmp_path, ledger, None, LocalStore(tmp_path)).write_outputs(None)  # type: ignore[arg-type]
    assert read_meta(tmp_path / LEDGER_NAME, STOPPED_BY) is None  # a run not stopped clears it


@pytest.mark.anyio
async def test_the_gallery_is_rewritten_now_and_then_never_more_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(_store, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    with planned(tmp_path, [row(1)]) as ledger:
        work = Workspace(tmp_path, ledger, None, LocalStore(tmp_path), gallery="g")  # type: ignore[arg-type]
        pace = GalleryPace(work)
        await pace.maybe()
        assert not (tmp_path / GALLERY_NAME).exists()  # not yet: just begun
        clock[0] += _store.GALLERY_EVERY
        await pace.maybe()
        assert (tmp_path / GALLERY_NAME).exists()
        (tmp_path / GALLERY_NAME).unlink()
        clock[0] += 1.0
        await pace.maybe()
        assert not (tmp_path / GALLERY_NAME).exists()
        none = GalleryPace(Workspace(tmp_path, ledger, None, LocalStore(tmp_path)))  # type: ignore[arg-type]
        clock[0] += 3600.0
        await none.maybe()  # a run that writes no gallery
    assert not (tmp_path / GALLERY_NAME).exists()
