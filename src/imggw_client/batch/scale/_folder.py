"""A run read from its output folder alone, local or remote, single or sharded: its progress
(:func:`status`) and its merged manifest and gallery (:func:`merge`).

Every record of a line in the folder (a single run's ledger, each shard's manifest, ledger or
checkpoint) is read in line order and merged: the furthest any of them got wins, since a line
only moves forward, and a line of the input no record speaks of yet is pending.
"""

from __future__ import annotations

import heapq
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._core import reasons
from ..._core.exceptions import RequestValidationError
from ..._files import StorageError
from ..._journal.schema import LEDGER_NAME, SHARD_NAME, SHARDS_DIR
from .. import _identity
from .._admission import Charge, charge_of, settles
from .._gallery import GALLERY_DIR, GALLERY_NAME, write_gallery
from .._ledger import INVALID_LINE, STOPPED_BY, is_locked
from .._report import MANIFEST_NAME, iter_manifest, manifest_row, write_manifest
from .._schema import STATUSES, ExitCode, charged_apart, exit_code, read_meta, read_rows
from ._storage import Storage, open_storage

EXPIRED_CODE = reasons.RESULT_EXPIRED.code

__all__ = ["MergeReport", "RunStatus", "charges", "merge", "status"]

# How far a line has come, to pick the furthest of its records: files saved, then a final
# failure, then a task on its way. A manifest older than the states' one word per state says
# "succeeded" for a task whose files are not saved yet: it ranks as on its way.
_MISSING, _PENDING, _RUNNING, _FINAL, _SAVED = range(5)
_STATUS_OF_RANK = {_SAVED: "succeeded", _FINAL: "failed", _RUNNING: "running"}


def _rank(row: dict[str, Any]) -> int:
    status = row.get("status")
    if status == "succeeded" and row.get("files"):
        return _SAVED
    if status == "failed" or row.get("error") is not None:
        return _FINAL
    if status in ("running", "succeeded"):
        return _RUNNING
    return _PENDING if status == "pending" else _MISSING


def _placeholder(line: int) -> dict[str, Any]:
    return {"line": line, "task_id": None, "status": "pending", "files": [], "error": None}


def _ledger_rows(path: Path) -> Iterator[dict[str, Any]]:
    """A ledger's (or a checkpoint's) last plan as manifest rows; read only."""
    for row in read_rows(path):
        shown = manifest_row(row)
        shown["_bad"] = row.is_bad
        yield shown


def _manifest_rows(path: Path, where: str) -> Iterator[dict[str, Any]]:
    """A shard's manifest, written when it ended. A damaged one stops the reading with what to
    do: without it, the same command runs the shard again, which rewrites it from its ledger."""
    try:
        for row in iter_manifest(path):
            line = row.get("line")
            if isinstance(line, int) and not isinstance(line, bool):
                error = row.get("error")
                row["_bad"] = isinstance(error, dict) and error.get("code") == INVALID_LINE
                yield row
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
        self._copied: dict[str, Path | None] = {}
        if storage.local is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="imggw-")

    def path(self, rel: str) -> Path | None:
        local = self.storage.local
        if local is not None:
            path = local / rel
            return path if path.exists() else None
        assert self._tmp is not None
        if rel not in self._copied:  # each file copied once, whoever reads it
            path = Path(self._tmp.name) / rel.replace("/", "__")
            self._copied[rel] = path if self.storage.get(rel, path) else None
        return self._copied[rel]

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def _sources(
    storage: Storage, snap: _Snapshot
) -> tuple[list[Iterator[dict[str, Any]]], list[dict[str, Any]]]:
    """Every record of progress in the folder, and each shard found."""
    sources: list[Iterator[dict[str, Any]]] = []
    shards: list[dict[str, Any]] = []
    single = snap.path(LEDGER_NAME)
    if single is not None:
        sources.append(_ledger_rows(single))
    for name in storage.listdir(SHARDS_DIR):
        match = SHARD_NAME.fullmatch(name)
        if match is None:
            continue
        manifest = snap.path(f"{SHARDS_DIR}/{name}/{MANIFEST_NAME}")
        ledger = snap.path(f"{SHARDS_DIR}/{name}/{LEDGER_NAME}")
        if manifest is not None:
            where = storage.where(f"{SHARDS_DIR}/{name}/{MANIFEST_NAME}")
            sources.append(_manifest_rows(manifest, where))
        if ledger is not None:
            sources.append(_ledger_rows(ledger))
        shards.append(
            {
                "shard": name,
                "index": int(match[1]),
                "count": int(match[2]),
                "ended": manifest is not None,
            }
        )
    return sources, shards


