"""Sharded batches: a run cut into contiguous ranges of input lines, each run by the batch runner
on its own, anywhere, into one output folder (local or an fsspec URL).

The output folder::

    run.json, lines.fp          the run's identity: made once, before anything is sent
    <task id>-<n>.<ext>         every result, whole (as a single run saves them)
    shards/0001-of-0004/        one folder a shard: its ledger (live, or its last checkpoint),
        ledger.sqlite           lines.fp (its range of the input, as it last accepted it),
        lines.fp                manifest.jsonl (written whole each time the shard ends) and,
        manifest.jsonl          for a run on an engine, input.jsonl (its slice of the input)
    manifest.jsonl, index.html  the merge of the shards (``merge``), and its gallery

Shard ``I`` of ``N`` holds lines ``(I-1)*T//N + 1`` to ``I*T//N`` of a file of ``T`` lines (blank
and comment lines counted), so every process that cuts the same file into ``N`` agrees without
talking. Each line's key follows from the run id (``_identity``): a shard run again anywhere,
after a worker death or a lost ledger, sends the same keys and the gateway replays its tasks.

A shard on a local folder works in place. On a remote one (``s3://...``) it works in a scratch
folder: its ledger lives there and is checkpointed into the output folder (SQLite's backup API to
a temp file, then one PUT); each result is uploaded as soon as it is saved and verified, then
deleted locally, so a dead machine loses nothing saved.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
import re
import secrets
import shutil
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from .._async_client import AsyncClient
from .._base_client import key_fingerprint
from .._config import ENV_API_KEY, ENV_BASE_URL, RateLimit, check_surface
from .._exceptions import RequestValidationError
from .._models import DownloadedFile
from . import _identity
from ._gallery import GALLERY_DIR, GALLERY_NAME, iter_manifest, write_gallery
from ._input import JSON_SUFFIX, JSONL_SUFFIXES, InputLine, count_lines, iter_lines
from ._ledger import _COLUMNS, INVALID_LINE, LEDGER_NAME, Ledger, Row, StorageError
from ._runner import (
    MANIFEST_NAME,
    BatchProgress,
    BatchReport,
    check_run_options,
    execute,
    manifest_record,
    write_manifest,
)
from ._storage import Storage, destination_name, open_storage

log = logging.getLogger("imggw_client")

SHARDS_DIR = "shards"
SLICE_NAME = "input"
CHECKPOINT_EVERY = 30.0  # seconds between checkpoints of a remote shard's ledger
IDENTITY_WAIT = 30.0  # how long a shard waits for the run's lines.fp its creator is writing
_SHARD = re.compile(r"(\d{4,})-of-(\d{4,})")
_CHECKPOINT_KEY = "checkpoint"


# ---------------------------------------------------------------------------- cutting


def shard_name(index: int, count: int) -> str:
    """The shard's folder name under ``shards/``: ``0002-of-0004``."""
    return f"{index:04d}-of-{count:04d}"


