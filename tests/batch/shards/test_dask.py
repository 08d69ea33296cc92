"""The Dask engine on a LocalCluster of 2 worker processes over loopback: a worker SIGKILLed
mid-run and a shard that raises still bill every line once; S3 (moto) as the output folder;
one request budget for the whole run, on the scheduler; a changed input refused before
anything is dispatched; progress across shards while they run, in the SDK and the CLI."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from typer.testing import CliRunner

from imggw_cli import _scale
from imggw_cli._app import app
from imggw_client import RateLimit, TaskStatus
from imggw_client._base_client import key_fingerprint
from imggw_client._core import budget as B
from imggw_client._journal.schema import RUN_NAME
from imggw_client.batch import KeyChangedError, status
from imggw_client.batch._ledger import Ledger
from imggw_client.batch.scale import _dask_budget, _dask_dispatch, _shards
from imggw_client.batch.scale._dask import ClientSpec, ShardedProgress, ShardedReport, run_sharded
from imggw_client.batch.scale._dask_budget import PLUGIN_NAME, BudgetPlugin
from imggw_client.batch.scale._dask_progress import ProgressReader
from imggw_client.batch.scale._shards import ShardSpec
from imggw_client.batch.scale._storage import open_storage
from imggw_client.mock import MockGateway

from ...loopback import redis_server
from .conftest import FAST, KEY, check_from_storage, write_prompts
from .faults import ShardRaises

pytestmark = pytest.mark.gateway(api_keys=[KEY], seed=3, duration_min=0.2, duration_max=0.6)


TERMINAL = (TaskStatus.SUCCEEDED, TaskStatus.FAILED)


def spec(url: str) -> ClientSpec:
    return ClientSpec(base_url=url, **FAST)


def test_a_worker_killed_mid_run_and_a_shard_that_raises_bill_every_line_once(
    served_gateway: tuple[MockGateway, str],
    dask_client: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    gw, url = served_gateway
    lines = 60
    fired = tmp_path / "fault-fired"
    # One try of shard 2 raises after 3 lines; the plugin is on every worker, restarted ones too.
    dask_client.register_plugin(ShardRaises(2, 3, fired), name="shard-raises")
    request.addfinalizer(lambda: dask_client.unregister_worker_plugin("shard-raises"))
    source = write_prompts(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out"
    pids = dask_client.run(os.getpid)
    done: list[ShardedReport] = []
    failure: list[BaseException] = []

    def drive() -> None:
        try:
            done.append(
                run_sharded(
                    source,
                    out,
                    address=dask_client.scheduler.address,
                    shard_size=10,
                    client=spec(url),
                    concurrency=4,
                )
            )
        except BaseException as exc:  # reported below, in the test's thread
            failure.append(exc)

    driver = threading.Thread(target=drive)
    driver.start()
    deadline = time.monotonic() + 60
    while gw.stats()["tasks_created"] < 15:  # mid-run for sure
        assert driver.is_alive(), failure
        assert time.monotonic() < deadline
        time.sleep(0.02)
    killed = next(iter(pids.values()))
    os.kill(killed, signal.SIGKILL)
    driver.join(timeout=90)
    assert not driver.is_alive()
    # The kill landed: that worker process is gone, and the cluster runs without it.
    assert killed not in dask_client.run(os.getpid).values()
    assert not failure, failure
    (report,) = done
    assert report.exit_code == 0, [(s.name, s.error) for s in report.shards]
    assert fired.exists()  # the shard raised
    assert report.retried >= 1  # and ran again
    assert gw.stats()["tasks_created"] == lines  # every line billed exactly once
    check_from_storage(str(out), None, lines)  # every file's sha256, read back from the folder
    # The slots the dead worker held were given back when the scheduler removed it (DESIGN
    # 25), and those of the try that raised when it ended, not 900 s later: the run's budget
    # holds no ticket at all.
    run_id = json.loads((out / RUN_NAME).read_text())["run_id"]
    held = dask_client.run_on_scheduler(
        lambda dask_scheduler: [
            holder
            for budget, *_, holder in dask_scheduler.plugins[PLUGIN_NAME].tickets.values()
            if budget == run_id
        ]
    )
    assert held == []


def test_s3_output_folder_on_a_local_moto_server(
    served_gateway: tuple[MockGateway, str], dask_client: Any, s3: dict[str, Any], tmp_path: Path
) -> None:
    gw, url = served_gateway
    import fsspec

    source = write_prompts(tmp_path / "in.jsonl", 20)
    dest = "s3://imggw-test/run-1"
    seen: list[ShardedProgress] = []
    report = run_sharded(
        source,
        dest,
        address=dask_client.scheduler.address,
        shard_size=10,
        client=spec(url),
        storage_options=s3,
        checkpoint_every=0.3,
        scratch=tmp_path / "scratch",
        on_progress=seen.append,
        progress_every=0.1,
    )
    assert report.exit_code == 0
    # Progress read from the shards' checkpoints in the bucket while they ran.
    assert any(p.finished > 0 or p.counts["running"] > 0 for p in seen), seen
    assert all(p.total == 20 and sum(p.counts.values()) == 20 for p in seen)
    assert gw.stats()["tasks_created"] == 20
    check_from_storage(dest, s3, 20)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3)
    for name in ("0001-of-0002", "0002-of-0002"):
        for kept in ("ledger.sqlite", "manifest.jsonl", "lines.fp", "input.jsonl"):
            assert fs.exists(f"imggw-test/run-1/shards/{name}/{kept}"), (name, kept)
    st = status(dest, storage_options=s3)
    assert (st.total, st.counts["succeeded"], st.exit_code) == (20, 20, 0)
    assert not list((tmp_path / "scratch").rglob("*.png"))  # uploaded, then deleted locally


def submits_of(gw: MockGateway) -> list[float]:
    """When each submit reached the gateway, as the run goes."""
    sent: list[float] = []
    handle = gw.handle

    def spy(request: Any) -> Any:
        if request.method == "POST":
            sent.append(time.monotonic())
        return handle(request)

    gw.handle = spy  # type: ignore[method-assign]
    return sent


@pytest.mark.gateway(seed=4, duration_min=0.1, duration_max=0.2)
def test_one_budget_for_the_whole_run_on_the_scheduler(
    served_gateway: tuple[MockGateway, str], dask_client: Any, tmp_path: Path
) -> None:
    gw, url = served_gateway
    sent = submits_of(gw)
    rate, lines = 10.0, 30
    source = write_prompts(tmp_path / "in.jsonl", lines)
    report = run_sharded(
        source,
        tmp_path / "out",
        address=dask_client.scheduler.address,
        shard_size=8,
        client=spec(url),
        concurrency=8,
        rate_limit=RateLimit(submits_per_second=rate),
    )
    assert report.exit_code == 0
    assert len(sent) == lines
    peak = max(sum(1 for t in sent if start <= t < start + 1.0) for start in sent)
    assert peak <= rate * 1.1  # 4 shards on 2 workers, paced as one client
    assert sent[-1] - sent[0] >= (lines - 1) / rate * 0.9


@pytest.mark.redis
@pytest.mark.gateway(seed=5, duration_min=0.1, duration_max=0.2)
def test_a_run_with_a_rate_store_shares_the_stores_budget_not_the_schedulers(
    served_gateway: tuple[MockGateway, str], dask_client: Any, tmp_path: Path
) -> None:
    gw, url = served_gateway
    sent = submits_of(gw)
    rate, lines = 10.0, 20
    source = write_prompts(tmp_path / "in.jsonl", lines)
    with redis_server() as store:
        report = run_sharded(
            source,
            tmp_path / "out",
            address=dask_client.scheduler.address,
            shard_size=5,
            client=spec(url),
            concurrency=8,
            rate_limit=RateLimit(submits_per_second=rate, store=store.url),
        )
        with contextlib.closing(store.client()) as redis:
            lanes = sorted(key.decode().rsplit(":", 1)[1] for key in redis.scan_iter())
    assert report.exit_code == 0
    assert lanes == ["query", "submit"]  # the workers' clients asked the store
    assert len(sent) == lines
    peak = max(sum(1 for t in sent if start <= t < start + 1.0) for start in sent)
    # 4 shards on 2 workers, spaced by the store as one client (timed here on arrival, so a
    # loaded machine's jitter may bunch two; without the store they would go at 4x the rate).
    assert peak <= rate + 2


def test_a_429_seen_by_one_worker_slows_every_worker() -> None:
    plugin = BudgetPlugin()
    plugin.handle("run", "open", limit={"submits_per_second": 100.0})
    first = plugin.handle("run", "reserve", kind="submit")
    assert first["wait"] == 0.0
    plugin.handle("run", "finished", ticket=first["ticket"], limited=True, retry_after=2.0)
    other = plugin.handle("run", "reserve", kind="submit")  # another worker's request
    assert other["wait"] > 1.5


def test_a_worker_removed_gives_back_the_slots_it_held_at_once() -> None:
    # DESIGN 25: a worker SIGKILLed with the whole start window in flight held it for 900 s
    # (TICKET_TTL) while the live workers asked for slots in a loop.
    plugin = BudgetPlugin()
    plugin.handle("run", "open", limit={})
    dead = [
        plugin.handle("run", "reserve", kind="submit", worker="tcp://dead:1")
        for _ in range(B.START_WINDOW)
    ]
    assert all(answer["wait"] == 0.0 for answer in dead)  # the window: all in flight
    live = plugin.handle("run", "reserve", kind="submit", worker="tcp://live:2")
    assert live["wait"] > 0  # held back by the dead worker's requests
    plugin.remove_worker(None, "tcp://dead:1", stimulus_id="removed")
    assert plugin.handle("run", "wait", ticket=live["ticket"], worker="tcp://live:2") == {
        "wait": 0.0
    }
    assert all(holder != "tcp://dead:1" for *_, holder in plugin.tickets.values())


class OnScheduler:
    """The scheduler's budget handler asked in this process, as a worker's client asks it;
    ``reserved`` is set once ``expect`` slots were handed out."""

    def __init__(self, plugin: BudgetPlugin, expect: int) -> None:
        self.plugin, self.expect, self.reserved = plugin, expect, anyio.Event()

    async def _ask(self, **message: Any) -> dict[str, Any]:
        return await self.plugin.serve(budget="run", worker="tcp://w:1", **message)

    async def reserve(self, kind: str) -> tuple[Any, float]:
        answer = await self._ask(action="reserve", kind=kind)
        if len(self.plugin.tickets) >= self.expect:
            self.reserved.set()
        return answer["ticket"], float(answer["wait"])

    async def wait_time(self, ticket: Any) -> float:
        return float((await self._ask(action="wait", ticket=ticket))["wait"])

    async def release(self, ticket: Any) -> None:
        await self._ask(action="release", ticket=ticket)

    async def finished(self, ticket: Any, **ended: Any) -> None:
        await self._ask(action="finished", ticket=ticket, **ended)


SUBMIT = "POST /beta/v1/images/generations"


@pytest.mark.anyio
async def test_a_shard_that_raises_with_requests_in_flight_gives_back_their_slots(
    served_gateway: tuple[MockGateway, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 39: a shard that raised on a live worker cancelled its requests in flight, whose
    # slots no one gave back: held 900 s (TICKET_TTL), enough of them stalled every worker.
    gw, url = served_gateway
    plugin = BudgetPlugin()
    plugin.handle("run", "open", limit={})
    service = OnScheduler(plugin, expect=3)
    monkeypatch.setattr(_dask_dispatch, "SchedulerBudget", lambda budget: service)
    monkeypatch.setattr(_dask_dispatch, "scheduler_guard", lambda run: None)
    monkeypatch.setenv("IMGGW_API_KEY", KEY)
    gw.configure(fault_rate=1.0, faults=["latency"], latency=2.0)  # the answers come late

    async def raising_shard(spec: Any, *, client: Any, guard: Any) -> Any:
        async with anyio.create_task_group() as group:
            for i in range(3):
                group.start_soon(functools.partial(client.submit, f"fox {i}", aspect_ratio="3:2"))
            await service.reserved.wait()
            # In flight: the gateway has each submit (its answer comes 2 s late). Under some
            # HTTP libraries a request is written a few loop turns after its slot is taken.
            with anyio.fail_after(30):
                while gw.stats()["requests"].get(SUBMIT, 0) < 3:
                    await anyio.sleep(0.01)
            assert len(plugin.tickets) == 3  # each submit in flight holds its slot
            group.cancel_scope.cancel()
        raise RuntimeError("injected fault")

    monkeypatch.setattr(_shards, "arun_shard", raising_shard)
    with pytest.raises(RuntimeError):
        await _dask_dispatch._shard_task(ShardSpec("in.jsonl", "out", 1, 1), spec(url), "run")
    assert plugin.tickets == {}
    assert gw.stats()["requests"] == {SUBMIT: 3}


@pytest.mark.anyio
async def test_a_worker_waiting_for_a_slot_is_answered_when_it_frees_not_polled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Held until the place frees, however long that takes here: no HOLD ends it first.
    monkeypatch.setattr(_dask_budget, "HOLD", 600.0)
    plugin = BudgetPlugin()
    plugin.handle("run", "open", limit={})
    held = [
        plugin.handle("run", "reserve", kind="submit", worker="tcp://a:1")
        for _ in range(B.START_WINDOW)
    ]
    answers: list[dict[str, Any]] = []

    async def ask() -> None:
        answers.append(
            await plugin.serve(budget="run", action="reserve", kind="submit", worker="tcp://b:2")
        )

    async with anyio.create_task_group() as group:
        group.start_soon(ask)
        await wait_all_tasks_blocked()
        assert answers == []  # held on the scheduler, not answered with a wait to poll
        plugin.handle("run", "finished", ticket=held[0]["ticket"], worker="tcp://a:1")
    assert answers[0]["wait"] == 0.0  # the answer that freed a place let it go


def test_a_changed_input_is_refused_before_dispatch_and_run_with_allow_changes(
    served_gateway: tuple[MockGateway, str], dask_client: Any, tmp_path: Path
) -> None:
    gw, url = served_gateway
    source = write_prompts(tmp_path / "in.jsonl", 6)
    out = tmp_path / "out"
    command = [
        "batch",
        str(source),
        "-o",
        str(out),
        "--engine",
        "dask",
        "--address",
        dask_client.scheduler.address,
        "--shard-size",
        "3",
        "--base-url",
        url,
        "--name",
        "img-{line}",
    ]
    env = {"IMGGW_API_KEY": KEY}
    first = CliRunner().invoke(app, command, env=env)
    assert first.exit_code == 0, first.stderr
    recorded = json.loads((out / RUN_NAME).read_text())  # as a single run records them
    assert (recorded["name"], recorded["input"]) == ("img-{line}", str(source))
    assert first.stdout.strip().endswith("manifest.jsonl")
    assert gw.stats()["tasks_created"] == 6
    source.write_text(source.read_text().replace("image 4", "an edited line"))
    refused = CliRunner().invoke(app, command, env=env)
    assert refused.exit_code == 2
    assert "(1 line(s) new or changed: 5)" in refused.stderr
    assert "--allow-changes" in refused.stderr
    assert gw.stats()["tasks_created"] == 6  # nothing was sent
    allowed = CliRunner().invoke(app, [*command, "--allow-changes", "--json"], env=env)
    assert allowed.exit_code == 0, allowed.stderr
    assert gw.stats()["tasks_created"] == 7  # the changed line alone, as a new request
    records = check_from_storage(str(out), None, 6)
    assert records[4]["prompt"] == "an edited line"
    assert allowed.stdout.count("\n") == 6  # --json: the merged manifest on stdout
    kept = json.loads((out / RUN_NAME).read_text())
    assert (kept["name"], kept["input"]) == ("img-{line}", str(source))  # kept through a change


def test_the_runs_key_is_recorded_and_a_folder_made_with_another_is_refused(
    served_gateway: tuple[MockGateway, str],
    dask_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver without the key leaves it to the workers, which record theirs; a driver with a
    key refuses a folder made with another before any shard is dispatched (a rotated key would
    otherwise mark every line not_found)."""
    gw, url = served_gateway
    source = write_prompts(tmp_path / "in.jsonl", 4)
    out = tmp_path / "out"
    monkeypatch.delenv("IMGGW_API_KEY")  # the driver's own environment only
    first = run_sharded(
        source, out, address=dask_client.scheduler.address, shard_size=2, client=spec(url)
    )
    assert first.exit_code == 0
    run = json.loads((out / RUN_NAME).read_text())
    assert run["key_fingerprint"] == key_fingerprint(KEY)  # recorded by the workers
    run["key_fingerprint"] = key_fingerprint("sk-the-key-before-rotation")
    (out / RUN_NAME).write_text(json.dumps(run))
    monkeypatch.setenv("IMGGW_API_KEY", KEY)
    write_prompts(source, 6)  # two more lines, allowed: they would be sent if not refused
    requests = sum(gw.stats()["requests"].values())
    with pytest.raises(KeyChangedError) as refused:
        run_sharded(
            source,
            out,
            address=dask_client.scheduler.address,
            shard_size=2,
            client=spec(url),
            allow_changes=True,
        )
    assert refused.value.fingerprint == key_fingerprint(KEY)
    assert sum(gw.stats()["requests"].values()) == requests  # nothing dispatched, nothing sent
    assert not (out / "shards" / "0003-of-0003").exists()
    assert json.loads((out / RUN_NAME).read_text()) == run  # the record is left as it was


