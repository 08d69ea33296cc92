"""The output folder is ours alone and holds no secret (DESIGN 18): a folder made with another
key is refused, a damaged ledger names its safe remedy, no file holds the API key, and no
file is written through a symlink someone planted there."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sqlite3
import stat
import urllib.parse
from contextlib import closing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from imggw_cli._app import app
from imggw_client import PollPolicy
from imggw_client._base_client import key_fingerprint
from imggw_client._journal.schema import RUN_NAME
from imggw_client.batch import (
    LEDGER_NAME,
    KeyChangedError,
    StorageError,
    run_shard,
    write_gallery,
    write_manifest,
)
from imggw_client.batch._identity import LINES_NAME
from imggw_client.batch._ledger import LOCK_NAME
from imggw_client.batch.scale._storage import Storage
from imggw_client.mock import MockGateway, MockRequest, MockResponse

KEY_A = "sk-folder-key-a-0001"
KEY_B = "sk-folder-key-b-0002"

pytestmark = pytest.mark.gateway(api_keys=[KEY_A], duration_min=0.01, duration_max=0.05)


def invoke(key: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"IMGGW_API_KEY": key, "IMGGW_BASE_URL": None})
    return result.exit_code, result.stdout, result.stderr


def prompts(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def ledger_rows(folder: Path) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(folder / LEDGER_NAME)) as db:
        return db.execute(
            "SELECT line, task_id, state, error_code, error_message, changed FROM tasks "
            "ORDER BY line"
        ).fetchall()


# ---------------------------------------------------------------------------- another key


@pytest.mark.slow
@pytest.mark.gateway(api_keys=[KEY_A, KEY_B], duration_min=5, duration_max=5)
def test_a_folder_made_with_another_key_is_refused_and_resumes_with_its_own(
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
) -> None:
    gw, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat", "a dog"])
    out = tmp_path / "out"
    code, _, err = invoke(
        KEY_A, "batch", str(source), "-o", str(out), "--base-url", url, "-t", "0.5"
    )
    assert code == 3, err  # both tasks still run: left to the next run
    run = json.loads((out / RUN_NAME).read_text())
    fp_a, fp_b = key_fingerprint(KEY_A), key_fingerprint(KEY_B)
    assert run["key_fingerprint"] == fp_a
    before = ledger_rows(out)
    sent = gw.stats()["requests"]

    code, stdout, err = invoke(KEY_B, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 4, err
    assert fp_a[:12] in err
    assert fp_b[:12] in err
    assert KEY_A not in stdout + err
    assert KEY_B not in stdout + err
    assert ledger_rows(out) == before  # nothing marked failed, nothing touched
    assert gw.stats()["requests"] == sent  # refused before anything was sent
    assert json.loads((out / RUN_NAME).read_text())["key_fingerprint"] == fp_a

    gw.configure(duration_min=0.01, duration_max=0.05)
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 0, err
    assert gw.stats()["tasks_created"] == 2  # resumed, not submitted again


@pytest.mark.slow
@pytest.mark.gateway(api_keys=[KEY_A, KEY_B])
def test_a_shard_of_a_run_made_with_another_key_is_refused(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = prompts(tmp_path / "in.txt", ["a cat", "a dog"])
    out = tmp_path / "out"
    fast = {"poll": PollPolicy(initial_interval=0.02, max_interval=0.1)}

    def shard(key: str, index: int) -> int:
        report = run_shard(
            source,
            out,
            index=index,
            count=2,
            client_factory=lambda: gateway.async_client(api_key=key, **fast),
        )
        return int(report.exit_code)

    assert shard(KEY_A, 1) == 0
    assert json.loads((out / RUN_NAME).read_text())["key_fingerprint"] == key_fingerprint(KEY_A)
    with pytest.raises(KeyChangedError) as refused:
        shard(KEY_B, 2)
    assert refused.value.fingerprint_was == key_fingerprint(KEY_A)
    assert refused.value.fingerprint == key_fingerprint(KEY_B)
    assert gateway.stats()["tasks_created"] == 1
    assert shard(KEY_A, 2) == 0


@pytest.mark.slow
@pytest.mark.gateway(api_keys=[KEY_A, KEY_B])
def test_a_run_record_without_a_fingerprint_works_and_gets_it(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat"])
    out = tmp_path / "out"
    assert invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)[0] == 0
    run = json.loads((out / RUN_NAME).read_text())
    del run["key_fingerprint"]  # as an older imggw wrote it
    (out / RUN_NAME).write_text(json.dumps(run))
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 0, err
    kept = json.loads((out / RUN_NAME).read_text())
    assert kept["key_fingerprint"] == key_fingerprint(KEY_A)
    assert kept["run_id"] == run["run_id"]
    code, _, err = invoke(KEY_B, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 4, err


@pytest.mark.slow
def test_a_run_record_whose_fingerprint_is_not_one_is_refused_unprinted(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    """The folder's writer chose it: a fingerprint that is not hex never reaches a message."""
    gw, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat"])
    out = tmp_path / "out"
    assert invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)[0] == 0
    run = json.loads((out / RUN_NAME).read_text())
    run["key_fingerprint"] = "\x1b]0;owned\x07" + "a" * 20
    (out / RUN_NAME).write_text(json.dumps(run))
    created = gw.stats()["tasks_created"]
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert gw.stats()["tasks_created"] == created
    assert code == 2, err
    assert "key fingerprint is not one" in err
    assert "\x1b" not in err
    assert "owned" not in err


