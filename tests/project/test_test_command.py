"""The README's test command is the one CI runs, byte for byte, and it runs every lane: a bare
`pytest` runs only the fast lane (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START, END = "# --- the README's test command, verbatim ---\n", "# ---\n"


def section(readme: str, title: str) -> list[str]:
    return readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0].splitlines()


def test_the_readme_gives_the_command_ci_runs_and_it_runs_every_lane() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    (command,) = script.split(START, 1)[1].split(END, 1)[0].strip().splitlines()
    readme = (ROOT / "README.md").read_text()
    assert command in section(readme, "Quickstart")
    assert command in section(readme, "Development")
    assert "pytest -q --all" in command
    assert command.endswith(" -n auto")  # every core: the whole suite stays well under 10 min