def test_lines_are_known_by_entry_across_slices_so_comments_change_nothing(
    served_gateway: tuple[MockGateway, str], dask_client: Any, tmp_path: Path
) -> None:
    gw, url = served_gateway
    source = tmp_path / "in.txt"
    # Comments and blank lines fall in every slice of 3 physical lines.
    source.write_text("# cats\na\n\nb\n# dogs\nc\nd\n\ne\nf\n")
    out = tmp_path / "out"

    def run() -> ShardedReport:
        return run_sharded(
            source,
            out,
            address=dask_client.scheduler.address,
            shard_size=3,
            client=spec(url),
            concurrency=4,
        )

    assert run().exit_code == 0
    identities = set()
    for ledger_path in sorted(out.glob("shards/*/ledger.sqlite")):
        with Ledger.open(ledger_path.parent) as ledger:
            identities |= {(row.identity, row.line) for row in ledger.iter_rows()}
    expected = {
        ("line:1", 2),
        ("line:2", 4),
        ("line:3", 6),
        ("line:4", 7),
        ("line:5", 9),
        ("line:6", 10),
    }
    assert identities == expected
    source.write_text("a\nb\nc\nd\ne\nf\n")  # the notes gone: the same six requests
    again = run()
    assert (again.exit_code, again.changed_count) == (0, 0)
    assert gw.stats()["tasks_created"] == 6


