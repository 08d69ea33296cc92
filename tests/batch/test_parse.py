"""What one record of an input says (``batch/_parse.py``): a request, a task to collect, or
the reason it is a bad line, whatever reader found it."""

from __future__ import annotations

import pytest

from imggw_client import ImageRequest
from imggw_client.batch._lines import Bad, Bare, Unreadable, is_object, load, parse, parse_collect


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
