"""``imggw mock serve`` is a command like every other (DESIGN 21): its help in the same style,
each default shown, every setting of the gateway an option, with the gateway's own default."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer.main

from imggw_cli import _mock
from imggw_cli._app import app
from imggw_client import mock
from imggw_client.mock import MockConfig

from .helpers import imggw


def serve_options() -> dict[str, Any]:
    """The options of `imggw mock serve`, by the setting each sets."""
    command: Any = typer.main.get_command(app)
    serve = command.commands["mock"].commands["serve"]
    return {param.name: param for param in serve.params if param.name not in ("help",)}


def test_mock_serve_help_is_the_commands_style_with_every_default() -> None:
    shown = imggw("mock", "serve", "--help")
    assert shown.code == 0, shown.err
    assert shown.out.startswith("Usage: imggw mock serve [OPTIONS]")
    text = " ".join(shown.out.split())
    for said in (
        "--host HOST Interface to bind. [default: 127.0.0.1]",
        "--port PORT Port (0 picks a free one). [default: 8080]",
        "--api-key KEY An accepted API key (repeatable). [default: (test-",
        "--seed N",
        "[default: 86400.0]",
        "--submit-limit N/S",
        "[default: lost,reset,latency,429,500,502,503,504,malformed]",
        "-h, --help",
        "Example: imggw mock serve --port 8080",
        "Exit codes: 0 stopped by Ctrl-C; 1 could not serve",
    ):
        assert said in text, said
    assert imggw("mock", "serve", "-h").out == shown.out


def test_every_gateway_setting_is_an_option_with_the_gateways_default() -> None:
    options = serve_options()
    settings = {f.name: f.default for f in dataclasses.fields(MockConfig)}
    assert set(options) == {"host", "port", *settings}
    assert (options["host"].default, options["port"].default) == ("127.0.0.1", 8080)
    for name, default in settings.items():
        flag = "--api-key" if name == "api_keys" else "--" + name.replace("_", "-")
        assert options[name].opts == [flag], name
        given = options[name].default
        if name == "api_keys":  # none given: the gateway's own, which the help names
            assert given is None
            assert options[name].show_default == ",".join(default)
        elif isinstance(default, tuple):
            assert tuple(part for part in given.split(",") if part) == default, name
        else:
            assert given == default, name
    assert (_mock.FAULT_KINDS, _mock.QUIRKS) == (mock.FAULT_KINDS, mock.QUIRKS)


def test_a_bad_setting_exits_2_in_one_line() -> None:
    bad = imggw("mock", "serve", "--port", "0", "--failure-rate", "3")
    assert bad.code == 2
    assert bad.err == "error: failure_rate must be within 0..1\n"
    assert bad.out == ""
    typo = imggw("mock", "serve", "--port", "not-a-port")
    assert typo.code == 2
    assert "Invalid value for '--port'" in typo.err