@pytest.mark.dask  # starts a LocalCluster of its own
@pytest.mark.slow
def test_workers_starts_and_stops_a_local_cluster(
    served_gateway: tuple[MockGateway, str], worker_env: None, tmp_path: Path
) -> None:
    gw, url = served_gateway
    source = write_prompts(tmp_path / "in.jsonl", 4)
    result = CliRunner().invoke(
        app,
        [
            "--json",
            "batch",
            str(source),
            "-o",
            str(tmp_path / "out"),
            "--engine",
            "dask",
            "--workers",
            "1",
            "--shard-size",
            "2",
            "--base-url",
            url,
        ],
        env={"IMGGW_API_KEY": KEY},
    )
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4
    assert "a local cluster of 1 worker(s)" in result.stderr
    assert gw.stats()["tasks_created"] == 4


class Readings:
    """A run's progress readings as it reports them, for another thread to wait on."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, ShardedProgress, int]] = []
        self.over = False
        self.changed = threading.Condition()

    def add(self, progress: ShardedProgress) -> None:
        with self.changed:
            self.seen.append((time.monotonic(), progress, threading.get_ident()))
            self.changed.notify_all()

    def end(self) -> None:
        with self.changed:
            self.over = True
            self.changed.notify_all()

    def wait_for(self, finished: int) -> None:
        """Until a reading shows ``finished`` lines finished, or the run is over (the last
        shard may end before the next reading)."""
        with self.changed:
            shown = self.changed.wait_for(
                lambda: self.over or any(p.finished >= finished for _, p, _ in self.seen),
                timeout=60,
            )
        assert shown, f"no reading showed {finished} line(s) finished"


def move_clock(gw: MockGateway, readings: Readings, step: float) -> None:
    """Moves the gateway's clock ``step`` seconds at a time while the run goes; before the first
    step waits for a reading, and after each step for a reading that shows every task the
    gateway has finished by then. So what the readings show follows from the clock, however
    fast or slow the machine is."""
    finished: set[str] = set()
    try:
        with gw.client() as asking:
            readings.wait_for(0)
            while not readings.over:
                if len(finished) == gw.stats()["tasks_created"]:
                    time.sleep(0.02)  # nothing is in flight: the next shards are on their way
                    continue
                gw.advance(step)
                for n in range(1, gw.stats()["tasks_created"] + 1):
                    if str(n) not in finished and asking.get(str(n)).status in TERMINAL:
                        finished.add(str(n))
                readings.wait_for(len(finished))
    finally:
        while not readings.over:  # failed: let the run end, so that the test can say why
            gw.advance(step)
            time.sleep(0.05)


@contextmanager
def clock_moved(gw: MockGateway, readings: Readings, step: float) -> Iterator[None]:
    """``move_clock`` in a thread of its own while the body runs the batch; its failure is
    the test's."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            move_clock(gw, readings, step)
        except BaseException as exc:  # reported below, in the test's thread
            failure.append(exc)

    mover = threading.Thread(target=run)
    mover.start()
    try:
        yield
    finally:
        readings.end()
        mover.join(timeout=60)
    assert not mover.is_alive()
    if failure:
        raise failure[0]