def shard_range(index: int, count: int, total: int) -> range:
    """The line numbers of shard ``index`` (1-based) of ``count`` in a file of ``total`` lines.

    Example::

        assert shard_range(2, 3, 10) == range(4, 7)   # lines 4, 5 and 6
    """
    check_shard(index, count)
    return range((index - 1) * total // count + 1, index * total // count + 1)


def check_shard(index: object, count: object) -> tuple[int, int]:
    ok = isinstance(index, int) and isinstance(count, int) and not isinstance(index, bool)
    if not ok or not 1 <= index <= count:  # type: ignore[operator]
        raise RequestValidationError(
            "shard", "must be I/N with 1 <= I <= N (shard I of N)", code="invalid_shard"
        )
    return index, count  # type: ignore[return-value]


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: shard 2 of 4.

    Example::

        index, count = parse_shard("2/4")
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None:
        raise RequestValidationError(
            "shard", "must be I/N with 1 <= I <= N (shard I of N)", code="invalid_shard"
        )
    return check_shard(int(match[1]), int(match[2]))


def scratch_folder(dest: str, scratch: str | os.PathLike[str] | None) -> Path:
    """Where a remote folder's shards work on this machine (one folder per output folder)."""
    base = Path(scratch) if scratch is not None else Path(tempfile.gettempdir()) / "imggw-scratch"
    return base / hashlib.sha256(dest.rstrip("/").encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- the input


@dataclass
class Scan:
    """One pass over (part of) an input: its bad lines and its changes against a record."""

    digests: _identity.LineDigests
    fingerprint: str
    bad: list[tuple[int, str]] = field(default_factory=list)
    bad_count: int = 0


def scan_input(
    source: str,
    folder: Path,
    *,
    surface: str,
    old: Path | None,
    format: str | None = None,
) -> Scan:
    """Parses every line (read as ``format`` says, see ``iter_lines``), flags bad and repeated
    ones, and compares the good ones with the record ``old`` (none: every line is new). Memory
    stays bounded: repeated ids are found with a temporary SQLite table. Blocking."""
    nothing = folder / f".no-record.{secrets.token_hex(4)}"  # compared with no record
    digests = _identity.LineDigests(folder, old=old if old is not None else nothing)
    seen_path = folder / f".ids.{secrets.token_hex(4)}.sqlite"
    scan = Scan(digests, "")
    try:
        with closing(sqlite3.connect(seen_path)) as seen:
            seen.execute("PRAGMA journal_mode=OFF")
            seen.execute("CREATE TABLE ids (identity TEXT PRIMARY KEY)")
            for item in iter_lines(source, format=format):
                if isinstance(item, InputLine):
                    identity = item.identity(surface)
                    repeat = False
                    if not identity.startswith("line:"):
                        cursor = seen.execute("INSERT OR IGNORE INTO ids VALUES (?)", (identity,))
                        repeat = cursor.rowcount == 0
                    if not repeat:
                        fingerprint = item.fingerprint(surface)
                        digest = _identity.line_digest(identity, fingerprint)
                        digests.add(item.line, digest)
                        continue
                    reason = f"{identity.split(':', 1)[0]} repeats an earlier line"
                    item_line = item.line
                else:
                    reason, item_line = item.reason, item.line
                scan.bad_count += 1
                if len(scan.bad) < 1000:
                    scan.bad.append((item_line, reason))
        scan.fingerprint = digests.finish()
    except BaseException:
        digests.discard()
        raise
    finally:
        seen_path.unlink(missing_ok=True)
    return scan


def load_identity(storage: Storage) -> _identity.RunIdentity | None:
    """The output folder's run identity, or None if no run began there."""
    data = storage.read(_identity.RUN_NAME)
    if data is None:
        return None
    return _identity.parse_record(data, storage.where(_identity.RUN_NAME))


def env_run_id(storage: Storage) -> str:
    """A new run's id as a process that has no client works it out: derived (as the runner
    derives it) from the folder, ``IMGGW_BASE_URL`` and ``IMGGW_API_KEY``, random when either
    is not set."""
    key, base_url = os.environ.get(ENV_API_KEY), os.environ.get(ENV_BASE_URL)
    if not key or not base_url:
        return _identity.random_run_id()
    place = destination_name(storage.url)
    return _identity.derive_run_id(place, base_url.rstrip("/"), key_fingerprint(key))


def client_run_id(storage: Storage, client: AsyncClient) -> str:
    """A new run's id for ``client``: the same on every process that runs shards of one
    output folder against one gateway with one key, and after the folder is made again."""
    place = destination_name(storage.url)
    return _identity.derive_run_id(place, client.base_url, client.key_fingerprint)


def claim_identity(
    storage: Storage,
    scan: Scan,
    *,
    run_id: str | None = None,
    surface: str | None = None,
) -> tuple[_identity.RunIdentity, bool]:
    """The run's identity: created here, exactly once, if the folder has none (an exclusive
    create: of shards started at once on a fresh folder, one wins and every other loads its run
    id). Returns it and whether it was created here. The creator publishes the input's record
    (``lines.fp``) right after. ``run_id`` is the id to create (default: :func:`env_run_id`);
    every process derives the same one, so none depends on which wins. ``surface`` is kept in
    the record (a rerun on another surface is then told as such)."""
    if run_id is None:
        run_id = env_run_id(storage)
    identity = _identity.RunIdentity(run_id, scan.fingerprint, surface)
    if storage.create(_identity.RUN_NAME, _identity.record_bytes(identity)):
        publish_lines(storage, scan.digests)
        return identity, True
    found = load_identity(storage)
    if found is None:  # pragma: no cover - a run.json deleted in that very instant
        raise StorageError(f"{storage.where(_identity.RUN_NAME)} vanished", code="storage_failed")
    return found, False


def publish_lines(storage: Storage, digests: _identity.LineDigests) -> None:
    """Makes the scanned input the run's record of its input (``lines.fp``), whole."""
    data = digests.new_entries()
    storage.write(_identity.LINES_NAME, data)


def wait_for_lines(storage: Storage, timeout: float = IDENTITY_WAIT) -> bool:
    """Waits (a little) for the run's ``lines.fp``, which its creator writes just after
    ``run.json``. False if it never came (its creator died between the two)."""
    deadline = time.monotonic() + timeout
    while storage.size(_identity.LINES_NAME) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------------------- one shard


@dataclass(frozen=True)
class ShardSpec:
    """Everything a shard needs, and nothing secret (it travels to workers): the input (a file
    this machine reads, or with ``sliced`` the slice the driver put in the output folder), the
    output folder and the batch options. The API key is never here: each machine's client
    reads ``IMGGW_API_KEY`` from its own environment.

    Example::

        spec = ShardSpec(source="prompts.jsonl", dest="s3://bucket/run", index=2, count=4)
    """

    source: str
    dest: str
    index: int
    count: int
    sliced: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 8
    timeout: float | None = None
    surface: str | None = None
    skip_bad_lines: bool = False
    allow_changes: bool = False
    verify: bool = False
    scratch: str | None = None
    checkpoint_every: float = CHECKPOINT_EVERY
    lines: range | None = None  # the shard's range, when the caller cut it already
    first_entry: int = 1  # with ``sliced``: the entry number of the slice's first line
    format: str | None = None  # "jsonl", "text", or None: by the input's name (see iter_lines)

    @property
    def name(self) -> str:
        return shard_name(self.index, self.count)

    @property
    def folder(self) -> str:
        return f"{SHARDS_DIR}/{self.name}"


@dataclass
class ShardReport:
    """What one shard did: its range of input lines, counts per ledger state, money, and its
    exit code as ``imggw batch`` gives it (0 all succeeded, 1 some failed, 3 some unfinished).

    Example::

        report = run_shard("prompts.jsonl", "out/", index=1, count=3)
        print(report.lines, report.counts, report.exit_code)
    """

    index: int
    count: int
    lines: range
    counts: dict[str, int]
    elapsed: float
    credits: float = 0.0
    cost: float = 0.0
    bad_count: int = 0
    changed_lines: list[int] = field(default_factory=list)
    changed_count: int = 0
    exit_code: int = 0

    @classmethod
    def from_batch(cls, spec: ShardSpec, lines: range, report: BatchReport) -> ShardReport:
        return cls(
            index=spec.index, count=spec.count, lines=lines, counts=report.counts,
            elapsed=report.elapsed, credits=report.credits, cost=report.cost,
            bad_count=report.bad_count, changed_lines=report.changed_lines,
            changed_count=report.changed_count, exit_code=report.exit_code,
        )  # fmt: skip


class _ShardRecord:
    """A shard's record of its range of the input: its own ``lines.fp`` if it accepted one,
    else the run's, cut to its range. The run id is the run's."""

    def __init__(
        self,
        storage: Storage,
        spec: ShardSpec,
        work: Path,
        run: _identity.RunIdentity,
        lines: range,
    ) -> None:
        self.storage, self.spec, self.work, self.run_id, self.lines = (
            storage, spec, work, run.run_id, lines,
        )  # fmt: skip
        self.surface = run.surface
        own = f"{spec.folder}/{_identity.LINES_NAME}"
        self.has_own = storage.size(own) is not None
        self.reference = self._fetch(own if self.has_own else _identity.LINES_NAME)

    def _fetch(self, rel: str) -> Path:
        local = self.storage.local
        if local is not None:
            return local / rel
        path = self.work / f".ref.{_identity.LINES_NAME}"
        if not self.storage.get(rel, path):
            path.unlink(missing_ok=True)
        return path

    def previous_surface(self) -> str | None:
        return self.surface

    def digests(self) -> _identity.LineDigests:
        return _identity.LineDigests(self.work, old=self.reference, within=self.lines)

    def accept(self, digests: _identity.LineDigests, fingerprint: str) -> None:
        if self.has_own and not digests.changed_count:
            return
        digests.commit()  # the shard's lines.fp in its work folder ...
        if self.storage.local is None:  # ... and in the output folder
            data = (self.work / _identity.LINES_NAME).read_bytes()
            self.storage.write(f"{self.spec.folder}/{_identity.LINES_NAME}", data)


class _ShardStore:
    """Results of a shard into the output folder; its ledger checkpointed there (remote)."""

    def __init__(self, storage: Storage, spec: ShardSpec, work: Path) -> None:
        self.storage, self.spec, self.work = storage, spec, work
        self.checkpoints: _Checkpoints | None = None

    async def keep(self, files: list[DownloadedFile]) -> None:
        # An object store may fail a PUT now and then: a few tries before the shard stops.
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(StorageError),
            wait=wait_random_exponential(multiplier=0.2, max=5.0),
            stop=stop_after_attempt(4),
            reraise=True,
        ):
            with attempt:
                for f in files:
                    if f.path.exists():
                        await anyio.to_thread.run_sync(self.storage.put, f.path, f.path.name)

    def is_whole(self, name: str, size: int, sha256: str, *, hashes: bool) -> bool:
        return self.storage.is_whole(name, size, sha256, hashes=hashes)

    def finish(self, manifest: Path) -> None:
        if self.storage.local is None:
            if self.checkpoints is not None:  # none of its uploads may land after the last
                self.checkpoints.close()
            checkpoint(self.storage, self.spec, self.work)
            self.storage.put(manifest, f"{self.spec.folder}/{MANIFEST_NAME}")


def _epoch(path: Path) -> int:
    """The checkpoint number a ledger file holds (-1: no ledger there)."""
    if not path.exists():
        return -1
    try:
        with closing(sqlite3.connect(path)) as db:
            found = db.execute("SELECT value FROM meta WHERE key=?", (_CHECKPOINT_KEY,)).fetchone()
    except sqlite3.Error:
        return -1
    return int(found[0]) if found else 0


def checkpoint(storage: Storage, spec: ShardSpec, work: Path) -> None:
    """Copies the shard's ledger into the output folder, whole: a new checkpoint number in the
    ledger, SQLite's backup API to a temp file (a consistent copy while the run writes on),
    then one upload."""
    ledger = work / LEDGER_NAME
    tmp = work / f".{LEDGER_NAME}.{secrets.token_hex(4)}.part"
    try:
        with closing(sqlite3.connect(ledger, timeout=10.0)) as db:
            epoch = max(_epoch(ledger), 0) + 1
            with db:
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    (_CHECKPOINT_KEY, str(epoch)),
                )
            with closing(sqlite3.connect(tmp)) as copy:
                db.backup(copy)
        storage.put(tmp, f"{spec.folder}/{LEDGER_NAME}")
    except sqlite3.Error as exc:
        raise StorageError(
            f"cannot checkpoint {ledger} ({exc}); the same command resumes", code="storage_failed"
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)


