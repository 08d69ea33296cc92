"""The request's choices are ``Literal`` types (DESIGN 21): ``mypy --strict`` on a small typed
program accepts every right surface, ratio and resolution and refuses each wrong one, in every
signature that takes one, on both clients."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

import imggw_client
from imggw_client import rules

# Each line that must be refused ends with "# wrong"; every other line must pass.
PROGRAM = """\
from __future__ import annotations

from collections.abc import Hashable

import httpx

from imggw_client import (
    AspectRatio, AsyncClient, Client, ImageRequest, Resolution, Submission, Surface,
)


def right(client: Client, sub: Submission) -> None:
    client.submit("a fox", aspect_ratio="16:9", resolution="2k", surface="alpha")
    client.submit("a fox", aspect_ratio="auto", resolution="4K", surface="beta")
    client.generate("a fox", aspect_ratio="9:21", resolution="1k", wait_timeout=60)
    client.get("1", surface="alpha", extra_headers={"X-Request-Id": "7"})
    client.wait(sub, surface="beta", wait_timeout=30)
    client.with_options(surface="alpha", timeout=httpx.Timeout(5, connect=2))
    ImageRequest("a fox", "21:9", "2K")
    ratio: AspectRatio = "3:2"
    size: Resolution = "2k"
    where: Surface = "beta"
    client.submit("a fox", aspect_ratio=ratio, resolution=size, surface=where)
    Client(surface="alpha", default_headers={"X-Team": "ml"})
    client.share_budget(Blocking())


# Budget services as BudgetService's example writes them, every keyword of finished() spelled.
class Unpaced:
    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        return kind, 0.0

    async def wait_time(self, ticket: Hashable) -> float:
        return 0.0

    async def release(self, ticket: Hashable) -> None: ...

    async def finished(
        self, ticket: Hashable, *, limited: bool, retry_after: float | None,
        backoff: tuple[float, float],
    ) -> None: ...


class Blocking:
    def reserve(self, kind: str) -> tuple[Hashable, float]:
        return kind, 0.0

    def wait_time(self, ticket: Hashable) -> float:
        return 0.0

    def release(self, ticket: Hashable) -> None: ...

    def finished(
        self, ticket: Hashable, *, limited: bool, retry_after: float | None,
        backoff: tuple[float, float],
    ) -> None: ...


class Forgetful(Blocking):  # its finished() takes no backoff
    def finished(  # type: ignore[override]
        self, ticket: Hashable, *, limited: bool, retry_after: float | None
    ) -> None: ...


async def right_async(client: AsyncClient) -> None:
    await client.submit("a fox", aspect_ratio="1:1", resolution="2k", surface="alpha")
    await client.generate("a fox", aspect_ratio="4:5", resolution="1K")
    client.share_budget(Unpaced())


def wrong(client: Client, text: str) -> None:
    client.submit("a fox", aspect_ratio="7:5")  # wrong
    client.submit("a fox", resolution="8k")  # wrong
    client.submit("a fox", surface="gamma")  # wrong
    client.generate("a fox", aspect_ratio="16:10")  # wrong
    client.generate("a fox", resolution="1080p")  # wrong
    client.get("1", surface="Alpha")  # wrong
    client.wait("1", surface="delta")  # wrong
    client.with_options(surface="gamma")  # wrong
    Client(surface="gamma")  # wrong
    ImageRequest("a fox", "7:5")  # wrong
    ImageRequest("a fox", "1:1", "8k")  # wrong
    client.submit("a fox", aspect_ratio=text)  # wrong
    ratio: AspectRatio = "5:7"  # wrong
    size: Resolution = "3k"  # wrong
    where: Surface = "gamma"  # wrong
    client.share_budget(Forgetful())  # wrong
    client.share_budget(Unpaced())  # wrong


async def wrong_async(client: AsyncClient) -> None:
    await client.submit("a fox", aspect_ratio="7:5")  # wrong
    await client.generate("a fox", surface="gamma")  # wrong
"""


def test_the_aliases_are_the_rules_values() -> None:
    assert get_args(imggw_client.AspectRatio) == rules.ASPECT_RATIOS
    assert get_args(imggw_client.Surface) == ("alpha", "beta")
    assert {r.lower() for r in get_args(imggw_client.Resolution)} == set(rules.RESOLUTIONS)
    assert set(get_args(imggw_client.Resolution)) == {"1k", "2k", "4k", "1K", "2K", "4K"}


@pytest.mark.slow  # mypy reads the package and its dependencies: several seconds
def test_mypy_strict_refuses_each_wrong_choice_and_accepts_the_right_ones(tmp_path: Path) -> None:
    program = tmp_path / "typed_program.py"
    program.write_text(PROGRAM)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--hide-error-context",
            "--no-error-summary",
            program.name,
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    errors: dict[int, list[str]] = {}
    for line in done.stdout.splitlines():
        if re.match(r"typed_program\.py:\d+: note: ", line):  # what an error's lines go on to say
            continue
        found = re.match(r"typed_program\.py:(\d+): error: (.*)", line)
        assert found, f"unexpected mypy output: {line}\n{done.stdout}{done.stderr}"
        errors.setdefault(int(found[1]), []).append(found[2])
    lines = PROGRAM.splitlines()
    wrong = {n for n, text in enumerate(lines, 1) if text.endswith("# wrong")}
    assert set(errors) == wrong, done.stdout
    for number in wrong:
        assert any("incompatible type" in e or "Incompatible types" in e for e in errors[number]), (
            lines[number - 1],
            errors[number],
        )