# Its tasks finish only when the test moves the gateway's clock.
@pytest.mark.gateway(manual_clock=True)
def test_progress_across_shards_shows_between_shard_completions(
    served_gateway: tuple[MockGateway, str],
    dask_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gw, url = served_gateway
    lines = 24
    source = write_prompts(tmp_path / "in.jsonl", lines)
    readings = Readings()
    ended: list[float] = []
    reads: list[int] = []
    real = ProgressReader._shard
    failing = [3]  # the first readings fail: skipped, tried again, never the run's failure

    def flaky(reader: ProgressReader, name: str, tmp: Path) -> dict[str, int] | None:
        reads.append(threading.get_ident())
        if failing[0]:
            failing[0] -= 1
            raise sqlite3.OperationalError("database is locked")
        return real(reader, name, tmp)

    monkeypatch.setattr(ProgressReader, "_shard", flaky)
    # Steps of 0.05 s over durations of 0.2 to 0.6 s: each finishes a few of the 12 lines in
    # flight, never a whole shard's 6 at once, and a reading shows it before the next step.
    with clock_moved(gw, readings, step=0.05):
        report = run_sharded(
            source,
            tmp_path / "out",
            address=dask_client.scheduler.address,
            shard_size=6,
            client=spec(url),
            concurrency=2,
            progress_every=0.1,
            on_shard=lambda outcome: ended.append(time.monotonic()),
            on_progress=readings.add,
        )
    seen = readings.seen
    assert report.exit_code == 0
    assert gw.stats()["tasks_created"] == lines
    assert len(ended) == 4
    finished = [p.finished for _, p, _ in seen]
    assert finished == sorted(finished)  # a line only moves forward
    # Lines done inside shards that had not ended yet: counts between shard completions.
    before_first = [p.finished for t, p, _ in seen if t < min(ended)]
    assert any(n > 0 for n in before_first), before_first
    before_last = {p.finished for t, p, _ in seen if t < max(ended)}
    assert len(before_last) >= 3, before_last
    assert any(n % 6 for n in before_last)  # not only whole shards
    for _, p, _ in seen:
        assert (p.total, p.shards, p.bad) == (lines, 4, 0)
        assert sum(p.counts.values()) == lines
        assert list(p.counts) == ["pending", "running", "succeeded", "failed"]
    assert status(tmp_path / "out").total == lines  # the same total `imggw batch status` gives
    # Read off the event loop (the thread that called run_sharded), the callback on it.
    assert failing == [0]
    assert reads
    assert threading.get_ident() not in reads
    assert {thread for _, _, thread in seen} == {threading.get_ident()}
    # Once ended, a shard's ledger (closed now) still reads: its last state.
    names = [f"{i:04d}-of-0004" for i in range(1, 5)]
    reader = ProgressReader(
        open_storage(tmp_path / "out"), names, [6] * 4, 0, checkpoint_every=30.0
    )
    final = reader.read(None, set(names), 1.0)
    assert final.counts == {"pending": 0, "running": 0, "succeeded": lines, "failed": 0}
    assert (final.finished, final.shards_ended) == (lines, 4)


# Its tasks finish only when the test moves the gateway's clock.
@pytest.mark.gateway(manual_clock=True)
def test_cli_shows_progress_on_stderr_and_keeps_json_on_stdout(
    served_gateway: tuple[MockGateway, str],
    dask_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gw, url = served_gateway
    monkeypatch.setattr(_scale, "PROGRESS_EVERY", 0.1)  # a run of seconds, read often
    readings = Readings()
    shown = _scale.sharded_text

    def line(progress: ShardedProgress) -> str:  # each progress line the CLI writes
        readings.add(progress)
        return shown(progress)

    monkeypatch.setattr(_scale, "sharded_text", line)
    source = write_prompts(tmp_path / "in.jsonl", 8)
    # One step past the longest duration: whatever is in flight then finishes at once.
    with clock_moved(gw, readings, step=1.0):
        result = CliRunner().invoke(
            app,
            [
                "--json",
                "batch",
                str(source),
                "-o",
                str(tmp_path / "out"),
                "--engine",
                "dask",
                "--address",
                dask_client.scheduler.address,
                "--shard-size",
                "4",
                "-c",
                "1",
                "--base-url",
                url,
            ],
            env={"IMGGW_API_KEY": KEY},
        )
    assert result.exit_code == 0, result.stderr
    line_text = re.compile(
        r"dask: (\d+)/8 lines finished \(pending \d+, running \d+, succeeded \d+, "
        r"failed \d+\); shards (\d)/2 ended; \d+\.\d lines/s(, eta \d+ s)?"
    )
    notes = result.stderr.splitlines()
    progress = [(int(m[1]), int(m[2])) for m in map(line_text.fullmatch, notes) if m]
    assert progress, result.stderr
    # The first reading came before the clock moved: no line could have finished by then.
    assert progress[0] == (0, 0), result.stderr
    assert len(progress) == len(readings.seen)  # every reading the CLI showed, on stderr
    finished = [n for n, _ in progress]
    assert finished == sorted(finished)
    records = [json.loads(text) for text in result.stdout.splitlines()]  # --json: stdout clean
    assert [r["line"] for r in records] == list(range(1, 9))
    assert gw.stats()["tasks_created"] == 8