def _restore(storage: Storage, spec: ShardSpec, work: Path) -> None:
    """Puts the shard's checkpoint in its work folder, unless the ledger there is as new."""
    ledger = work / LEDGER_NAME
    fetched = work / f".{LEDGER_NAME}.restore"
    if not storage.get(f"{spec.folder}/{LEDGER_NAME}", fetched):
        return
    if _epoch(fetched) > _epoch(ledger):
        for suffix in ("-wal", "-shm"):
            Path(f"{ledger}{suffix}").unlink(missing_ok=True)
        os.replace(fetched, ledger)
    else:
        fetched.unlink(missing_ok=True)


def _prepare_shard(
    storage: Storage, spec: ShardSpec, surface: str, work: Path, derive: Callable[[], str]
) -> tuple[_identity.RunIdentity, str, range, int, int]:
    """The run's identity (made once), the shard's input, its range, and the line and entry
    numbers the input starts at. Blocking."""
    if spec.sliced:  # an engine's driver made the identity and cut the input
        run = load_identity(storage)
        if run is None or spec.lines is None:
            raise RequestValidationError(
                "out_dir", f"{storage.url} has no run.json: the driver makes it before dispatch"
            )
        local = storage.local
        if local is not None:
            return run, str(local / spec.source), spec.lines, spec.lines.start, spec.first_entry
        path = work / Path(spec.source).name
        if not storage.get(spec.source, path):
            raise StorageError(f"{storage.where(spec.source)} is missing", code="storage_failed")
        return run, str(path), spec.lines, spec.lines.start, spec.first_entry
    lines = spec.lines or shard_range(spec.index, spec.count, count_lines(spec.source))
    run = load_identity(storage)
    if run is None:
        # A fresh folder: the whole input's record is scanned first, so that whichever shard
        # wins the run id publishes it at once.
        scan = scan_input(spec.source, work, surface=surface, old=None, format=spec.format)
        try:
            run, _ = claim_identity(storage, scan, run_id=derive(), surface=surface)
        finally:
            scan.digests.discard()
    # If its creator died before lines.fp, the shard compares with nothing, as a first run does.
    wait_for_lines(storage)
    return run, spec.source, lines, 1, 1


