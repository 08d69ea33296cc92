"""How a run is cut into shards (``batch/scale/_shards.py``): ranges every process agrees on, the
``I/N`` the command line takes, and slices of the input that keep a CSV record whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from imggw_client._core.exceptions import RequestValidationError
from imggw_client.batch.scale._shards import (
    parse_shard,
    scratch_folder,
    shard_folder,
    shard_range,
    slice_name,
    write_slices,
)
from imggw_client.batch.scale._storage import open_storage


def test_shards_are_contiguous_ranges_that_cover_every_line_once() -> None:
    for total in (0, 1, 7, 100):
        for count in (1, 3, 8):
            lines = [n for i in range(1, count + 1) for n in shard_range(i, count, total)]
            assert lines == list(range(1, total + 1))
    assert shard_folder(2, 12) == "shards/0002-of-0012"


@pytest.mark.parametrize("text", ["0/4", "5/4", "2", "a/b", "-1/4"])
def test_a_shard_that_names_none_is_one_clear_error(text: str) -> None:
    with pytest.raises(RequestValidationError) as raised:
        parse_shard(text)
    assert raised.value.code == "invalid_shard"
    assert parse_shard(" 2 / 4 ") == (2, 4)


def test_a_slice_keeps_its_inputs_kind_and_a_remote_folder_its_own_scratch() -> None:
    assert [slice_name(s) for s in ("a.JSONL", "b.csv", "c.json", "d.txt", "e")] == [
        "input.jsonl",
        "input.csv",
        "input.json",
        "input.txt",
        "input.txt",
    ]
    assert scratch_folder("s3://b/run/", None) == scratch_folder("s3://b/run", None)
    assert scratch_folder("s3://b/run", "/tmp/x").parent == Path("/tmp/x")


def test_a_csv_record_that_runs_past_its_shard_goes_whole_with_the_shard_it_began_in(
    tmp_path: Path,
) -> None:
    source = tmp_path / "in.csv"
    source.write_text('prompt,id\n"a fox\nover two lines",1\nb,2\nc,3\n', newline="")
    out = tmp_path / "out"
    out.mkdir()
    storage = open_storage(str(out))
    work = tmp_path / "work"
    work.mkdir()
    first_entries = write_slices(str(source), storage, 2, 5, work)
    one = (out / "shards/0001-of-0002/input.csv").read_text()
    two = (out / "shards/0002-of-0002/input.csv").read_text()
    # Lines 1-2 are shard 1's; the record begun on line 2 ends on line 3, which goes with it.
    assert one == 'prompt,id\n\n"a fox\nover two lines",1\n'
    # Each slice begins with the header row, then a blank line in its place (and in place of
    # the rest of a record begun in an earlier slice): each line keeps its number.
    assert two == "prompt,id\n\nb,2\nc,3\n"
    assert first_entries == [1, 2]
    assert list(work.iterdir()) == []  # no temp file left
