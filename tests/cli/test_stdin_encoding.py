"""Standard input that is not UTF-8 (``imggw submit -``, ``imggw batch -``, ``imggw download
--from -``): exit 2 and one line saying so, as a file that is not UTF-8 gets; never a traceback,
nothing sent. Standard input is read as bytes and decoded as a file is, whatever the terminal's
encoding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

from .helpers import imggw

NOT_UTF8 = b"\xff\xfe bad\n"
REASON = "not UTF-8 text (invalid start byte)"


@pytest.mark.parametrize("command", ["submit", "generate"])
def test_a_prompt_that_is_not_utf8_exits_2_in_one_line(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, command: str
) -> None:
    gw, url = served_gateway
    output = ["-o", str(tmp_path)] if command == "generate" else []
    run = imggw(command, "-", "--base-url", url, *output, stdin=NOT_UTF8)
    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err == f"error: cannot read standard input: {REASON}\n"
    assert gw.stats()["requests"] == {}


@pytest.mark.parametrize(
    "args", [["batch", "-"], ["download", "--from", "-"]], ids=["batch", "download"]
)
def test_batch_input_that_is_not_utf8_exits_2_like_a_file(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, args: list[str]
) -> None:
    gw, url = served_gateway
    run = imggw(*args, "-o", str(tmp_path / "piped"), "--base-url", url, stdin=NOT_UTF8)
    assert run.code == 2, run.err
    assert run.out == ""
    assert run.err.count("\n") == 1
    assert f"cannot read standard input: {REASON}" in run.err
    source = tmp_path / "in.txt"  # the same bytes in a file: the same words
    source.write_bytes(NOT_UTF8)
    file_args = [a if a != "-" else str(source) for a in args]
    from_file = imggw(*file_args, "-o", str(tmp_path / "file"), "--base-url", url)
    assert from_file.code == 2
    assert REASON in from_file.err
    assert gw.stats()["requests"] == {}


def test_piped_batch_input_is_decoded_as_a_file_is(tmp_path: Path) -> None:
    """A byte-order mark is not part of the first line, and CRLF line ends are line ends."""
    run = imggw(
        "batch",
        "-",
        "-o",
        str(tmp_path / "out"),
        "--mock",
        "-q",
        "--json",
        stdin=b'\xef\xbb\xbf{"prompt": "a cat"}\r\n{"prompt": "caf\xc3\xa9"}\r\n',
    )
    assert run.code == 0, run.err
    assert [r["prompt"] for r in run.records()] == ["a cat", "café"]


def test_the_real_standard_input_gives_no_traceback() -> None:
    """The command from the bug report, in a real process with a UTF-8 terminal encoding."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    done = subprocess.run(
        [sys.executable, "-m", "imggw_cli", "--mock", "submit", "-"],
        input=NOT_UTF8,
        capture_output=True,
        timeout=60,
        check=False,
        env={**env, "PYTHONIOENCODING": "utf-8"},
    )
    assert done.returncode == 2
    assert done.stdout == b""
    assert done.stderr == f"error: cannot read standard input: {REASON}\n".encode()