async def arun_shard(
    spec: ShardSpec,
    *,
    client: AsyncClient,
    on_progress: Callable[[BatchProgress], None] | None = None,
) -> ShardReport:
    """Runs (or resumes) one shard of a sharded run with the batch runner; any number of
    shards may run at once, on any machines, into one output folder.

    Example::

        async with AsyncClient() as client:
            report = await arun_shard(ShardSpec("prompts.jsonl", "out/", 1, 3), client=client)
    """
    check_shard(spec.index, spec.count)
    check_run_options(spec.concurrency, spec.timeout)
    storage = open_storage(spec.dest, spec.storage_options)
    surface = check_surface(spec.surface or client.surface)
    local = storage.local
    if local is not None:
        work = local / spec.folder
    else:
        work = scratch_folder(storage.url, spec.scratch) / spec.name
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {work}: {exc.strerror}", code="storage_failed") from exc
    run, source, lines, first, first_entry = await anyio.to_thread.run_sync(
        _prepare_shard, storage, spec, surface, work, lambda: client_run_id(storage, client)
    )
    store = _ShardStore(storage, spec, work)
    prepare = None if local is not None else (lambda: _restore(storage, spec, work))
    with Ledger.open(work, prepare=prepare) as ledger:
        record = await anyio.to_thread.run_sync(_ShardRecord, storage, spec, work, run, lines)
        with _Checkpoints(storage, spec, work, ledger, on=local is None) as store.checkpoints:
            report = await execute(
                source, work, ledger, client=client, concurrency=spec.concurrency,
                timeout=spec.timeout, surface=surface, skip_bad_lines=spec.skip_bad_lines,
                allow_changes=spec.allow_changes, collect=False, wait=True, verify=spec.verify,
                gallery=False, on_progress=on_progress, format=spec.format, record=record,
                lines=lines if not spec.sliced else None, first_line=first,
                first_entry=first_entry, store=store,
            )  # fmt: skip
    if local is None and report.exit_code != 3:  # nothing left to resume here
        shutil.rmtree(work, ignore_errors=True)
    return ShardReport.from_batch(spec, lines, report)


