"""``name=`` (``imggw batch --name``): result files named by a template of plain fields, safe
on any filesystem whatever a line's ``id`` says (at most 255 bytes), lines that would share a
file refused before anything is sent, and a name that cannot be used after a result was paid
for never blocking the run."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imggw_client import PollPolicy, RequestValidationError, RetryPolicy
from imggw_client.batch import BatchInputError, BatchOptions, BatchReport, _store, run_batch
from imggw_client.batch._plan import MAX_NAME_BYTES, MAX_STEM_BYTES, NameTemplate, safe_stem
from imggw_client.mock import MockGateway

from ..cli.helpers import imggw

FAST = {
    "poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
    "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05),
}


pytestmark = pytest.mark.gateway(duration_min=0.02, duration_max=0.05, retry_after=0, latency=0.0)


def batch(gw: MockGateway, source: Path, out: Path, **kw: Any) -> BatchReport:
    return run_batch(source, out, client_factory=lambda: gw.async_client(**FAST), **kw)


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def posts(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def rows(report: BatchReport) -> list[dict[str, Any]]:
    return [json.loads(line) for line in report.manifest.read_text().splitlines()]


def images(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".png")


def test_the_default_names_are_the_task_ids(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "a cat"}, {"prompt": "a dog"}])
    report = batch(gw, source, tmp_path / "out")
    assert report.exit_code == 0
    expected = sorted(f"{row['task_id']}-0.png" for row in rows(report))
    assert images(tmp_path / "out") == expected
    assert not (tmp_path / "out" / ".incoming").exists()  # default names land in place


def test_files_are_named_by_the_template_and_a_rerun_keeps_them(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": "a cat", "id": "cat"}, {"prompt": "a dog", "id": "dog"}]
    )
    out = tmp_path / "out"
    report = batch(gw, source, out, name="{line}-{id}")
    assert report.exit_code == 0
    assert images(out) == ["1-cat.png", "2-dog.png"]
    assert [r["files"][0]["path"] for r in rows(report)] == ["1-cat.png", "2-dog.png"]
    assert all("warning" not in r for r in rows(report))
    assert "1-cat.png" in (out / "index.html").read_text() + "".join(
        p.read_text() for p in (out / "gallery").rglob("*.js")
    )
    sent = posts(gw)
    (out / "2-dog.png").unlink()  # a file gone: the rerun downloads it again, by its name
    again = batch(gw, source, out, name="{line}-{id}")
    assert again.exit_code == 0
    assert posts(gw) == sent
    assert images(out) == ["1-cat.png", "2-dog.png"]


def test_hostile_ids_make_safe_names_inside_the_folder(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    hostile = ["../../escape", "CON", "z" * 250, "a\\b:c*?", "..", "nul.txt", " .hidden"]
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": f"p{i}", "id": v} for i, v in enumerate(hostile)]
    )
    out = tmp_path / "out"
    report = batch(gw, source, out, name="{id}")
    assert report.exit_code == 0
    names = [r["files"][0]["path"] for r in rows(report)]
    assert names[:2] == ["_._escape.png", "_CON.png"]
    assert len(names[2].encode()) == MAX_STEM_BYTES + len(".png")
    assert names[2].startswith("z" * 200)
    assert names[3:] == ["a_b_c__.png", "_.png", "_nul.txt.png", "_.hidden.png"]
    for name in names:
        assert (out / name).is_file()
        assert "/" not in name
        assert ".." not in name
    assert not (tmp_path / "escape.png").exists()


def test_a_nul_or_300_characters_in_an_id_is_a_bad_line_before_anything_is_sent(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": "a", "id": "a\x00b"}, {"prompt": "b", "id": "y" * 300}]
    )
    with pytest.raises(BatchInputError) as caught:
        batch(gw, source, tmp_path / "out", name="{id}")
    assert [b.line for b in caught.value.bad_lines] == [1, 2]
    assert posts(gw) == 0


def test_lines_sharing_a_file_are_refused_before_anything_is_sent(
    make_gateway: Callable[..., MockGateway], tmp_path: Path
) -> None:
    gw = make_gateway()
    records = [
        {"prompt": "a", "id": "Cat"},
        {"prompt": "b", "id": "cat"},
        {"prompt": "c", "id": "a/b"},
        {"prompt": "d", "id": "a_b"},
        {"prompt": "e"},
        {"prompt": "f", "id": "x" * 250},
        {"prompt": "g", "id": "x" * 249 + "y"},
    ]
    source = jsonl(tmp_path / "in.jsonl", records)
    with pytest.raises(BatchInputError) as caught:
        batch(gw, source, tmp_path / "out", name="{id}")
    assert [b.line for b in caught.value.bad_lines] == [2, 4, 5]  # long ids keep apart: a hash
    assert "line 2 its file 'cat' is line 1's too" in caught.value.message
    assert posts(gw) == 0
    assert not (tmp_path / "out").exists()  # no run begun: a fixed input is a first run


def test_a_template_that_cannot_tell_lines_apart_is_refused() -> None:
    for text in ("result", "{index}", "out/{id}", "{prompt}", ""):
        with pytest.raises(RequestValidationError):
            BatchOptions(name=text)
    assert BatchOptions(name="{line}_{id}").name == "{line}_{id}"


# Format specs put their fill characters into the name unchecked ("/" makes a path, ESC and
# newline control characters), conversions and indexing reach into the values: all refused.
SPECS = [
    "{id:/^5}x{line:/>2}",
    "{line:/>3}",
    "{id:\x1b^9}",
    "{id:\n<4}",
    "{id!r}",
    "{line:>3}",
    "{id[0]}",
    "{id.attr}",
    "{line:05}-{id}",
    "{id:{line}}",
    "{line:q}",
]


@pytest.mark.parametrize("text", SPECS)
def test_a_template_with_a_format_spec_is_refused_before_anything_is_sent(
    make_gateway: Callable[..., MockGateway], tmp_path: Path, text: str
) -> None:
    gw = make_gateway()
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": "a", "id": "cat"}, {"prompt": "b", "id": "dog"}]
    )
    with pytest.raises(RequestValidationError) as refused:
        batch(gw, source, tmp_path / "out", name=text)
    assert refused.value.code == "invalid_option"
    assert "{task_id}, {index}, {line}, {id}" in refused.value.message
    assert "no format spec or conversion" in refused.value.message
    assert refused.value.message.isprintable()
    assert gw.stats()["tasks_created"] == 0
    assert posts(gw) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # nothing written anywhere


def test_the_cli_refuses_a_format_spec_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": "a", "id": "cat"}, {"prompt": "b", "id": "dog"}]
    )
    run = imggw(
        "--mock",
        "batch",
        str(source),
        "-o",
        str(tmp_path / "out"),
        "--name",
        "{id:/^5}x{line:/>2}",
        env={"IMGGW_JOURNAL": "off"},
    )
    assert run.code == 2, run.err
    assert "'{id:/^5}x{line:/>2}'" in run.err  # the template
    assert "{task_id}, {index}, {line}, {id}" in run.err  # and the fields it may use
    assert "nothing was sent" in run.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_name_of_300_bytes_is_cut_to_255_at_a_character_and_the_run_completes(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    """100 CJK characters are 300 bytes: a name the filesystem refuses ("File name too
    long") after the task was paid, on every rerun, when names were counted in characters."""
    gw = make_gateway()
    records = [
        {"prompt": "a", "id": "漢" * 100},
        {"prompt": "b", "id": "é" * 255},
        {"prompt": "c", "id": "𠜎" * 80},
    ]
    source = jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    report = batch(gw, source, out, name="{id}-{line}")
    assert report.exit_code == 0
    names = [r["files"][0]["path"] for r in rows(report)]
    for name, record in zip(names, records, strict=True):
        raw = os.fsencode(name)
        assert len(raw) <= MAX_NAME_BYTES
        assert raw.decode("utf-8") == name  # valid UTF-8: cut between characters
        assert name.startswith(record["id"][:20])
        assert (out / name).is_file()
    assert all("warning" not in r for r in rows(report))
    assert gw.stats()["tasks_created"] == 3
    again = batch(gw, source, out, name="{id}-{line}")
    assert again.exit_code == 0
    assert gw.stats()["tasks_created"] == 3  # billed once
    assert [r["files"][0]["path"] for r in rows(again)] == names


def test_a_name_taken_after_the_result_was_paid_falls_back_to_the_default(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
) -> None:
    gw = make_gateway()
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": "a", "id": "cat"}, {"prompt": "b", "id": "dog"}]
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "cat.png").write_bytes(b"someone else's")  # there before the run: not line 1's
    report = batch(gw, source, out, name="{id}")
    assert report.exit_code == 0  # the run is not blocked
    first, second = rows(report)
    assert first["status"] == "succeeded"
    assert first["files"][0]["path"] == f"{first['task_id']}-0.png"  # the default name
    assert first["error"] is None
    assert first["warning"]["code"] == "name_not_used"
    assert "'cat.png' (another file has that name)" in first["warning"]["message"]
    assert (out / "cat.png").read_bytes() == b"someone else's"
    assert second["files"][0]["path"] == "dog.png"
    assert "warning" not in second
    assert gw.stats()["tasks_created"] == 2
    again = batch(gw, source, out, name="{id}")  # a rerun: nothing to do, nothing billed
    assert again.exit_code == 0
    assert gw.stats()["tasks_created"] == 2
    assert rows(again)[0]["warning"]["code"] == "name_not_used"


