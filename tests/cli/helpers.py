"""Running the imggw command in-process (Typer's CliRunner), stdout and stderr kept apart, and
checking on every run that the API key was never printed."""

from __future__ import annotations

import json
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
