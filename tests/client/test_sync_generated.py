"""The blocking client is generated from the asynchronous one (scripts/unasync.py): the
committed ``_client.py`` is what the script makes, and it reads right for sync users."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imggw_client import AsyncClient, Client

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "unasync.py"
GENERATED = ROOT / "src" / "imggw_client" / "_client.py"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )


def test_the_committed_sync_client_is_what_the_script_generates() -> None:
    done = check()
    assert done.returncode == 0, (
        "src/imggw_client/_client.py has drifted from _async_client.py; run "
        f"`python scripts/unasync.py`\n{done.stdout}{done.stderr}"
    )


def test_a_hand_edit_of_the_generated_file_fails_the_check_with_a_diff(tmp_path: Path) -> None:
    edited = tmp_path / "_client.py"
    shutil.copy(GENERATED, edited)
    text = edited.read_text()
    edited.write_text(text.replace("Thread-safe: share", "Share", 1))
    done = check("--target", str(edited))
    assert done.returncode == 1
    assert "-    Share one client between threads." in done.stdout
    assert "+    Thread-safe: share one client between threads." in done.stdout


def test_the_generated_file_says_where_it_comes_from() -> None:
    head = GENERATED.read_text().splitlines()[0]
    assert head.startswith("# Generated from src/imggw_client/_async_client.py")
    assert "python scripts/unasync.py" in head
    assert "do not edit" in head


@pytest.mark.parametrize("name", [n for n in dir(Client) if not n.startswith("_")])
def test_the_sync_docstrings_speak_of_the_sync_client(name: str) -> None:
    doc = inspect.getdoc(getattr(Client, name)) or ""
    for word in ("await", "async ", "AsyncClient", "coroutine", "anyio", "between tasks"):
        assert word not in doc, (name, word)


def test_each_client_names_its_own_httpx_client() -> None:
    assert "``httpx.Client``" in (Client.__doc__ or "")
    assert "``httpx.AsyncClient``" in (AsyncClient.__doc__ or "")
    assert "httpx.Client`" not in (AsyncClient.__doc__ or "")  # the drift this ended
    assert "between threads" in (Client.__doc__ or "")
    assert "between tasks" in (AsyncClient.__doc__ or "")
