"""CSV input (``batch/_input.py``): records numbered by the line they begin on, the header row
that names the columns, what cutting a file into slices sees of each line, and what tells a
file read as text that it is a table."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from imggw_client.batch import BadLine, InputLine, iter_lines
from imggw_client.batch._input import (
    MAX_LINE_CHARS,
    FieldColumn,
    LooksLikeCsv,
    csv_items,
    csv_line_kinds,
    header_message,
    is_csv_header,
)
from imggw_client.batch._lines import (
    ENTRY,
    HEADER,
    MORE,
    SKIPPED,
    BatchInputError,
    Tally,
    Unreadable,
    Where,
)

WHOLE = Where(None, 1, 1, Tally(), True)


def items(text: str, where: Where = WHOLE, *, tab: bool = False) -> list[tuple[int, int, Any]]:
    return list(csv_items(io.StringIO(text, newline=""), where, "in.csv", tab))


def test_records_are_numbered_by_their_first_line_and_keep_quoted_line_breaks() -> None:
    text = 'Prompt,resolution\n"a fox\non two lines",2k\n\n,\n"the ""best"" cat", 4k \n'
    found = items(text)
    assert [(n, entry) for n, entry, _ in found] == [(2, 1), (6, 2)]  # blank rows skipped
    assert found[0][2] == {"prompt": "a fox\non two lines", "resolution": "2k"}
    assert found[1][2] == {"prompt": 'the "best" cat', "resolution": "4k"}  # cells trimmed


def test_a_row_that_is_not_the_headers_width_is_a_bad_line_naming_the_columns() -> None:
    ((_, _, short), (_, _, long)) = items("prompt,resolution,id\na fox\nb,1k,7,extra\n")
    assert isinstance(short, Unreadable)
    assert isinstance(long, Unreadable)
    assert short.why == (
        "1 field where the header row names 3: columns 2 (resolution), 3 (id) missing"
    )
    assert long.why == "4 fields where the header row names 3: column 4 is not in the header row"
    ((_, _, unclosed),) = items('prompt\n"never closed\n')
    assert unclosed.why == "a quoted field that begins on this line is never closed"


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ("prompt,colour", "the header row names an unknown column 'colour' (column 2)"),
        ("prompt,,id", "column 2 of the header row has no name"),
        ("prompt,id,Prompt", "the header row names 'prompt' twice (columns 1 and 3)"),
        ("id,resolution", "the header row names no prompt column"),
    ],
)
def test_a_header_that_is_not_ours_stops_the_whole_input(header: str, problem: str) -> None:
    with pytest.raises(BatchInputError) as raised:
        items(f"\n{header}\na,b,c\n")
    assert raised.value.bad_lines[0].line == 2
    assert raised.value.message.startswith(f"in.csv, line 2: {problem}; the columns are prompt,")


def test_a_range_reads_only_its_records_but_numbers_entries_over_the_whole_input() -> None:
    text = "prompt\na\nb\nc\nd\n"
    where = Where(range(4, 6), 1, 1, Tally(), False)
    assert [(n, entry, f["prompt"]) for n, entry, f in items(text, where)] == [
        (4, 3, "c"),
        (5, 4, "d"),
    ]


def test_a_tab_separated_header_or_a_tsv_file_of_one_column_reads_tabs() -> None:
    assert items("prompt\tid\na, b\t7\n")[0][2] == {"prompt": "a, b", "id": "7"}
    assert items("prompt\na, b\n", tab=True)[0][2] == {"prompt": "a, b"}


def test_each_line_of_a_csv_file_is_a_header_an_entry_more_of_one_or_skipped() -> None:
    text = 'prompt\n"a\nb"\n\nc\n'
    assert list(csv_line_kinds(io.StringIO(text, newline=""))) == [
        ("prompt\n", HEADER),
        ('"a\n', ENTRY),
        ('b"\n', MORE),
        ("\n", SKIPPED),
        ("c\n", ENTRY),
    ]


def test_text_that_is_a_table_is_told_apart_from_prompts() -> None:
    assert is_csv_header("Prompt, resolution")
    assert is_csv_header('"prompt"\t"id"')
    assert not is_csv_header("prompt, a fox")
    assert not is_csv_header("prompt,prompt")
    assert seen("a cat,1:1,1k", "a dog,16:9,2k") == FieldColumn("comma", 2, 1, "1:1")
    assert seen("a, b, c", "d, e, f") is None  # commas alone are no table
    assert seen("a fox, running", "a cat") is None
    assert seen("a cat, 1k", "a dog") is None  # a line without the column: prompts
    assert seen("a cat, 4k", "a dog, 2K, oil") == FieldColumn("comma", 2, 1, "4k")
    assert seen("a cat, watercolor, 1k", "a dog, 1k") is None  # not the same column
    assert seen("a\t1:1 wide", "b\t2:3") is None  # a cell is a field, or it is not one
    assert seen("a\tauto", "b\t2:3") == FieldColumn("tab", 2, 1, "auto")
    assert seen("a cat,1:1,1k").kind == "an aspect ratio"  # type: ignore[union-attr]
    assert seen() is None
    assert "--format csv" in header_message("in.txt", 1, "prompt,id")


def seen(*lines: str) -> FieldColumn | None:
    check = LooksLikeCsv()
    for number, raw in enumerate(lines, 1):
        check.add(raw, number)
    return check.column()


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r", ""])
def test_a_line_past_the_limit_is_a_bad_line_never_held_whole(tmp_path: Path, ending: str) -> None:
    # 200 MB on one line took 470 MB to refuse: the line was read whole first.
    path = tmp_path / "in.txt"
    with path.open("w", newline="") as handle:
        handle.write(f"a cat{ending or chr(10)}")
        for _ in range(20):
            handle.write("x" * 1_000_000)
        handle.write(f"{ending}a dog{ending}")
    tracemalloc.start()
    try:
        items = list(iter_lines(path, format="text"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_LINE_CHARS * 4  # a few lines' worth, not the 20 MB one
    kept = [(item.line, item.request.prompt) for item in items if isinstance(item, InputLine)]
    bad = [(item.line, item.reason) for item in items if isinstance(item, BadLine)]
    if ending:
        assert kept == [(1, "a cat"), (3, "a dog")]
        assert bad == [(2, f"longer than {MAX_LINE_CHARS} characters")]
    else:  # no line break: the dog is part of the long line
        assert (kept, len(bad)) == ([(1, "a cat")], 1)


@pytest.mark.parametrize("length", [MAX_LINE_CHARS - 1, MAX_LINE_CHARS, MAX_LINE_CHARS + 1])
def test_a_long_line_ending_crlf_at_the_limit_keeps_the_lines_after_it_numbered(
    tmp_path: Path, length: int
) -> None:
    # The limit fell between its CR and LF: the LF read as a line of its own, and every line
    # after it (whose identity is its place) moved down one.
    path = tmp_path / "in.txt"
    path.write_bytes(b"a cat\r\n" + b"x" * length + b"\r\na dog\r\na fox\r\n")
    items = list(iter_lines(path, format="text"))
    kept = [(item.line, item.request.prompt) for item in items if isinstance(item, InputLine)]
    assert kept == [(1, "a cat"), (3, "a dog"), (4, "a fox")]
