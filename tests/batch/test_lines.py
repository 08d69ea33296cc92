"""A line of input (``batch/_lines.py``): a line's identity and digest, which decide its key
across runs, the bad-line message, what a comment is, and what one record says (a request, a
task to collect, or the reason it is a bad line), whatever reader found it.
"""

from __future__ import annotations

import pickle

import pytest

from imggw_client import ImageRequest
from imggw_client.batch._lines import (
    COLLECT,
    GENERATE,
    SHOWN_BAD_LINES,
    Bad,
    BadLine,
    Bare,
    BatchInputError,
    InputLine,
    Unreadable,
    describe_bad_lines,
    is_comment,
    is_object,
    load,
    parse,
    parse_collect,
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


def test_a_record_becomes_a_request_with_its_defaults_and_the_fields_kept() -> None:
    line = parse(4, {"prompt": "a fox", "id": 17, "surface": "alpha"})
    assert line is not None
    assert line.request == ImageRequest("a fox", "auto", "1k")
    assert (line.line, line.caller_id, line.surface) == (4, "17", "alpha")
    assert line.fields == {"prompt": "a fox", "aspect_ratio": "auto", "resolution": "1k"}
    assert parse(1, "a bare prompt").request == ImageRequest("a bare prompt")  # type: ignore[union-attr]
    request = ImageRequest("a cat", "16:9", "2k")
    assert parse(1, request).request is request  # type: ignore[union-attr]


def test_a_record_with_task_id_collects_that_task() -> None:
    line = parse(2, {"task_id": "101", "prompt": "kept for the manifest", "status": "running"})
    assert line is not None
    assert (line.task_id, line.request) == ("101", None)
    assert line.fields == {"prompt": "kept for the manifest"}


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({"prompt": "a", "colour": "red"}, "unknown field 'colour'"),
        ({"aspect_ratio": "1:1"}, "prompt is required (or task_id, to collect a task made"),
        ({"prompt": "a", "id": True}, "id must be a string or an integer"),
        ({"prompt": "a", "id": ""}, "id must be 1 to 255 printable characters"),
        ({"prompt": "a", "surface": "gamma"}, "surface must be one of"),
        ({"prompt": "a", "resolution": "8k"}, "resolution"),
        ([1, 2], "not a JSON object"),
        (Unreadable("repeated key 'prompt'"), "repeated key 'prompt'"),
        (Bare("# a note"), "not a JSON object (a comment line begins with '# '"),
    ],
)
def test_what_makes_a_record_a_bad_line(item: object, reason: str) -> None:
    with pytest.raises(Bad) as raised:
        parse(1, item)
    assert reason in str(raised.value)


def test_a_collect_list_takes_bare_ids_numbers_and_manifest_rows() -> None:
    assert parse_collect(1, "123456789").task_id == "123456789"  # type: ignore[union-attr]
    assert parse_collect(1, 12345).task_id == "12345"  # type: ignore[union-attr]
    # A manifest's row of a line that never had a task: nothing to collect, and no error.
    assert parse_collect(3, {"task_id": None, "status": "failed", "line": 3}) is None
    with pytest.raises(Bad, match="task_id is null"):
        parse_collect(1, {"task_id": None})
    with pytest.raises(Bad, match="is not a task id"):
        parse_collect(1, "has spaces in it")
    with pytest.raises(Bad, match="unknown field 'colour'"):
        parse_collect(1, {"task_id": "101", "colour": "red"})


def test_a_json_line_that_repeats_a_key_is_named_for_it() -> None:
    assert load('{"prompt": "a", "prompt": "b"}').why == "repeated key 'prompt'"
    assert load("{not json", " (a hint)").why == "not a JSON object (a hint)"
    assert load('{"prompt": "a"}') == {"prompt": "a"}
    assert is_object('{"a": 1}')
    assert not is_object("[1]")
    assert not is_object("{broken")
