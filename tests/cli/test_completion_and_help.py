"""What a shell user expects of the command (DESIGN 21): a completion script for bash, zsh and
fish that completes from imggw itself; IMGGW_SURFACE; a ``--help`` that lists only the global
options a command uses and shows an example."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from imggw_client.mock import MockGateway

from .helpers import IMGGW, imggw, process_env


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_that_asks_imggw(shell: str) -> None:
    run = imggw("completion", shell)
    assert run.code == 0, run.err
    assert "_IMGGW_COMPLETE" in run.out
    assert run.err == ""


def test_completion_of_an_unknown_shell_is_a_usage_error() -> None:
    assert imggw("completion", "tcsh").code == 2


def _complete(words: str, cword: int) -> list[str]:
    env = {
        **process_env("unused"),
        "_IMGGW_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(cword),
    }
    done = subprocess.run(IMGGW, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.slow
def test_the_script_completes_commands_and_choices_from_imggw_itself() -> None:
    assert _complete("imggw ta", 1) == ["tasks"]
    assert _complete("imggw generate x --surface ", 4) == ["alpha", "beta"]
    assert "16:9" in _complete("imggw generate x --aspect-ratio ", 4)


@pytest.mark.slow
def test_bash_loads_the_script_and_completes_through_it() -> None:
    """The script as bash runs it: ``imggw`` found on PATH (the venv's entry point)."""
    bash = shutil.which("bash")
    assert bash is not None
    script = imggw("completion", "bash").out
    program = script + (
        "\nCOMP_WORDS=(imggw tas); COMP_CWORD=1; _imggw_completion imggw\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    bin_dir = os.path.dirname(IMGGW[0])
    env = {**process_env("unused"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        [bash, "-c", program], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tasks"]


@pytest.mark.gateway(api_keys=["sk-surface-test-0001"], duration_min=0.01, duration_max=0.02)
def test_imggw_surface_chooses_the_surface_and_an_option_beats_it(
    served_gateway: tuple[MockGateway, str],
) -> None:
    gw, url = served_gateway
    env = {"IMGGW_API_KEY": "sk-surface-test-0001", "IMGGW_SURFACE": "alpha"}
    sent = imggw("submit", "a fox", "--base-url", url, "--json", env=env)
    assert sent.code == 0, sent.err
    assert sent.records()[0]["surface"] == "alpha"
    beta = imggw("submit", "a fox", "--base-url", url, "--json", "--surface", "beta", env=env)
    assert beta.records()[0]["surface"] == "beta"
    requests = gw.stats()["requests"]
    assert any(path.startswith("POST /alpha") for path in requests)
    bad = imggw("status", "1", "--mock", env={"IMGGW_SURFACE": "gamma"})
    assert bad.code == 2
    assert "IMGGW_SURFACE" in bad.err


@pytest.mark.parametrize(
    ("command", "absent"),
    [
        (
            ["gallery"],
            [
                "--rate",
                "--query-rate",
                "--rate-store",
                "--mock",
                "--surface",
                "--base-url",
                "--no-journal",
            ],
        ),
        (
            ["tasks"],
            ["--rate", "--query-rate", "--rate-store", "--mock", "--surface", "--base-url"],
        ),
    ],
)
def test_a_command_lists_only_the_global_options_it_uses(
    command: list[str], absent: list[str]
) -> None:
    text = imggw(*command, "--help").out
    for flag in absent:
        assert flag not in text, (command, flag)
    assert "--json" in text
    assert "--log-format" in text
    refused = imggw(*command, "x", "--rate", "5")
    assert refused.code == 2


@pytest.mark.parametrize(
    "command",
    [
        ["generate"],
        ["submit"],
        ["status"],
        ["poll"],
        ["wait"],
        ["download"],
        ["tasks"],
        ["tasks", "collect"],
        ["gallery"],
        ["completion"],
    ],
)
def test_each_commands_help_shows_an_example(command: list[str]) -> None:
    text = imggw(*command, "--help").out
    assert "Example: imggw " + command[0] in " ".join(text.split())