class _Checkpoints:
    """A remote shard's ledger checkpointed every ``checkpoint_every`` seconds while it runs,
    by a thread of its own (a backup and an upload block; the run's event loop never waits on
    them). A failed checkpoint is only logged: the next one, or the last, catches up."""

    def __init__(
        self, storage: Storage, spec: ShardSpec, work: Path, ledger: Ledger, *, on: bool
    ) -> None:
        self.storage, self.spec, self.work, self.ledger = storage, spec, work, ledger
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="imggw-checkpoints", daemon=True)
        self.on = on

    def __enter__(self) -> _Checkpoints:
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(self.spec.checkpoint_every):
            try:
                self.ledger.flush()
                checkpoint(self.storage, self.spec, self.work)
            except StorageError as err:
                log.warning("shard %s: %s", self.spec.name, err.message)


def run_shard(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    index: int,
    count: int,
    client_factory: Callable[[], AsyncClient] | None = None,
    rate_limit: RateLimit | None = None,
    concurrency: int = 8,
    timeout: float | None = None,
    surface: str | None = None,
    skip_bad_lines: bool = False,
    allow_changes: bool = False,
    verify: bool = False,
    storage_options: dict[str, Any] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    format: str | None = None,
) -> ShardReport:
    """Runs shard ``index`` of ``count`` (1-based) of ``source`` into ``dest`` (a folder or an
    fsspec URL), in this process, with no engine: what ``imggw batch FILE -o DEST --shard I/N``
    runs, for Kubernetes indexed jobs, Slurm arrays or ``xargs -P``. Any number of shards may
    run at once on one output folder; the first one on a fresh folder makes its run id, the
    others load it (each derives the same one from the folder, the gateway and the API key, as
    :func:`run_batch` does). ``format`` as in :func:`iter_lines`. Then :func:`merge` writes
    ``manifest.jsonl``.

    Each process has its own request budget (``rate_limit``): divide the gateway's limit among
    the processes that run at once, or run on Dask (:func:`run_sharded`), whose budget is one.

    Example::

        for i in (1, 2, 3):
            run_shard("prompts.jsonl", "out/", index=i, count=3)
        merge("out/")
    """
    if client_factory is not None and rate_limit is not None:
        raise RequestValidationError(
            "rate_limit", "give it to the client your client_factory makes", code="invalid_option"
        )
    spec = ShardSpec(
        source=os.fspath(source), dest=os.fspath(dest), index=index, count=count,
        storage_options=dict(storage_options or {}), concurrency=concurrency, timeout=timeout,
        surface=surface, skip_bad_lines=skip_bad_lines, allow_changes=allow_changes,
        verify=verify, scratch=None if scratch is None else os.fspath(scratch), format=format,
    )  # fmt: skip

    async def main() -> ShardReport:
        client = client_factory() if client_factory else AsyncClient(rate_limit=rate_limit)
        async with client:
            return await arun_shard(spec, client=client, on_progress=on_progress)

    return anyio.run(main)


