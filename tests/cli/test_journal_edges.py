"""The command line's side of the journal's edges (DESIGN 22): a submit older than the gateway's
memory of keys named and not sent, a journal others could write refused before anything is
sent, old final rows pruned, a listing that shows the newest 50 fast and ends quietly on a
closed pipe, ``download --from`` and ``status`` telling the journal what they see, and a
collect that says where the tasks of another key or gateway are."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from imggw_client._journal.lease import HOST
from imggw_client.mock import MockGateway

from ..journals import rows
from .helpers import CANARY, IMGGW, imggw, process_env

OTHER_KEY = "sk-canary-cli-other-5a6b7c8d"


def journal_file() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "imggw" / "journal.sqlite"


def posts(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if route.startswith("POST"))


def result_fetches(gw: MockGateway) -> int:
    return sum(n for route, n in gw.stats()["requests"].items() if "{token}" in route)


def age(path: Path, seconds: float, **where: Any) -> None:
    """Moves the rows ``where`` matches (all of them without) ``seconds`` into the past: their
    first send, their answer and their last change, as if written then."""
    clause = " AND ".join(f"{name} = ?" for name in where) or "1"
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
        moved = [c for c in ("created", "submitted_at", "changed") if c in columns]
        sets = ", ".join(f"{c} = {c} - ?" for c in moved)
        db.execute(
            f"UPDATE tasks SET {sets} WHERE {clause}", (*[seconds] * len(moved), *where.values())
        )


def submitted(url: str, prompt: str = "a fox", *more: str) -> str:
    sent = imggw("submit", "-q", prompt, "--base-url", url, *more)
    assert sent.code == 0, sent.err
    return sent.out.strip()


def wait_done(url: str, task_id: str) -> None:
    """The task waited on without the journal hearing of it (another machine's wait)."""
    done = imggw("poll", task_id, "--base-url", url, "--no-journal")
    assert done.code == 0, done.err


# ---------------------------------------------------------------------------- key memory


@pytest.mark.gateway(duration_min=0.01, duration_max=0.02)
def test_collect_names_a_submit_older_than_the_key_memory_sends_nothing_and_exits_1(
    served_gateway: tuple[MockGateway, str], no_backoff: list[float], tmp_path: Path
) -> None:
    gw, url = served_gateway
    gw.configure(fault_rate=1.0, faults=["lost"])  # the task is made, its answer lost
    lost = imggw("submit", "a paid fox", "-a", "16:9", "--base-url", url)
    assert lost.code == 5, lost.err
    gw.configure(fault_rate=0.0)
    (row,) = rows(journal_file())
    assert row["state"] == "unknown"
    age(journal_file(), 2 * 86400)  # sent two days ago: the gateway forgot the key
    sent_before = posts(gw)
    collected = imggw("tasks", "collect", "-o", str(tmp_path), "--base-url", url)
    assert posts(gw) == sent_before  # never sent again: it could be billed twice
    assert collected.code == 1, collected.err
    key = row["idempotency_key"]
    assert f"idempotency key {key}" in collected.err
    command = collected.err.split("send it yourself (a second task may be billed): ", 1)[1]
    words = shlex.split(command.split(" (its prompt", 1)[0])
    assert words == [
        "imggw",
        "submit",
        "PROMPT",
        "--surface",
        "beta",
        "--aspect-ratio",
        "16:9",
        "--resolution",
        "1k",
        "--idempotency-key",
        key,
        "--base-url",
        url,
    ]
    assert "a paid fox" not in collected.err
    assert rows(journal_file())[0]["state"] == "unknown"  # kept, with its key


# ---------------------------------------------------------------------------- a journal of one's own


def _unsafe_folder(state: Path) -> None:
    folder = state / "imggw"
    folder.mkdir()
    folder.chmod(0o777)


def _planted_file(state: Path) -> None:
    folder = state / "imggw"
    folder.mkdir(mode=0o700)
    (folder / "journal.sqlite").touch()
    (folder / "journal.sqlite").chmod(0o666)


def _linked_folder(state: Path) -> None:
    elsewhere = state / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (state / "imggw").symlink_to(elsewhere)


@pytest.mark.parametrize("make", [_unsafe_folder, _planted_file, _linked_folder])
@pytest.mark.parametrize("command", [["submit", "a fox", "--base-url"], ["tasks"]])
def test_a_journal_others_could_write_exits_4_naming_it_and_sends_nothing(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, make: Any, command: list[str]
) -> None:
    gw, url = served_gateway
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    make(state)
    words = [*command, url] if command[-1] == "--base-url" else command
    run = imggw(*words, env={"XDG_STATE_HOME": str(state)})
    assert run.code == 4, run.err
    assert str(state / "imggw") in run.err
    assert "nothing was sent" in run.err.lower()
    assert posts(gw) == 0
    assert gw.stats()["tasks_created"] == 0


def test_a_relative_xdg_state_home_is_ignored(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = served_gateway
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(mode=0o700)
    work.mkdir()
    monkeypatch.chdir(work)
    env = {"XDG_STATE_HOME": "state", "HOME": str(home)}
    assert imggw("submit", "a fox", "--base-url", url, env=env).code == 0
    assert not (work / "state").exists()
    assert len(rows(home / ".local" / "state" / "imggw" / "journal.sqlite")) == 1


# ---------------------------------------------------------------------------- prune


def test_prune_removes_old_final_rows_and_says_how_many(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    saved = submitted(url, "saved long ago")
    assert imggw("download", saved, "--wait", "-o", str(tmp_path), "--base-url", url).code == 0
    running = submitted(url, "still to collect")  # never final: never pruned, however old
    recent = submitted(url, "saved today")
    assert imggw("download", recent, "--wait", "-o", str(tmp_path), "--base-url", url).code == 0
    age(journal_file(), 40 * 86400, task_id=saved)
    age(journal_file(), 40 * 86400, task_id=running)
    age(journal_file(), 10 * 86400, task_id=recent)
    kept = imggw("tasks", "prune")  # 30 days by default
    assert kept.code == 0, kept.err
    assert kept.err.startswith("removed 1 task(s) finished more than 30 d ago")
    assert {r["task_id"] for r in rows(journal_file())} == {running, recent}
    pruned = imggw("tasks", "prune", "--older-than", "7d", "--json")
    assert pruned.code == 0, pruned.err
    (record,) = pruned.records()
    assert record == {"removed": 1, "older_than": 7 * 86400.0, "journal": str(journal_file())}
    assert [r["task_id"] for r in rows(journal_file())] == [running]


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("3600s", 3600)]
)
def test_prune_durations(text: str, seconds: float, monkeypatch: pytest.MonkeyPatch) -> None:
    from imggw_cli import _journal

    assert _journal.duration(text) == seconds


@pytest.mark.parametrize("bad", ["30", "3 days", "-1d", "1y", "nand", ""])
def test_a_bad_duration_exits_2_in_one_line(bad: str) -> None:
    run = imggw("tasks", "prune", "--older-than", bad)
    assert run.code == 2
    assert run.err.count("\n") == 1
    assert run.err.startswith("error: --older-than must be a duration such as 30d, 12h")
    assert not journal_file().exists()  # refused before the journal was opened


# ---------------------------------------------------------------------------- the listing


def planted(count: int, *, prompt: str = "prompt", files: list[str] | None = None) -> None:
    """``count`` journal rows made as the command line makes them (its first, then copies
    with their own keys and task ids, each a second newer than the last)."""
    path = journal_file()
    # Closed at the end, so that the rows are in the file, not in a log a reader must replay.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.row_factory = sqlite3.Row
        first = dict(db.execute("SELECT * FROM tasks ORDER BY row LIMIT 1").fetchone())
        first.pop("row")
        columns = list(first)
        made = []
        for n in range(count):
            row = {
                **first,
                "idempotency_key": f"key-{n:06d}",
                "task_id": str(10_000 + n),
                "created": first["created"] + n + 1,
                "prompt": f"{prompt} {n}",
                "state": "saved" if n % 2 else "running",
            }
            if files is not None:
                row["files"] = json.dumps(files)
            made.append(tuple(row[c] for c in columns))
        db.executemany(
            f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            made,
        )


def test_tasks_shows_the_newest_50_under_a_header_and_says_how_many_more(
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, url = served_gateway
    submitted(url, "the very first")
    planted(99, prompt="a prompt of many words that goes on " * 5 + "\x1b[31mred")
    run = imggw("tasks")
    assert run.code == 0, run.err
    header, *lines = run.out.splitlines()
    assert header.split() == ["TASK", "ID", "SURFACE", "STATE", "CREATED", "PROMPT", "FILES"]
    assert len(lines) == 50
    assert lines[0].split()[:3] == ["10098", "beta", "running"]  # newest first
    assert "\x1b" not in run.out
    assert max(len(line) for line in lines) < 160  # prompts cut short
    assert run.err == "50 of 100 tasks; --all or --limit N shows more\n"
    limited = imggw("tasks", "--limit", "3", "--json")
    assert [r["task_id"] for r in limited.records()] == ["10098", "10097", "10096"]
    assert limited.err == "3 of 100 tasks; --all or --limit N shows more\n"
    everything = imggw("tasks", "--all")
    assert len(everything.out.splitlines()) == 101
    assert everything.err == ""
    failed = imggw("tasks", "--state", "saved", "--state", "running", "--limit", "200", "--json")
    assert {r["state"] for r in failed.records()} == {"saved", "running"}
    assert len(failed.records()) == 99
    assert imggw("tasks", "--state", "saved", "--unfinished").out == ""


def test_tasks_refuses_an_unknown_state_and_all_with_limit(
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, url = served_gateway
    submitted(url)
    bad = imggw("tasks", "--state", "done")
    assert bad.code == 2
    assert bad.err.startswith("error: --state ")
    assert "not_found" in bad.err  # the states it knows are named
    both = imggw("tasks", "--all", "--limit", "3")
    assert both.code == 2
    assert both.err == "error: give --all or --limit N, not both\n"


def test_tasks_shows_saved_paths_absolute(
    served_gateway: tuple[MockGateway, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = served_gateway
    monkeypatch.chdir(tmp_path)
    made = imggw("generate", "a fox", "-o", "out", "--base-url", url)
    assert made.code == 0, made.err
    (entry,) = imggw("tasks", "--json").records()
    (path,) = entry["files"]
    assert Path(path).is_absolute()
    assert Path(path) == tmp_path / "out" / Path(path).name
    assert path in imggw("tasks").out


@pytest.mark.slow
def test_tasks_into_a_closed_pipe_ends_quietly_with_0(
    served_gateway: tuple[MockGateway, str],
) -> None:
    _, url = served_gateway
    submitted(url)
    planted(5000, files=["/a/long/path/to/a/result/file-0.png"] * 4)
    for words in (
        ["tasks", "--all"],
        ["tasks", "--all", "--json"],
        ["tasks", "--all", "--log-format", "json"],
    ):
        with subprocess.Popen(
            [*IMGGW, *words],
            env=process_env(CANARY),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as child:
            assert child.stdout is not None
            assert child.stderr is not None
            assert child.stdout.readline()
            child.stdout.close()  # as `| head -1` does
            err = child.stderr.read()
            assert child.wait(timeout=60) == 0, err
        assert err == b"", words


@pytest.mark.slow
def test_tasks_on_100000_rows_reads_only_what_it_shows(
    served_gateway: tuple[MockGateway, str],
) -> None:
    """The newest 50 of 100,000 rows: what is read is what is shown, whatever the journal
    holds (reading every row took 251 MiB and 8 s)."""
    _, url = served_gateway
    submitted(url)
    planted(99_999, files=["/out/1-0.png"])
    # The peak of this process's own memory (VmHWM: getrusage's ru_maxrss would count the
    # test process it was forked from).
    code = (
        "import sys\n"
        "from imggw_cli import main\n"
        "sys.argv = ['imggw', 'tasks']\n"
        "try:\n    main()\nexcept SystemExit as done:\n    code = done.code\n"
        "peak = next(line.split()[1] for line in open('/proc/self/status')\n"
        "            if line.startswith('VmHWM:'))\n"
        "print('PEAK', peak, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=process_env(CANARY),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert len(done.stdout.splitlines()) == 51, done.stderr
    assert "50 of 100,000 tasks" in done.stderr
    peak_kib = int(done.stderr.rsplit("PEAK ", 1)[1])
    assert peak_kib < 100 * 1024, f"{peak_kib} KiB"


# ---------------------------------------------------------------------------- one store


def test_download_from_tells_the_journal_and_collect_does_not_save_again(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    gw, url = served_gateway
    task_id = submitted(url)
    wait_done(url, task_id)
    ids = tmp_path / "ids.txt"
    ids.write_text(task_id + "\n")
    saved = imggw("download", "--from", str(ids), "-o", str(tmp_path / "got"), "--base-url", url)
    assert saved.code == 0, saved.err
    (row,) = rows(journal_file())
    assert row["state"] == "saved"
    (path,) = json.loads(row["files"])
    assert Path(path) == tmp_path / "got" / f"{task_id}-0.png"
    assert imggw("tasks", "--unfinished", "--json").out == ""
    fetched = result_fetches(gw)
    again = imggw("tasks", "collect", "-o", str(tmp_path / "again"), "--base-url", url)
    assert again.code == 0, again.err
    assert result_fetches(gw) == fetched  # nothing downloaded twice
    assert not list((tmp_path / "again").glob("*.png"))


def test_tasks_lists_a_batch_folders_tasks_as_it_lists_the_journals(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    task_id = submitted(url, "a heron")
    wait_done(url, task_id)
    ids = tmp_path / "ids.txt"
    ids.write_text(task_id + "\n")
    got = tmp_path / "got"
    saved = imggw("download", "--from", str(ids), "-o", str(got), "--base-url", url)
    assert saved.code == 0, saved.err
    (journaled,) = imggw("tasks", "--json").records()
    listed = imggw("tasks", "--folder", str(got), "--json")
    assert listed.code == 0, listed.err
    (entry,) = listed.records()
    # The same task in both stores, in the same words; the folder's run collected it by id.
    assert (entry["task_id"], entry["state"]) == (journaled["task_id"], "saved")
    assert entry["files"] == journaled["files"] == [str(got / f"{task_id}-0.png")]
    assert entry["idempotency_key"] == ""
    text = imggw("tasks", "--folder", str(got))
    assert text.code == 0
    assert task_id in text.out
    assert "saved" in text.out
    pruned = imggw("tasks", "--folder", str(got), "prune")
    assert pruned.code == 2  # --folder lists; prune is the journal's
    assert "works on the journal" in pruned.err
    missing = imggw("tasks", "--folder", str(tmp_path / "nowhere"))
    assert missing.code == 2
    assert "no such folder" in missing.err
    assert not (tmp_path / "nowhere").exists()
    a_file = imggw("tasks", "--folder", str(got / "ledger.sqlite"))
    assert a_file.code == 2
    assert "is a file: give the folder it is in" in a_file.err


def test_tasks_lists_a_sharded_runs_tasks_from_every_shard(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"p{n}"}) + "\n" for n in range(1, 6)))
    out = tmp_path / "out"
    for shard in ("1/2", "2/2"):
        ran = imggw("batch", str(source), "-o", str(out), "--shard", shard, "--base-url", url)
        assert ran.code == 0, ran.err

    listed = imggw("tasks", "--folder", str(out), "--json")
    assert listed.code == 0, listed.err
    records = listed.records()
    assert [r["request"]["prompt"] for r in records] == [
        "p5",
        "p4",
        "p3",
        "p2",
        "p1",
    ]  # the last first
    for record in records:
        (saved,) = record["files"]
        assert Path(saved).parent == out
        assert Path(saved).is_file()
    shown = imggw("tasks", "--folder", str(out), "--limit", "2", "--json")
    assert [r["request"]["prompt"] for r in shown.records()] == ["p5", "p4"]
    assert "2 of 5 tasks" in shown.err
    # Run again in another cut: shard 1 of 3 replays lines 1 and 2 under their keys, the same
    # tasks, now in two ledgers: each is listed once, and counted once.
    recut = imggw("batch", str(source), "-o", str(out), "--shard", "1/3", "--base-url", url)
    assert recut.code == 0, recut.err
    again = imggw("tasks", "--folder", str(out), "--json").records()
    assert sorted(r["task_id"] for r in again) == sorted(r["task_id"] for r in records)
    cut = imggw("tasks", "--folder", str(out), "--limit", "2", "--json")
    assert len(cut.records()) == 2
    assert "2 of 5 tasks" in cut.err
    one = imggw("tasks", "--folder", str(out / "shards" / "0001-of-0002"), "--json")
    assert sorted(r["request"]["prompt"] for r in one.records()) == [
        "p1",
        "p2",
    ]  # lines 1 and 2 of 5


def test_status_and_download_tell_the_journal_what_they_see(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    task_id = submitted(url)
    wait_done(url, task_id)
    assert rows(journal_file())[0]["state"] == "pending"
    assert imggw("status", task_id, "--base-url", url).code == 0
    assert rows(journal_file())[0]["state"] == "succeeded"
    assert imggw("download", task_id, "-o", str(tmp_path), "--base-url", url).code == 0
    assert rows(journal_file())[0]["state"] == "saved"


@pytest.mark.gateway(api_keys=[CANARY, OTHER_KEY], duration_min=0.01, duration_max=0.02)
def test_collect_says_how_many_tasks_belong_to_another_key_or_gateway(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    submitted(url, "a fox")
    submitted(url.replace("127.0.0.1", "localhost"), "a cat")  # another spelling
    other = imggw(
        "tasks",
        "collect",
        "-o",
        str(tmp_path),
        "--base-url",
        url,
        "--wait",
        "-q",
        env={"IMGGW_API_KEY": OTHER_KEY},
    )
    assert other.code == 0, other.err  # written down: another key's tasks are not this run's
    assert "2 unfinished task(s) in the journal belong to another API key or gateway" in other.err
    assert "IMGGW_API_KEY" in other.err
    assert len(imggw("tasks", "--unfinished", "--json").records()) == 2


def test_collect_says_how_many_tasks_a_live_process_holds_and_exits_3(
    served_gateway: tuple[MockGateway, str], tmp_path: Path
) -> None:
    _, url = served_gateway
    submitted(url, "a fox")
    held_by = f"{os.getppid()}@{HOST}#another-journal"  # this test's parent: alive
    with contextlib.closing(sqlite3.connect(journal_file())) as db:
        db.execute("UPDATE tasks SET lease_owner = ?, lease_until = ?", (held_by, time.time() + 10))
        db.commit()
    run = imggw("tasks", "collect", "-o", str(tmp_path), "--base-url", url, "-q")
    assert run.code == 3, run.err  # not all collected: the other process still has it
    assert (
        "1 unfinished task(s) of this key and gateway are held by another live process" in run.err
    )
    assert list(tmp_path.iterdir()) == []


def test_a_task_s_surface_is_looked_for_in_the_newest_rows_only(
    served_gateway: tuple[MockGateway, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status ID`` finds the surface a task was submitted on in the journal: among the
    unfinished tasks, then the newest rows, never by reading a journal of any size whole."""
    from imggw_client.tracking import Journal

    _, url = served_gateway
    task_id = submitted(url, "a fox", "--surface", "alpha")
    asked: list[dict[str, Any]] = []
    listed = Journal.tasks

    def spy(self: Journal, **options: Any) -> Any:
        asked.append(options)
        return listed(self, **options)

    monkeypatch.setattr(Journal, "tasks", spy)
    found = imggw("status", task_id, "--base-url", url, "--json")
    assert found.code == 0, found.err  # asked on alpha, where the journal says it is
    unknown = imggw("status", "12345", "--base-url", url)
    assert unknown.code == 1  # no such task: looked for in both passes first
    assert len(asked) == 3
    assert all(options.get("unfinished") or options.get("limit") for options in asked), asked