@pytest.mark.slow
def test_a_run_record_whose_surface_is_not_one_is_refused_unprinted(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    """The run's surface picks where a rerun's requests go: one the spec does not name is a
    damaged record, refused before anything is sent and never printed."""
    gw, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat"])
    out = tmp_path / "out"
    assert invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)[0] == 0
    run = json.loads((out / RUN_NAME).read_text())
    run["surface"] = "../gamma\x1b[2J"
    (out / RUN_NAME).write_text(json.dumps(run))
    requests = sum(gw.stats()["requests"].values())
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert sum(gw.stats()["requests"].values()) == requests
    assert code == 2, err
    assert "surface is not one" in err
    assert "gamma" not in err
    assert "\x1b" not in err


# ---------------------------------------------------------------------------- a damaged ledger


@pytest.mark.parametrize("where", ["header", "pages"])
@pytest.mark.slow
def test_a_damaged_ledger_says_deleting_it_is_safe_and_it_is(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, where: str
) -> None:
    gw, url = served_gateway
    source = prompts(tmp_path / "in.txt", [f"a cat {i}" for i in range(40)])
    out = tmp_path / "out"
    assert invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)[0] == 0
    ledger = out / LEDGER_NAME
    data = bytearray(ledger.read_bytes())
    assert len(data) >= 3 * 4096
    if where == "header":  # no database at all any more
        data[:100] = b"\xa5" * 100
    else:  # the database's pages past the first, as a write cut short leaves them
        data[4096:] = b"\xa5" * (len(data) - 4096)
    ledger.write_bytes(bytes(data))
    for suffix in ("-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)
    created = gw.stats()["tasks_created"]

    for _ in range(2):  # the same words on every rerun: a remedy, not a loop
        code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
        assert code == 4, err
        assert "damaged" in err
        assert "Deleting it is safe" in err
        assert f"{LEDGER_NAME}-wal" in err
        assert "never billed twice" in err
        assert gw.stats()["tasks_created"] == created

    for path in out.glob(f"{LEDGER_NAME}*"):  # what the message says to do
        path.unlink()
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 0, err
    assert gw.stats()["tasks_created"] == 40  # every task replayed, none billed again


# ---------------------------------------------------------------------------- keys in links


def key_in_links(gw: MockGateway, key: str, carried: str, fetched: list[str]) -> dict[str, bool]:
    """Makes the gateway hostile: every result link it hands out carries the API key (as a
    query value or a path segment), and a link without the very key is refused. Results are
    unreachable while ``down`` is set; every result path fetched is kept."""
    handle = gw.handle
    state = {"down": True}
    marker = f"/k/{key}"

    def hostile(request: MockRequest) -> MockResponse:
        path, _, query = request.path.partition("?")
        params = {**dict(urllib.parse.parse_qsl(query)), **request.query}
        if "/results/" in path:
            fetched.append(request.path)
            if carried == "path":
                found, _, rest = path.partition("/results/")
                if found != marker:
                    return MockResponse(403, b"forbidden")
                request = dataclasses.replace(request, path=f"/results/{rest}?{query}")
            elif params.get("api_key") != key:
                return MockResponse(403, b"forbidden")
            if state["down"]:
                return MockResponse(503, b"try later")
            return handle(request)
        answer = handle(request)
        if carried == "path":
            body = answer.body.replace(b"/results/", f"{marker}/results/".encode())
        else:
            body = answer.body.replace(b".png?", f".png?api_key={key}&".encode())
        return dataclasses.replace(answer, body=body)

    gw.handle = hostile  # type: ignore[method-assign]
    return state


def no_file_holds(folder: Path, secret: str) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_a_ledger_that_kept_the_key_in_clear_has_it_wiped(tmp_path: Path) -> None:
    gw = MockGateway(api_keys=[KEY_A], duration_min=0.01, duration_max=0.05)
    fetched: list[str] = []
    state = key_in_links(gw, KEY_A, "query", fetched)
    source = prompts(tmp_path / "in.txt", ["a cat", "a dog", "not ok #fail"])
    out = tmp_path / "out"
    with gw.serve() as url:
        code, _, err = invoke(
            KEY_A, "batch", str(source), "-o", str(out), "--base-url", url, "-t", "1.5"
        )
        assert code == 3, err
        with closing(sqlite3.connect(out / LEDGER_NAME)) as db, db:  # as older versions kept it
            db.execute("UPDATE tasks SET urls = replace(urls, '[redacted]', ?)", (KEY_A,))
            # A line no later run touches again, with a link as an older version kept it.
            link = json.dumps([f"{url}/results/x.png?api_key={KEY_A}"])
            db.execute("UPDATE tasks SET urls = ? WHERE state = 'failed'", (link,))
            db.execute("DELETE FROM meta WHERE key = 'links_blanked'")  # older: no such mark
        assert KEY_A.encode() in b"".join(p.read_bytes() for p in out.glob(f"{LEDGER_NAME}*"))
        (out / LEDGER_NAME).chmod(0o644)  # and with the mode they made it
        state["down"] = False
        code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
        assert code == 3, err  # the failed line's old link is looked at again: not saved
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["succeeded", "succeeded", "running"]
    no_file_holds(out, KEY_A)
    assert stat.S_IMODE((out / LEDGER_NAME).stat().st_mode) == 0o600


@pytest.mark.parametrize("carried", ["query", "path"])
@pytest.mark.slow
def test_links_carrying_the_key_are_kept_blanked_and_asked_for_again(
    tmp_path: Path, carried: str
) -> None:
    gw = MockGateway(api_keys=[KEY_A], duration_min=0.01, duration_max=0.05)
    fetched: list[str] = []
    state = key_in_links(gw, KEY_A, carried, fetched)
    source = prompts(tmp_path / "in.txt", ["a cat", "a dog", "a fox"])
    out = tmp_path / "out"
    with gw.serve() as url:
        code, _, err = invoke(
            KEY_A, "batch", str(source), "-o", str(out), "--base-url", url, "-t", "1.5"
        )
        assert code == 3, err  # the results could not be fetched yet: left for the next run
        assert fetched  # the key-bearing links were tried
        no_file_holds(out, KEY_A)
        with closing(sqlite3.connect(out / LEDGER_NAME)) as db:
            urls = [json.loads(u) for (u,) in db.execute("SELECT urls FROM tasks")]
        assert all(link and all("[redacted]" in u for u in link) for link in urls)

        state["down"] = False
        fetched.clear()
        code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
        assert code == 0, err
        assert len(fetched) == 3  # one fresh link per result, asked for by a query
        assert not any("redacted" in path for path in fetched)  # no blanked link sent
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["succeeded"] * 3
    assert all((out / f["path"]).stat().st_size > 0 for r in rows for f in r["files"])
    no_file_holds(out, KEY_A)
    for name in (LEDGER_NAME, f"{LEDGER_NAME}-wal", f"{LEDGER_NAME}-shm"):
        if (out / name).exists():
            assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert (out / LEDGER_NAME).exists()


# ---------------------------------------------------------------------------- planted links

PLANTED = [
    LEDGER_NAME,
    f"{LEDGER_NAME}-wal",
    f"{LEDGER_NAME}-shm",
    "manifest.jsonl",
    RUN_NAME,
    LINES_NAME,
    "index.html",
    "gallery",
    "bad-lines.txt",
    LOCK_NAME,
]


def outside(tmp_path: Path) -> tuple[Path, bytes]:
    """A file of the user's, outside the output folder: what a planted link points at."""
    target = tmp_path / "elsewhere" / "bashrc"
    target.parent.mkdir()
    content = b"# the user's own file\nexport PATH=$HOME/bin:$PATH\n"
    target.write_bytes(content)
    return target, content


@pytest.mark.parametrize("fresh", [True, False], ids=["new-folder", "rerun"])
@pytest.mark.parametrize("name", PLANTED)
@pytest.mark.slow
def test_a_planted_symlink_stops_the_run_and_is_never_followed(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, name: str, fresh: bool
) -> None:
    gw, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat", "a dog"])
    out = tmp_path / "out"
    target, content = outside(tmp_path)
    if not fresh:
        code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
        assert code == 0, err
    out.mkdir(exist_ok=True)
    planted = out / name
    if planted.is_dir():
        os.rename(planted, tmp_path / "gallery-was")
    planted.unlink(missing_ok=True)
    planted.symlink_to(target.parent if name == "gallery" else target)
    created = gw.stats()["tasks_created"]
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 4, err
    assert str(planted) in err
    assert "symbolic link" in err
    assert gw.stats()["tasks_created"] == created  # refused before anything was sent
    assert target.read_bytes() == content
    assert os.listdir(target.parent) == ["bashrc"]  # nothing written beside it either
    assert planted.is_symlink()  # left for its owner to look at


def test_each_writer_refuses_a_link_where_its_file_goes(tmp_path: Path) -> None:
    """The writers themselves refuse, whatever checked before them: a link planted while a
    run goes (after its first check) is refused by the write that would follow it."""
    target, content = outside(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for name, write in [
        ("manifest.jsonl", lambda: write_manifest(out, [{"line": 1}])),
        ("index.html", lambda: write_gallery(out, [{"line": 1}])),
        (RUN_NAME, lambda: Storage(out).write(RUN_NAME, b"{}")),
        (LINES_NAME, lambda: Storage(out).read(LINES_NAME)),
    ]:
        (out / name).symlink_to(target)
        with pytest.raises(StorageError, match=re.escape(str(out / name))):
            write()
        (out / name).unlink()
    shutil.rmtree(out / "gallery")  # as the run above left it: planted over
    (out / "gallery").symlink_to(target.parent, target_is_directory=True)
    with pytest.raises(StorageError, match="symbolic link"):
        write_gallery(out, [{"line": 1}])
    assert target.read_bytes() == content
    assert os.listdir(target.parent) == ["bashrc"]


def test_the_manifest_is_written_under_an_unpredictable_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved: list[str] = []
    replace = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        moved.append(Path(src).name)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_manifest(tmp_path, [{"line": 1}])
    write_manifest(tmp_path, [{"line": 1}])
    assert len(moved) == 2
    assert moved[0] != moved[1]
    assert str(os.getpid()) not in moved[0]
    random = re.fullmatch(r"\.manifest\.jsonl\.([0-9a-f]+)\.part", moved[0])
    assert random is not None
    assert len(random[1]) * 4 >= 64  # bits no one guesses to plant a link there first


@pytest.mark.slow
def test_a_link_planted_as_the_incoming_folder_removes_nothing_where_it_points(
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
) -> None:
    """A rerun sweeps partial downloads, in the folder and in its incoming folder: a link
    planted as ``.incoming`` must stop the run before the sweep reaches what it points at."""
    _, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat"])
    out = tmp_path / "out"
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / ".keep.part").write_bytes(b"the user's own file")
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 0, err
    (out / ".incoming").symlink_to(victim)
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 4, err
    assert str(out / ".incoming") in err
    assert "symbolic link" in err
    assert (victim / ".keep.part").read_bytes() == b"the user's own file"


def test_a_link_planted_over_a_saved_image_is_refused_not_counted_as_saved(
    served_gateway: tuple[MockGateway, str],
    tmp_path: Path,
) -> None:
    """A co-user replaces a saved image by a link to a file of the same size: a rerun would
    take it for the image (the paid result never saved again). It stops, naming the link."""
    _, url = served_gateway
    source = prompts(tmp_path / "in.txt", ["a cat"])
    out = tmp_path / "out"
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 0, err
    [image] = [p for p in out.iterdir() if p.suffix == ".png"]
    decoy = tmp_path / "elsewhere.png"
    decoy.write_bytes(b"x" * image.stat().st_size)
    image.unlink()
    image.symlink_to(decoy)
    code, _, err = invoke(KEY_A, "batch", str(source), "-o", str(out), "--base-url", url)
    assert code == 4, err
    assert str(image) in err
    assert "symbolic link" in err
    assert decoy.read_bytes() == b"x" * decoy.stat().st_size