# ---------------------------------------------------------------------------- reading a run


# How far a line has come, to pick, among every record of it in a folder (shard manifests,
# ledgers, checkpoints, a single run's ledger), the newest: a line only moves forward.
_MISSING, _PENDING, _RUNNING, _SUCCEEDED, _FINAL, _SAVED = range(6)


def _rank(record: dict[str, Any]) -> int:
    status = record.get("status")
    if status == "succeeded" and record.get("files"):
        return _SAVED
    if status == "failed" or record.get("error") is not None:
        return _FINAL
    return {"succeeded": _SUCCEEDED, "running": _RUNNING, "pending": _PENDING}.get(
        str(status), _MISSING
    )


def _placeholder(line: int) -> dict[str, Any]:
    return {"line": line, "task_id": None, "status": "pending", "files": [], "error": None}


def _ledger_records(path: Path) -> Iterator[dict[str, Any]]:
    """A ledger's (or a checkpoint's) current plan, in line order, as manifest records; read
    only (a live shard may be writing it)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        return
    with closing(db):
        try:
            found = db.execute("SELECT value FROM meta WHERE key='plan'").fetchone()
            if found is None:
                return
            cursor = db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM lines WHERE planned=? ORDER BY line",
                (int(found[0]),),
            )
            for values in cursor:
                row = Row.from_values(values)
                record = manifest_record(row)
                record["_bad"] = row.kind == "bad"
                yield record
        except sqlite3.Error:
            return


def _manifest_records(path: Path, where: str) -> Iterator[dict[str, Any]]:
    """A shard's manifest, written when it ended. A damaged one stops the reading with what to
    do: without it, the same command runs the shard again, which rewrites it from its ledger."""
    try:
        for record in iter_manifest(path):
            line = record.get("line")
            if isinstance(line, int) and not isinstance(line, bool):
                error = record.get("error")
                record["_bad"] = isinstance(error, dict) and error.get("code") == INVALID_LINE
                yield record
    except (OSError, ValueError) as exc:
        raise StorageError(
            f"{where} is damaged ({exc}); delete it, then run the same command: the shard "
            "writes it again from its ledger",
            code="storage_failed",
        ) from exc


class _Snapshot:
    """The files of an output folder that tell its progress, on this machine's disk (copied to
    a temp folder when the output folder is remote)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if storage.local is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="imggw-")

    def path(self, rel: str) -> Path | None:
        local = self.storage.local
        if local is not None:
            path = local / rel
            return path if path.exists() else None
        assert self._tmp is not None
        path = Path(self._tmp.name) / rel.replace("/", "__")
        return path if self.storage.get(rel, path) else None

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