def _merged(
    storage: Storage, snap: _Snapshot
) -> tuple[Iterator[dict[str, Any]], list[dict[str, Any]]]:
    """One row per line, in line order: the furthest any record of the folder got, or
    pending for a line of the input no record speaks of yet."""
    sources, shards = _sources(storage, snap)
    lines_fp = snap.path(_identity.LINES_NAME)
    placeholders: Iterator[dict[str, Any]] = iter(())
    if lines_fp is not None:
        placeholders = (_placeholder(n) for n in _identity.entry_lines(lines_fp))

    def tagged(i: int, source: Iterable[dict[str, Any]]) -> Iterator[tuple[int, int, int, Any]]:
        for row in source:
            yield row["line"], -_rank(row), i, row

    streams = [tagged(i, s) for i, s in enumerate([placeholders, *sources])]

    def best() -> Iterator[dict[str, Any]]:
        last = None
        for line, _, _, row in heapq.merge(*streams):
            if line != last:  # the first of a line is its furthest (ranks sort descending)
                last = line
                yield row

    return best(), shards


@dataclass
class RunStatus:
    """A run's progress, read from its output folder alone: ``total`` lines, ``counts`` per
    status as the CLI and the manifest name them (pending, running, succeeded, failed: a line
    whose task succeeded but whose files are not saved yet is running), lines whose results
    expired before they were saved apart in ``expired`` (the manifest says failed, with error
    ``result_expired``; the gallery counts them apart too), lines of bad input apart in
    ``bad``, each shard's state, what the run's lines were charged (``spent``: credits and
    cost, None where never stated), the guard that stopped its last run's submits
    (``stopped_by``, or None), whether a run holds the folder now (``active``: None where it
    cannot be told, a remote folder) and the soonest link expiry among results not saved yet
    (``soonest_expiry``, ISO 8601 UTC, or None). ``exit_code`` as ``imggw batch``: 0 all saved,
    1 some failed or expired, 3 unfinished, 6 stopped.

    Example::

        run_batch("prompts.jsonl", "out/")
        st = status("out/")
        print(st.total, st.counts)
    """

    total: int
    counts: dict[str, int]
    bad: int
    shards: list[dict[str, Any]]
    spent: Charge = field(default_factory=Charge)
    stopped_by: str | None = None
    expired: int = 0
    active: bool | None = None
    soonest_expiry: str | None = None

    @property
    def exit_code(self) -> ExitCode:
        counts = {**self.counts, "failed": self.counts.get("failed", 0) + self.expired}
        return exit_code(counts, bad=self.bad, stopped_by=self.stopped_by)

    def as_dict(self) -> dict[str, Any]:
        spent = {"credits": self.spent.credits, "cost": self.spent.cost}
        return {
            "total": self.total,
            "counts": self.counts,
            "expired": self.expired,
            "bad": self.bad,
            "shards": self.shards,
            "spent": spent,
            "stopped_by": self.stopped_by,
            "active": self.active,
            "soonest_expiry": self.soonest_expiry,
        }


def _opened(
    dest: str | os.PathLike[str], options: dict[str, Any] | None, *, ledger_will_do: bool
) -> Storage:
    storage = open_storage(os.fspath(dest), options)
    known = _identity.load_stored(storage) is not None
    if not known and not (ledger_will_do and storage.size(LEDGER_NAME) is not None):
        raise RequestValidationError(
            "dest", f"{storage.url} is not a batch's output folder (no run.json)"
        )
    return storage


def charges(storage: Storage) -> tuple[Charge, dict[str, Charge]]:
    """What a run's folder says its runs were charged: in all, and the highest price per
    resolution (what a Dask run's guard starts from: a positive charge, or a saved line's; a
    task stating 0 while it runs has told no price). In all counts, as one run's cap does,
    the lines since removed from the input and what changed lines' tasks were charged before
    their rows were made anew (each ledger's :func:`charged_apart`). Blocking."""
    snap = _Snapshot(storage)
    credits, cost, seen_cost = 0.0, 0.0, False
    prices: dict[str, Charge] = {}
    tasks: set[object] = set()
    replaced: dict[str, list[float]] = {}
    try:
        for ledger in _ledgers(storage, snap):
            apart_credits, apart_cost, apart = charged_apart(ledger)
            credits, cost = credits + apart_credits, cost + apart_cost
            seen_cost = seen_cost or apart_cost > 0
            replaced |= apart
        rows, _ = _merged(storage, snap)
        for row in rows:
            tasks.add(row.get("task_id"))
            charge = charge_of([row.get("credits"), row.get("cost")])
            if not charge.known:
                continue
            credits += charge.credits or 0.0
            cost += charge.cost or 0.0
            seen_cost = seen_cost or charge.cost is not None
            if settles(charge, final=row.get("status") == "succeeded"):
                res = str(row.get("resolution") or "")
                prices[res] = prices.get(res, Charge()).highest(charge)
    finally:
        snap.close()
    for task_id, (was_credits, was_cost) in replaced.items():
        if task_id not in tasks:  # a task a line holds again is counted there
            credits, cost = credits + was_credits, cost + was_cost
            seen_cost = seen_cost or was_cost > 0
    return Charge(credits, cost if seen_cost else None), prices


def _ledgers(storage: Storage, snap: _Snapshot) -> Iterator[Path]:
    """The folder's ledger and its shards' (as copied to this machine)."""
    names = [LEDGER_NAME] + [
        f"{SHARDS_DIR}/{name}/{LEDGER_NAME}"
        for name in storage.listdir(SHARDS_DIR)
        if SHARD_NAME.fullmatch(name)
    ]
    for name in names:
        path = snap.path(name)
        if path is not None:
            yield path


