"""A sharded run's output folder (``batch/scale/_storage.py``): the same small interface on a local
path and on an fsspec URL, every file whole or not at all, and the first writer of a file the
only one."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest

from imggw_client._files import StorageError
from imggw_client.batch.scale._storage import Storage, destination_name, is_url, open_storage


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_storage(tmp_path / "out")
    return open_storage(f"memory://imggw-storage-{secrets.token_hex(4)}")


def test_files_are_written_read_listed_and_measured_alike(storage: Storage, tmp_path: Path) -> None:
    assert storage.read("run.json") is None
    assert storage.size("run.json") is None
    storage.write("shards/0001-of-0002/manifest.jsonl", b"{}\n")
    assert storage.read("shards/0001-of-0002/manifest.jsonl") == b"{}\n"
    assert storage.listdir("shards") == ["0001-of-0002"]
    assert storage.size("shards/0001-of-0002/manifest.jsonl") == 3
    assert (
        storage.sha256("shards/0001-of-0002/manifest.jsonl") == hashlib.sha256(b"{}\n").hexdigest()
    )
    local = tmp_path / "result.png"
    local.write_bytes(b"\x89PNG")
    storage.put(local, "1-0.png")
    assert not local.exists()  # moved into place
    assert storage.is_whole("1-0.png", 4, hashlib.sha256(b"\x89PNG").hexdigest(), hashes=True)
    assert not storage.is_whole("1-0.png", 5, "", hashes=False)
    back = tmp_path / "back.png"
    assert storage.get("1-0.png", back)
    assert back.read_bytes() == b"\x89PNG"
    assert not storage.get("missing.png", tmp_path / "none.png")


def test_the_first_writer_of_a_file_wins_and_the_others_are_told(storage: Storage) -> None:
    assert storage.create("run.json", b'{"run_id": "a"}')
    assert not storage.create("run.json", b'{"run_id": "b"}')
    assert storage.read("run.json") == b'{"run_id": "a"}'


def test_a_link_planted_in_a_local_folder_is_never_read(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    (tmp_path / "secret").write_text("not the run's")
    (tmp_path / "run.json").symlink_to(tmp_path / "secret")
    with pytest.raises(StorageError):
        storage.create("run.json", b"{}")


def test_one_spelling_of_a_folder_whoever_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert destination_name("out") == destination_name("./out/") == str(tmp_path / "out")
    assert destination_name(f"file://{tmp_path}/out") == str(tmp_path / "out")
    assert destination_name("s3://bucket/run/") == "s3://bucket/run"
    assert is_url("s3://b/r")
    assert not is_url("file:///tmp/x")
    assert not is_url("out")
    assert open_storage(f"file://{tmp_path}").local == tmp_path
    assert open_storage("memory://x").local is None