@dataclass
class RunStatus:
    """A run's progress, read from its output folder alone: ``total`` lines, ``counts`` per
    state as the CLI and the manifest name them (pending, running, succeeded, failed: a line
    whose task succeeded but whose files are not saved yet is running, one whose results
    expired before they were saved failed), lines of bad input apart in ``bad``, and each
    shard's state. ``exit_code`` as ``imggw batch``: 0 all saved, 1 some failed, 3 unfinished.

    Example::

        st = status("out/")
        print(st.total, st.counts)
    """

    total: int
    counts: dict[str, int]
    bad: int
    shards: list[dict[str, Any]]

    @property
    def exit_code(self) -> int:
        if self.counts.get("pending", 0) or self.counts.get("running", 0):
            return 3
        return 1 if self.counts.get("failed", 0) or self.bad else 0

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "counts": self.counts, "bad": self.bad,
                "shards": self.shards}  # fmt: skip


def _sources(
    storage: Storage, snap: _Snapshot
) -> tuple[list[Iterator[dict[str, Any]]], list[dict[str, Any]]]:
    """Every record of progress in the folder, and each shard found."""
    sources: list[Iterator[dict[str, Any]]] = []
    shards: list[dict[str, Any]] = []
    single = snap.path(LEDGER_NAME)
    if single is not None:
        sources.append(_ledger_records(single))
    for name in storage.listdir(SHARDS_DIR):
        match = _SHARD.fullmatch(name)
        if match is None:
            continue
        manifest = snap.path(f"{SHARDS_DIR}/{name}/{MANIFEST_NAME}")
        ledger = snap.path(f"{SHARDS_DIR}/{name}/{LEDGER_NAME}")
        if manifest is not None:
            where = storage.where(f"{SHARDS_DIR}/{name}/{MANIFEST_NAME}")
            sources.append(_manifest_records(manifest, where))
        if ledger is not None:
            sources.append(_ledger_records(ledger))
        shards.append({"shard": name, "index": int(match[1]), "count": int(match[2]),
                       "ended": manifest is not None})  # fmt: skip
    return sources, shards


def _merged(
    storage: Storage, snap: _Snapshot
) -> tuple[Iterator[dict[str, Any]], list[dict[str, Any]]]:
    """One record per line, in line order: the furthest any record of the folder got, or
    pending for a line of the input no record speaks of yet."""
    sources, shards = _sources(storage, snap)
    lines_fp = snap.path(_identity.LINES_NAME)
    placeholders: Iterator[dict[str, Any]] = iter(())
    if lines_fp is not None:
        placeholders = (_placeholder(n) for n in _identity.entry_lines(lines_fp))

    def tagged(i: int, source: Iterable[dict[str, Any]]) -> Iterator[tuple[int, int, int, Any]]:
        for record in source:
            yield record["line"], -_rank(record), i, record

    streams = [tagged(i, s) for i, s in enumerate([placeholders, *sources])]

    def best() -> Iterator[dict[str, Any]]:
        last = None
        for line, _, _, record in heapq.merge(*streams):
            if line != last:  # the first of a line is its furthest (ranks sort descending)
                last = line
                yield record

    return best(), shards


