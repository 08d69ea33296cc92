"""The journal is the user's alone (DESIGN 22): a folder or file another user could write
(writable by group or others, owned by another user, or reached through a symbolic link) is
refused before anything is sent (``ConfigurationError``, code ``journal_unsafe``, naming the path
and what to do); the folders the journal needs are made 0700; a relative ``XDG_STATE_HOME`` is
ignored, as the XDG spec says. Over a real loopback socket."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from imggw_client import AsyncClient, Client, ConfigurationError
from imggw_client.mock import MockGateway

from ..journals import KEY

Plant = Callable[[Path], Path]  # makes an unsafe place in a folder; returns the journal's path


def world_writable_folder(root: Path) -> Path:
    folder = root / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    return folder / "journal.sqlite"


def group_writable_file(root: Path) -> Path:
    path = root / "journal.sqlite"
    path.write_bytes(b"")
    path.chmod(0o666)  # planted: anyone may have written its rows
    return path


def linked_folder(root: Path) -> Path:
    real = root / "real"
    real.mkdir(mode=0o700)
    (root / "state").symlink_to(real)
    return root / "state" / "journal.sqlite"


def foreign_folder(root: Path) -> Path:
    folder = root / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)  # nobody's
    return folder / "journal.sqlite"


UNSAFE: list[tuple[Plant, str]] = [
    (world_writable_folder, "writable by group and others (mode 0777)"),
    (group_writable_file, "writable by group and others (mode 0666)"),
    (linked_folder, "symbolic link"),
    pytest.param(
        foreign_folder,
        "belongs to another user",
        marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder away"),
    ),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("plant", "problem"), UNSAFE)
def test_a_journal_another_user_could_write_is_refused_before_sending(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, plant: Plant, problem: str
) -> None:
    gw, url = served_gateway
    path = plant(tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        Client(KEY, url, journal=path)
    assert refused.value.code == "journal_unsafe"
    assert problem in refused.value.message
    assert str(path.parent) in refused.value.message
    assert KEY not in refused.value.message

    async def submit() -> None:  # an AsyncClient opens it on first use: still before sending
        async with AsyncClient(KEY, url, journal=path) as client:
            await client.submit("a fox")

    with pytest.raises(ConfigurationError) as again:
        anyio.run(submit)
    assert again.value.code == "journal_unsafe"
    assert sum(gw.stats()["requests"].values()) == 0


def test_the_remedy_is_named(tmp_path: Path) -> None:
    path = world_writable_folder(tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        Client(KEY, "http://127.0.0.1:9", journal=path)
    assert f"chmod 700 {path.parent}" in refused.value.message
    assert "IMGGW_JOURNAL" in refused.value.message
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    planted = group_writable_file(other)
    with pytest.raises(ConfigurationError) as file_refused:
        Client(KEY, "http://127.0.0.1:9", journal=planted)
    assert f"chmod 600 {planted}" in file_refused.value.message


def test_missing_folders_are_made_the_users_alone(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c" / "journal.sqlite"
    Client(KEY, "http://127.0.0.1:9", journal=path).close()
    for folder in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.parametrize("relative", ["state", "./state", "~/state"])
def test_a_relative_xdg_state_home_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: str
) -> None:
    from imggw_cli._runtime import journal_path

    monkeypatch.delenv("IMGGW_JOURNAL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", relative)
    assert journal_path() == tmp_path / "home" / ".local" / "state" / "imggw" / "journal.sqlite"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert journal_path() == tmp_path / "xdg" / "imggw" / "journal.sqlite"
