"""No NaN or Infinity in any ``--json`` output (DESIGN 18): strict parsers refuse them. A
gateway that states charges near the largest float makes every sum overflow; every line a
command prints still parses strictly, the overflowed sums as null. Over a real socket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imggw_client.mock._asgi import serve_app
from imggw_client.text import strict_json

from ..conftest import PNG
from .helpers import imggw

HUGE = 1e308  # finite: two of them summed are not


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in JSON output")


def strict(line: str) -> Any:
    return json.loads(line, parse_constant=_no_constant)


def every_line_strict(text: str) -> list[Any]:
    return [strict(line) for line in text.splitlines() if line.strip()]


def huge_charges(base: list[str]) -> Any:
    counter = iter(range(1, 1_000_000))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.startswith("/img/"):
            status, ctype, body = 200, b"image/png", PNG
        elif scope["method"] == "POST":
            while (await receive()).get("more_body"):
                pass
            answer = {"code": 200, "data": [{"status": "submitted", "task_id": str(next(counter))}]}
            status, ctype, body = 200, b"application/json", json.dumps(answer).encode()
        else:
            task_id = path.rsplit("/", 1)[-1]
            record = {
                "id": task_id,
                "status": "completed",
                "progress": 100,
                "cost": HUGE,
                "credits_cost": HUGE,
                "result": {"images": [{"url": [f"{base[0]}/img/{task_id}.png"]}]},
            }
            status, ctype, body = (
                200,
                b"application/json",
                json.dumps({"code": 200, "data": record}).encode(),
            )
        headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


# Not the shared family (tests/gateways.py): this gateway answers charges no MockGateway states.
@pytest.fixture
def gateway() -> Iterator[str]:
    base: list[str] = []
    with serve_app(huge_charges(base)) as url:
        base.append(url)
        yield url


@pytest.mark.slow
def test_huge_charges_summed_print_null_never_infinity(gateway: str, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a fox number {i}\n" for i in range(6)))
    out = tmp_path / "out"
    common = ["--base-url", gateway, "--surface", "beta"]

    run = imggw("batch", str(prompts), "-o", str(out), "--json", "--log-format", "json", *common)
    assert run.code == 0, run.err
    rows = every_line_strict(run.out)
    assert len(rows) == 6
    every_line_strict(run.err)  # --log-format json: the summary's sums too

    status = imggw("batch", "status", str(out), "--json", "--log-format", "json")
    assert status.code == 0, status.err
    (record,) = every_line_strict(status.out)
    every_line_strict(status.err)
    assert record["spent"]["credits"] is None  # 6 x 1e308 overflowed: not a number
    assert record["spent"]["cost"] is None

    more = tmp_path / "more.txt"
    more.write_text("".join(f"a fox number {i}\n" for i in range(40)))
    plan = imggw(
        "batch",
        str(more),
        "-o",
        str(out),
        "--dry-run",
        "--json",
        "--allow-changes",
        "--log-format",
        "json",
        *common,
    )
    assert plan.code == 0, plan.err
    (dry,) = every_line_strict(plan.out)
    every_line_strict(plan.err)
    assert dry["spent"]["credits"] is None


def test_strict_json_makes_every_non_finite_number_null() -> None:
    value = {
        "a": float("inf"),
        "b": [float("-inf"), float("nan"), 1.5, (2.0, float("inf"))],
        "c": {"d": HUGE * 10},
        "e": "Infinity",
        "f": 7,
    }
    assert strict(strict_json(value)) == {
        "a": None,
        "b": [None, None, 1.5, [2.0, None]],
        "c": {"d": None},
        "e": "Infinity",
        "f": 7,
    }