def status(
    dest: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> RunStatus:
    """A run's progress from its output folder alone (a single run's, or a sharded one's,
    local or remote): what ``imggw batch status DEST`` prints.

    Example::

        print(status("s3://bucket/run").counts)
    """
    storage = open_storage(os.fspath(dest), storage_options)
    if load_identity(storage) is None and storage.size(LEDGER_NAME) is None:
        raise RequestValidationError(
            "dest", f"{storage.url} is not a batch's output folder (no run.json)"
        )
    snap = _Snapshot(storage)
    try:
        records, shards = _merged(storage, snap)
        counts: Counter[str] = Counter()
        bad = 0
        for record in records:
            if record.get("_bad"):
                bad += 1
                continue
            rank = _rank(record)
            # A line expired before it could be saved is final too: failed.
            state = {_SAVED: "succeeded", _FINAL: "failed", _SUCCEEDED: "running",
                     _RUNNING: "running"}.get(rank, "pending")  # fmt: skip
            counts[state] += 1
    finally:
        snap.close()
    ordered = {state: counts.get(state, 0) for state in ("pending", "running", "succeeded",
                                                            "failed")}  # fmt: skip
    return RunStatus(sum(ordered.values()), ordered, bad, shards)


@dataclass
class MergeReport:
    """What :func:`merge` wrote: the manifest's location, lines per status, and the exit code
    as ``imggw batch`` gives it (0 all saved, 1 some failed, 3 some unfinished).

    Example::

        report = merge("out/")
        print(report.manifest, report.counts)
    """

    manifest: str
    counts: dict[str, int]
    exit_code: int
    shards: list[dict[str, Any]]


def merge(
    dest: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    gallery: bool = True,
    title: str | None = None,
) -> MergeReport:
    """Writes ``DEST/manifest.jsonl`` (whole) from the shards' manifests (and, for shards
    still running or cut short, their ledgers): one row per input line in line order, DESIGN
    7's pinned fields and the runner's others, ``files[].path`` relative to ``DEST``; lines no
    shard has reached yet are pending. With ``gallery``, ``DEST/index.html`` too.

    Example::

        report = merge("out/")
        sys.exit(report.exit_code)
    """
    storage = open_storage(os.fspath(dest), storage_options)
    if load_identity(storage) is None:
        raise RequestValidationError(
            "dest", f"{storage.url} is not a batch's output folder (no run.json)"
        )
    snap = _Snapshot(storage)
    work = Path(tempfile.mkdtemp(prefix="imggw-merge-"))
    counts: Counter[str] = Counter()
    worst = 0
    try:
        records, shards = _merged(storage, snap)

        def counted() -> Iterator[dict[str, Any]]:
            nonlocal worst
            for record in records:
                record.pop("_bad", None)
                counts[str(record.get("status"))] += 1
                worst = max(worst, {_SAVED: 0, _FINAL: 1}.get(_rank(record), 3))
                yield record

        local = storage.local
        written = write_manifest(local if local is not None else work, counted())
        if local is None:
            storage.put(written, MANIFEST_NAME)
        if gallery:
            _merge_gallery(storage, work, title or f"imggw batch: {Path(storage.url).name}")
    finally:
        snap.close()
        shutil.rmtree(work, ignore_errors=True)
    return MergeReport(storage.where(MANIFEST_NAME), dict(counts), worst, shards)


def _merge_gallery(storage: Storage, work: Path, title: str) -> None:
    local = storage.local
    if local is not None:
        write_gallery(local, iter_manifest(local / MANIFEST_NAME), title=title)
        return
    manifest = work / MANIFEST_NAME
    storage.get(MANIFEST_NAME, manifest)
    page = write_gallery(work, iter_manifest(manifest), title=title)
    # The pages first, then the page that names them: a reader never sees a half gallery.
    for path in sorted((work / GALLERY_DIR).rglob("*")):
        if path.is_file():
            storage.put(path, path.relative_to(work).as_posix())
    storage.put(page, GALLERY_NAME)


# ---------------------------------------------------------------------------- helpers


def slice_name(source: str) -> str:
    """The name of a shard's slice of ``source`` (its kind kept: JSONL, text, or ``.json``,
    read line by line as its source is)."""
    suffix = Path(source).suffix.lower()
    return SLICE_NAME + (suffix if suffix in (*JSONL_SUFFIXES, JSON_SUFFIX) else ".txt")


def write_slices(source: str, storage: Storage, count: int, total: int, work: Path) -> list[int]:
    """Cuts ``source`` into the slices of ``count`` shards, each put in its shard's folder in
    the output folder (where every worker can read it); returns each slice's first entry
    number (see :class:`InputLine`). Blocking."""
    name = slice_name(source)
    first_entries = []
    entries = 0
    with Path(source).open(encoding="utf-8-sig", newline="") as handle:
        lines = iter(handle)
        for index in range(1, count + 1):
            first_entries.append(entries + 1)
            span = shard_range(index, count, total)
            part = work / f".{name}.{index}.{secrets.token_hex(4)}"
            with part.open("w", encoding="utf-8", newline="") as out:
                for _ in span:
                    raw = next(lines)
                    stripped = raw.strip()
                    entries += bool(stripped) and not stripped.startswith("#")
                    out.write(raw)
            try:
                storage.put(part, f"{SHARDS_DIR}/{shard_name(index, count)}/{name}")
            finally:
                part.unlink(missing_ok=True)
    return first_entries
