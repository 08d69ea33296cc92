"""The pytest fixtures are opt-in (DESIGN 23): installing imggw adds nothing to another
project's test runs; ``-p imggw_client.mock.pytest_plugin`` or ``pytest_plugins`` in a conftest
brings them. Each test runs pytest as that project would: in a folder of its own, in a process
of its own, with the plugins this environment has installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = "imggw_client.mock.pytest_plugin"

# Prints, at the end of the session, every module of imggw that the run imported.
REPORTING_CONFTEST = """\
import sys

def pytest_sessionfinish(session):
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("imggw_client", "imggw_cli"))
    print(f"\\nimggw modules loaded: {loaded}")
"""

USES_THE_FIXTURES = """\
def test_my_app(imggw_client, imggw_gateway):
    task = imggw_client.generate("a lighthouse")
    assert task.status.value == "succeeded"
    assert imggw_gateway.stats()["tasks_created"] == 1
"""


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest run in ``folder`` (its own rootdir), with none of this run's PYTEST_ settings,
    which could turn plugin loading off or bring plugins of their own."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# A pytest process of its own takes about a second to start with this environment's plugins.
@pytest.mark.slow
def test_another_projects_test_run_imports_nothing_of_imggw(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(REPORTING_CONFTEST)
    (tmp_path / "test_theirs.py").write_text("def test_nothing():\n    pass\n")
    done = pytest_in(tmp_path, "--co", "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "test_theirs.py::test_nothing"
    assert "imggw modules loaded: []" in lines


@pytest.mark.slow
def test_without_opting_in_the_fixtures_are_unknown(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(USES_THE_FIXTURES)
    done = pytest_in(tmp_path, "-q")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fixture 'imggw_client' not found" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("opt_in", ["-p", "pytest_plugins"])
def test_opting_in_gives_the_fixtures(tmp_path: Path, opt_in: str) -> None:
    (tmp_path / "test_mine.py").write_text(USES_THE_FIXTURES)
    if opt_in == "-p":
        done = pytest_in(tmp_path, "-q", "-p", PLUGIN)
    else:
        (tmp_path / "conftest.py").write_text(f"pytest_plugins = [{PLUGIN!r}]\n")
        done = pytest_in(tmp_path, "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("1 passed in ")
