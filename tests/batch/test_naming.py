"""``name=`` (``imggw batch --name``): result files named by a template, safe on any
filesystem whatever a line's ``id`` says, and lines that would share a file refused before
anything is sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imggw_client import PollPolicy, RequestValidationError, RetryPolicy
from imggw_client.batch import BatchInputError, BatchOptions, BatchReport, run_batch
from imggw_client.batch._naming import MAX_STEM, NameTemplate, safe_stem
from imggw_client.mock import MockGateway

FAST = {"poll": PollPolicy(initial_interval=0.02, max_interval=0.1),
        "retry": RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05)}  # fmt: skip


def gateway() -> MockGateway:
    return MockGateway(duration_min=0.02, duration_max=0.05, retry_after=0, latency=0.0)


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


def test_the_default_names_are_the_task_ids(tmp_path: Path) -> None:
    gw = gateway()
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "a cat"}, {"prompt": "a dog"}])
    report = batch(gw, source, tmp_path / "out")
    assert report.exit_code == 0
    expected = sorted(f"{row['task_id']}-0.png" for row in rows(report))
    assert images(tmp_path / "out") == expected
    assert not (tmp_path / "out" / ".incoming").exists()  # default names land in place


def test_files_are_named_by_the_template_and_a_rerun_keeps_them(tmp_path: Path) -> None:
    gw = gateway()
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "a cat", "id": "cat"},
                                           {"prompt": "a dog", "id": "dog"}])  # fmt: skip
    out = tmp_path / "out"
    report = batch(gw, source, out, name="{line:03}-{id}")
    assert report.exit_code == 0
    assert images(out) == ["001-cat.png", "002-dog.png"]
    assert [r["files"][0]["path"] for r in rows(report)] == ["001-cat.png", "002-dog.png"]
    assert "001-cat.png" in (out / "index.html").read_text() + "".join(
        p.read_text() for p in (out / "gallery").rglob("*.js")
    )
    sent = posts(gw)
    (out / "002-dog.png").unlink()  # a file gone: the rerun downloads it again, by its name
    again = batch(gw, source, out, name="{line:03}-{id}")
    assert again.exit_code == 0
    assert posts(gw) == sent
    assert images(out) == ["001-cat.png", "002-dog.png"]


def test_hostile_ids_make_safe_names_inside_the_folder(tmp_path: Path) -> None:
    gw = gateway()
    hostile = ["../../escape", "CON", "z" * 250, "a\\b:c*?", "..", "nul.txt", " .hidden"]
    source = jsonl(
        tmp_path / "in.jsonl", [{"prompt": f"p{i}", "id": v} for i, v in enumerate(hostile)]
    )
    out = tmp_path / "out"
    report = batch(gw, source, out, name="{id}")
    assert report.exit_code == 0
    names = [r["files"][0]["path"] for r in rows(report)]
    assert names[:2] == ["_._escape.png", "_CON.png"]
    assert len(names[2]) == MAX_STEM + len(".png")
    assert names[2].startswith("z" * 100)
    assert names[3:] == ["a_b_c__.png", "_.png", "_nul.txt.png", "_.hidden.png"]
    for name in names:
        assert (out / name).is_file()
        assert "/" not in name
        assert ".." not in name
    assert not (tmp_path / "escape.png").exists()


def test_a_nul_or_300_characters_in_an_id_is_a_bad_line_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    gw = gateway()
    source = jsonl(tmp_path / "in.jsonl", [{"prompt": "a", "id": "a\x00b"},
                                           {"prompt": "b", "id": "y" * 300}])  # fmt: skip
    with pytest.raises(BatchInputError) as caught:
        batch(gw, source, tmp_path / "out", name="{id}")
    assert [b.line for b in caught.value.bad_lines] == [1, 2]
    assert posts(gw) == 0


def test_lines_sharing_a_file_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    gw = gateway()
    records = [{"prompt": "a", "id": "Cat"}, {"prompt": "b", "id": "cat"},
               {"prompt": "c", "id": "a/b"}, {"prompt": "d", "id": "a_b"}, {"prompt": "e"},
               {"prompt": "f", "id": "x" * 250}, {"prompt": "g", "id": "x" * 249 + "y"}]  # fmt: skip
    source = jsonl(tmp_path / "in.jsonl", records)
    with pytest.raises(BatchInputError) as caught:
        batch(gw, source, tmp_path / "out", name="{id}")
    assert [b.line for b in caught.value.bad_lines] == [2, 4, 5]  # long ids keep apart: a hash
    assert "line 2 its file 'cat' is line 1's too" in caught.value.message
    assert posts(gw) == 0
    assert not (tmp_path / "out").exists()  # no run begun: a fixed input is a first run


def test_a_template_that_cannot_tell_lines_apart_is_refused() -> None:
    for text in ("result", "{index}", "out/{id}", "{id!r}", "{prompt}", "", "{line:q}"):
        with pytest.raises(RequestValidationError):
            BatchOptions(name=text)
    assert BatchOptions(name="{line:05}_{id}").name == "{line:05}_{id}"


def test_a_template_without_index_numbers_only_the_later_results() -> None:
    template = NameTemplate.parse("{id}")
    assert template.render_fields(task_id="t", index=0, line=1, caller_id="cat") == "cat"
    assert template.render_fields(task_id="t", index=2, line=1, caller_id="cat") == "cat-2"


def test_safe_stem_never_gives_a_reserved_or_empty_name() -> None:
    assert safe_stem("com1") == "_com1"
    assert safe_stem("LPT9.x") == "_LPT9.x"
    assert safe_stem("...") == "_"
    assert safe_stem("a.. ") == "a"
