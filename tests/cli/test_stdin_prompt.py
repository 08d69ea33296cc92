"""``imggw submit -`` and ``imggw generate -`` read the prompt from standard input: all of it,
less one trailing newline. A blank one stops the command before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from imggw_client.mock import MockGateway

from .helpers import imggw


@pytest.mark.parametrize(
    ("stdin", "prompt"),
    [
        ("a cat on a mat\n", "a cat on a mat"),
        ("a cat on a mat", "a cat on a mat"),
        ("a cat\r\n", "a cat"),
        ("line one\nline two\n\n", "line one\nline two\n"),
        ("  spaced  \n", "  spaced  "),
    ],
)
def test_submit_dash_submits_standard_input_less_one_trailing_newline(
    served_gateway: tuple[MockGateway, str], stdin: str, prompt: str
) -> None:
    gw, url = served_gateway
    first = imggw("submit", "-", "--base-url", url, "--json", stdin=stdin)
    assert first.code == 0, first.err
    record = first.records()[0]
    # The gateway replays a key only for the very same request: so this was the prompt sent.
    again = imggw(
        "submit",
        prompt,
        "--base-url",
        url,
        "--json",
        "--idempotency-key",
        record["idempotency_key"],
    )
    assert again.code == 0, again.err
    assert again.records()[0]["task_id"] == record["task_id"]
    assert gw.stats()["tasks_created"] == 1


def test_generate_dash_reads_the_prompt_from_standard_input(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    run = imggw(
        "generate",
        "-",
        "--base-url",
        url,
        "-o",
        str(tmp_path),
        "--json",
        "--idempotency-key",
        "order-1",
        stdin="a lighthouse\n",
    )
    assert run.code == 0, run.err
    (file,) = run.records()[0]["files"]
    assert Path(file["path"]).read_bytes().startswith(b"\x89PNG")
    again = imggw(
        "submit", "a lighthouse", "--base-url", url, "--json", "--idempotency-key", "order-1"
    )
    assert again.records()[0]["task_id"] == run.records()[0]["task_id"]  # the same request
    assert gw.stats()["tasks_created"] == 1


@pytest.mark.parametrize(
    ("stdin", "rule"),
    [
        ("", "must be 1 to 20000 characters long (got 0)"),
        ("\n", "must be 1 to 20000 characters long (got 0)"),
        ("\r\n", "must be 1 to 20000 characters long (got 0)"),
        (" \t\n", "must contain a non-whitespace character"),
        ("\n\n", "must contain a non-whitespace character"),
    ],
)
@pytest.mark.parametrize("command", ["submit", "generate"])
def test_a_blank_standard_input_exits_2_and_sends_nothing(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, stdin: str, rule: str, command: str
) -> None:
    gw, url = served_gateway
    output = ["-o", str(tmp_path)] if command == "generate" else []
    run = imggw(command, "-", "--base-url", url, *output, stdin=stdin)
    assert run.code == 2
    assert run.out == ""
    assert run.err == f"error: the prompt read from standard input {rule}\n"
    assert gw.stats()["requests"] == {}
