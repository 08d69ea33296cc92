"""Running the imggw command in-process (Typer's CliRunner), stdout and stderr kept apart, and
checking on every run that the API key was never printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from typer.testing import CliRunner

from imggw_cli._app import app

CANARY = "sk-canary-cli-7f3e2d1c0b9a"


class Run:
    def __init__(self, result: Any) -> None:
        self.code: int = result.exit_code
        self.out: str = result.stdout
        self.err: str = result.stderr
        self.exception: BaseException | None = result.exception
        assert CANARY not in self.out + self.err, "the API key was printed"

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]


def imggw(
    *args: str, env: dict[str, str | None] | None = None, stdin: str | bytes | None = None
) -> Run:
    environment: dict[str, str | None] = {"IMGGW_API_KEY": CANARY, "IMGGW_BASE_URL": None}
    environment.update(env or {})
    return Run(CliRunner().invoke(app, list(args), env=environment, input=stdin))


def imggw_batch(
    source: object, out: object, base_url: str, *args: str, env: dict[str, str | None] | None = None
) -> Run:
    """``imggw batch SOURCE -o OUT --base-url URL`` with ``args`` after it."""
    return imggw("batch", str(source), "-o", str(out), "--base-url", base_url, *args, env=env)


IMGGW = [sys.executable, "-m", "imggw_cli"]  # the command in a process of its own


def process_env(api_key: str, **extra: str) -> dict[str, str]:
    """This process's environment without any IMGGW_ setting, with ``api_key`` as the key."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("IMGGW_")}
    return {**base, "IMGGW_API_KEY": api_key, "PYTHONUNBUFFERED": "1", **extra}


def on_a_terminal(
    args: Sequence[str], env: dict[str, str], timeout: float = 120
) -> tuple[int, str, str]:
    """The command with its stderr a pseudo-terminal (where the text form draws with rich):
    its exit code, stdout, and what reached the terminal."""
    import pty  # POSIX only

    parent, child = pty.openpty()
    process = subprocess.Popen(
        [*IMGGW, *args],
        stdout=subprocess.PIPE,
        stderr=child,
        env={**env, "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(child)
    drawn = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out, _ = process.communicate(timeout=timeout)
    reader.join(timeout=10)
    os.close(parent)
    return process.returncode, out.decode(), drawn.decode("utf-8", "replace")
