"""``imggw batch --name TEMPLATE`` over a real socket: files on disk by the template, and a
template that would give two lines one file refused (exit 2, naming the lines) with nothing
sent."""

from __future__ import annotations

import json
from pathlib import Path

from imggw_client.mock import MockGateway

from .helpers import imggw


def posts(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def test_files_are_named_by_the_template(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _gw, url = served_gateway
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a cat", "id": "cat/../x"}\n{"prompt": "a dog", "id": "dog"}\n')
    out = tmp_path / "out"
    run = imggw(
        "batch",
        str(source),
        "-o",
        str(out),
        "--name",
        "{line}_{id}",
        "--base-url",
        url,
        "--json",
        "-q",
    )
    assert run.code == 0, run.err
    assert [r["files"][0]["path"] for r in run.records()] == ["1_cat_._x.png", "2_dog.png"]
    assert sorted(p.name for p in out.glob("*.png")) == ["1_cat_._x.png", "2_dog.png"]


def test_a_collision_exits_2_naming_the_lines_and_sends_nothing(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps({"prompt": p, "id": i}) + "\n"
            for p, i in [("a", "Cat"), ("b", "cat"), ("c", "ok")]
        )
    )
    run = imggw(
        "batch", str(source), "-o", str(tmp_path / "out"), "--name", "{id}", "--base-url", url
    )
    assert run.code == 2
    assert "line 2 its file 'cat' is line 1's too" in run.err
    assert "nothing was sent" in run.err
    assert posts(gw) == 0
    assert not (tmp_path / "out").exists()


def test_a_bad_template_exits_2_before_reading_anything(tmp_path: Path) -> None:
    run = imggw(
        "batch",
        str(tmp_path / "missing.jsonl"),
        "-o",
        str(tmp_path / "out"),
        "--name",
        "../{line}",
        "--mock",
    )
    assert run.code == 2
    assert run.err.startswith("error: --name '../{line}' is a file name, not a path")