def test_a_name_the_filesystem_refuses_after_paying_falls_back_and_says_so(
    make_gateway: Callable[..., MockGateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A filesystem with a shorter limit (eCryptfs: 143 bytes) or characters it refuses
    answers the rename with ENAMETOOLONG or EINVAL, once the result is paid for."""
    real = os.replace

    def refusing(source: Any, target: Any) -> None:
        if Path(target).name.startswith("cat"):
            raise OSError(errno.ENAMETOOLONG, "File name too long", str(target))
        real(source, target)

    monkeypatch.setattr(_store.os, "replace", refusing)
    gw = make_gateway()
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": "a", "id": "cat"}, {"prompt": "b", "id": "dog"}]
    )
    out = tmp_path / "out"
    report = batch(gw, source, out, name="{id}")
    assert report.exit_code == 0
    first, second = rows(report)
    assert first["files"][0]["path"] == f"{first['task_id']}-0.png"
    assert (out / first["files"][0]["path"]).is_file()
    assert "File name too long" in first["warning"]["message"]
    assert second["files"][0]["path"] == "dog.png"
    assert any(
        "line 1:" in r.getMessage() and "default name" in r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING"
    )
    assert gw.stats()["tasks_created"] == 2


def test_a_template_without_index_numbers_only_the_later_results() -> None:
    template = NameTemplate.parse("{id}")
    assert template.render_fields(task_id="t", index=0, line=1, caller_id="cat") == "cat"
    assert template.render_fields(task_id="t", index=2, line=1, caller_id="cat") == "cat-2"


def test_safe_stem_never_gives_a_reserved_or_empty_name() -> None:
    assert safe_stem("com1") == "_com1"
    assert safe_stem("LPT9.x") == "_LPT9.x"
    assert safe_stem("...") == "_"
    assert safe_stem("a.. ") == "a"
