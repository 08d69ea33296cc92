"""What reading an input yields (``batch/_lines.py``): a line's identity and digest, which
decide its key across runs, the bad-line message, and what a comment is."""

from __future__ import annotations

import pickle

from imggw_client import ImageRequest
from imggw_client.batch._lines import (
    COLLECT,
    GENERATE,
    SHOWN_BAD_LINES,
    BadLine,
    BatchInputError,
    InputLine,
    describe_bad_lines,
    is_comment,
)


def test_a_line_is_known_by_its_id_else_its_task_else_its_entry() -> None:
    request = ImageRequest("a fox")
    assert InputLine(7, request, "hero", entry=3).identity("beta") == "id:hero"
    assert InputLine(7, request, entry=3).identity("beta") == "line:3"
    assert InputLine(7, request).identity("beta") == "line:7"  # no entry: its line number
    collect = InputLine(2, None, task_id="101")
    assert collect.kind == COLLECT
    assert InputLine(1, request).kind == GENERATE
    # A task named with and without its surface is the same line (caught when named twice).
    assert collect.identity("beta") == InputLine(9, None, task_id="101", surface="beta").identity(
        "alpha"
    )


def test_the_digest_changes_with_what_the_line_asks_and_where_not_with_its_place() -> None:
    fox = InputLine(1, ImageRequest("a fox", "16:9", "2K"))
    moved = InputLine(40, ImageRequest("a fox", "16:9", "2k"), entry=12)
    assert fox.digest("beta") == moved.digest("beta")  # resolution case and place do not count
    assert fox.digest("beta") != fox.digest("alpha")
    assert fox.digest("beta") != InputLine(1, ImageRequest("a fox", "1:1", "2k")).digest("beta")
    named = InputLine(1, ImageRequest("a fox", "16:9", "2k"), surface="alpha")
    assert named.digest("beta") == fox.digest("alpha")  # the line's own surface wins
    collect = InputLine(1, None, task_id="101")
    assert collect.digest("beta") != InputLine(1, None, task_id="102").digest("beta")


def test_bad_lines_are_named_up_to_ten_then_counted_or_listed() -> None:
    assert describe_bad_lines([BadLine(2, "not a JSON object")], 1, None) == (
        "line 2: not a JSON object"
    )
    many = [BadLine(n, "prompt is required") for n in range(1, 31)]
    text = describe_bad_lines(many, 30, None)
    assert text.startswith("30 bad lines: line 1: prompt is required; line 2:")
    assert text.count("prompt is required") == SHOWN_BAD_LINES
    assert text.endswith(" (and 20 more)")
    assert describe_bad_lines(many, 30, "out/bad-lines.txt").endswith(
        "; all 30 are listed in out/bad-lines.txt"
    )


def test_the_input_error_says_nothing_was_sent_and_travels_whole() -> None:
    err = BatchInputError([BadLine(3, "unknown field 'x'")], listing="out/bad-lines.txt")
    assert err.message == "line 3: unknown field 'x'; nothing was sent"
    assert (err.code, err.count, str(err.listing)) == ("invalid_input", 1, "out/bad-lines.txt")
    again = pickle.loads(pickle.dumps(err))
    assert (again.message, again.count) == (err.message, 1)


def test_a_comment_is_a_hash_then_whitespace_or_nothing() -> None:
    assert is_comment("#")
    assert is_comment("# a note")
    assert is_comment("#\tnote")
    assert not is_comment("#hashtag sunset")
    assert not is_comment("#1 bestseller")
    assert not is_comment("a # in the middle")