def status(
    dest: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None
) -> RunStatus:
    """A run's progress from its output folder alone (a single run's, or a sharded one's,
    local or remote): what ``imggw batch status DEST`` prints.

    Example::

        run_batch("prompts.jsonl", "out/")
        print(status("out/").counts)              # a folder on S3 too: "s3://bucket/run"
    """
    storage = _opened(dest, storage_options, ledger_will_do=True)
    snap = _Snapshot(storage)
    try:
        rows, shards = _merged(storage, snap)
        counts: Counter[str] = Counter()
        bad, expired, credits, cost, seen_cost = 0, 0, 0.0, 0.0, False
        soonest: str | None = None
        for row in rows:
            if row.get("_bad"):
                bad += 1
                continue
            rank = _rank(row)
            error = row.get("error")
            if rank == _FINAL and isinstance(error, dict) and error.get("code") == EXPIRED_CODE:
                expired += 1
            else:
                counts[_STATUS_OF_RANK.get(rank, "pending")] += 1
            when = row.get("expires_at")
            if rank == _RUNNING and isinstance(when, str) and (soonest is None or when < soonest):
                soonest = when  # ISO 8601 UTC, all written alike: their order is time's
            charge = charge_of([row.get("credits"), row.get("cost")])
            credits += charge.credits or 0.0
            cost += charge.cost or 0.0
            seen_cost = seen_cost or charge.cost is not None
        stopped_by = _stopped_by(storage, snap, shards)
    finally:
        snap.close()
    ordered = {word: counts.get(word, 0) for word in STATUSES}
    spent = Charge(credits, round(cost, 6) if seen_cost else None)
    return RunStatus(
        sum(ordered.values()) + expired,
        ordered,
        bad,
        shards,
        spent,
        stopped_by,
        expired=expired,
        active=held(storage, shards),
        soonest_expiry=soonest,
    )


def held(storage: Storage, shards: list[dict[str, Any]]) -> bool | None:
    """Whether a run holds the folder (or one of its shards' folders) now: its lock is taken.
    None for a remote folder, whose runs lock their own scratch folders. Never waits."""
    local = storage.local
    if local is None:
        return None
    folders = [local] + [local / SHARDS_DIR / str(s["shard"]) for s in shards]
    return any(is_locked(folder) for folder in folders if folder.is_dir())


def _stopped_by(storage: Storage, snap: _Snapshot, shards: list[dict[str, Any]]) -> str | None:
    """The guard the folder's ledgers say stopped their last run's submits, if one did."""
    ledgers = [LEDGER_NAME] + [f"{SHARDS_DIR}/{s['shard']}/{LEDGER_NAME}" for s in shards]
    for rel in ledgers:
        path = snap.path(rel)
        found = read_meta(path, STOPPED_BY) if path is not None else None
        if found is not None:
            return found
    return None


@dataclass
class MergeReport:
    """What :func:`merge` wrote: the manifest's location, lines per status, and the exit code
    as ``imggw batch`` gives it (0 all saved, 1 some failed, 3 some unfinished).

    Example::

        run_shard("prompts.jsonl", "out/", index=1, count=1)
        report = merge("out/")
        print(report.manifest, report.counts)
    """

    manifest: str
    counts: dict[str, int]
    shards: list[dict[str, Any]]

    @property
    def exit_code(self) -> ExitCode:
        return exit_code(self.counts)


def merge(
    dest: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    gallery: bool = True,
    title: str | None = None,
) -> MergeReport:
    """Writes ``DEST/manifest.jsonl`` (whole) from the shards' manifests (and, for shards
    still running or cut short, their ledgers): one row per input line in line order, DESIGN
    7's pinned fields and the engine's others, ``files[].path`` relative to ``DEST``; lines no
    shard has reached yet are pending. With ``gallery``, ``DEST/index.html`` too.

    Example::

        for i in (1, 2):
            run_shard("prompts.jsonl", "out/", index=i, count=2)
        report = merge("out/")
        sys.exit(report.exit_code)
    """
    storage = _opened(dest, storage_options, ledger_will_do=False)
    snap = _Snapshot(storage)
    work = Path(tempfile.mkdtemp(prefix="imggw-merge-"))
    counts: Counter[str] = Counter()
    try:
        rows, shards = _merged(storage, snap)

        def counted() -> Iterator[dict[str, Any]]:
            for row in rows:
                row.pop("_bad", None)
                counts[_STATUS_OF_RANK.get(_rank(row), "pending")] += 1
                yield row

        local = storage.local
        written = write_manifest(local if local is not None else work, counted())
        if local is None:
            storage.put(written, MANIFEST_NAME)
        if gallery:
            _merge_gallery(storage, work, title or f"imggw batch: {Path(storage.url).name}")
    finally:
        snap.close()
        shutil.rmtree(work, ignore_errors=True)
    return MergeReport(storage.where(MANIFEST_NAME), dict(counts), shards)


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
