"""A shard: one contiguous range of a run's input lines, run on its own, anywhere,
into one output folder (a local path or an fsspec URL) shared with the run's other shards.

The output folder::

    run.json, lines.fp          the run's identity: made once, before anything is sent
    <task id>-<n>.<ext>         every result, whole (as a single run saves them)
    shards/0001-of-0004/        one folder a shard: its ledger (live, or its last checkpoint),
        ledger.sqlite           lines.fp (its range of the input, as it last accepted it),
        lines.fp                manifest.jsonl (written whole each time the shard ends) and,
        manifest.jsonl          for a run on an engine, input.jsonl (its slice of the input)
    manifest.jsonl, index.html  the merge of the shards (``merge``), and its gallery

Each line's key follows from the run id (``_identity``): a shard run again anywhere, after a
worker death or a lost ledger, sends the same keys and the gateway replays its tasks. A shard on
a local folder works in place. On a remote one (``s3://...``) it works in a scratch folder: its
ledger lives there and is checkpointed into the output folder (a consistent copy, then one PUT);
each result is uploaded as soon as it is saved and verified, then deleted locally, so a dead
machine loses nothing saved.

How a run is cut into shards: contiguous ranges of input lines, named and numbered the same way
by every process that cuts the same file, and their slices of the input. Shard ``I`` of ``N``
holds lines ``(I-1)*T//N + 1`` to ``I*T//N`` of a file of ``T`` lines (blank and comment lines
counted), so every process that cuts the same file into ``N`` agrees without talking.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from ..._async_client import AsyncClient
from ..._base_client import key_fingerprint
from ..._core.config import ENV_API_KEY, ENV_BASE_URL, RateLimit, check_surface
from ..._core.exceptions import RequestValidationError
from ..._core.models import DownloadedFile
from ..._files import TEMP_BYTES, StorageError, create_new, temp_name
from ..._journal.schema import LEDGER_NAME, SHARDS_DIR
from .. import _identity
from .._admission import Guard
from .._input import CSV_SUFFIXES, JSON_SUFFIX, JSONL_SUFFIXES, count_lines, line_kinds, reads_csv
from .._ledger import Ledger
from .._lines import ENTRY, HEADER, MORE
from .._plan import BatchOptions, Slice, scan_input
from .._report import MANIFEST_NAME, BatchProgress, BatchReport, RunOutcome
from .._run import client_maker, execute, run_id_for
from .._schema import ExitCode, checkpoint_number, copy_ledger
from .._store import Workspace
from ._storage import Storage, destination_name, open_storage

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .._plan import RunOptions

__all__ = [
    "CHECKPOINT_EVERY",
    "ShardReport",
    "ShardSpec",
    "arun_shard",
    "check_shard",
    "env_fingerprint",
    "env_run_id",
    "parse_shard",
    "run_shard",
    "scratch_folder",
    "shard_folder",
    "shard_name",
    "shard_range",
    "slice_name",
    "write_slices",
]


log = logging.getLogger("imggw_client")
CHECKPOINT_EVERY = 30.0  # seconds between checkpoints of a remote shard's ledger


@dataclass(frozen=True)
class ShardSpec:
    """Everything a shard needs, and nothing secret (it travels to workers): the input (a file
    this machine reads, or with ``sliced`` the slice the driver put in the output folder, at
    ``lines`` whose first entry is ``first_entry``), the output folder and the run's
    :class:`BatchOptions`. The API key is never here: each machine's client reads
    ``IMGGW_API_KEY`` from its own environment.

    Example::

        spec = ShardSpec("prompts.jsonl", "s3://bucket/run", 2, 4, BatchOptions(concurrency=4))
    """

    source: str
    dest: str
    index: int
    count: int
    options: BatchOptions = field(default_factory=BatchOptions)
    storage_options: dict[str, Any] = field(default_factory=dict)
    scratch: str | None = None
    checkpoint_every: float = CHECKPOINT_EVERY
    sliced: bool = False
    lines: range | None = None  # the shard's range, when the caller cut it already
    first_entry: int = 1  # with ``sliced``: the entry number of the slice's first line

    @property
    def name(self) -> str:
        return shard_name(self.index, self.count)

    @property
    def folder(self) -> str:
        return shard_folder(self.index, self.count)


@dataclass(kw_only=True)
class ShardReport(RunOutcome):
    """What one shard did: its range of input lines, its folder in the output folder
    (``shards/0001-of-0003``) and where its manifest is, and all a run's report tells
    (:class:`RunOutcome`: lines per state, money, its exit code as ``imggw batch`` gives it).

    Example::

        report = run_shard("prompts.jsonl", "out/", index=1, count=3)
        print(report.lines, report.counts, report.exit_code)
    """

    index: int
    count: int
    lines: range
    folder: str = ""
    manifest: str = ""

    @classmethod
    def of(cls, spec: ShardSpec, lines: range, report: BatchReport, manifest: str) -> ShardReport:
        shared = {f.name: getattr(report, f.name) for f in fields(RunOutcome)}
        return cls(
            index=spec.index,
            count=spec.count,
            lines=lines,
            folder=spec.folder,
            manifest=manifest,
            **shared,
        )


def env_run_id(storage: Storage, base_url: str | None = None) -> str:
    """A new run's id as a process with no client works it out (the Dask driver): derived, as
    :func:`run_id_for` derives it, from the folder, the gateway (``base_url``, else
    ``IMGGW_BASE_URL``) and ``IMGGW_API_KEY``; random when either is not known."""
    key, url = os.environ.get(ENV_API_KEY), base_url or os.environ.get(ENV_BASE_URL)
    if not key or not url:
        return _identity.random_run_id()
    place = destination_name(storage.url)
    return _identity.derive_run_id(place, url.rstrip("/"), key_fingerprint(key))


def env_fingerprint() -> str | None:
    """The slow fingerprint of ``IMGGW_API_KEY`` as a process with no client sees it (the Dask
    driver), or None when it has no key (the workers then record theirs)."""
    key = os.environ.get(ENV_API_KEY)
    return key_fingerprint(key) if key else None


class ShardIdentity:
    """A shard's record of its range of the input: its own ``lines.fp`` if it accepted one,
    else the run's, cut to its range. The run id and surface are the run's."""

    def __init__(
        self,
        storage: Storage,
        spec: ShardSpec,
        work: Path,
        run: _identity.RunIdentity,
        lines: range,
    ) -> None:
        self.storage, self.spec, self.work, self.lines = storage, spec, work, lines
        self.run_id, self.surface = run.run_id, run.surface
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

    def accept(self, digests: _identity.LineDigests, input_digest: str) -> None:
        if self.has_own and not digests.changed_count:
            return
        digests.commit()  # the shard's lines.fp in its work folder ...
        if self.storage.local is None:  # ... and in the output folder
            data = (self.work / _identity.LINES_NAME).read_bytes()
            self.storage.write(f"{self.spec.folder}/{_identity.LINES_NAME}", data)


class ShardStore:
    """A shard's results put in the output folder as each is saved (local: a rename), and on
    a remote folder its ledger checkpointed there: every ``checkpoint_every`` seconds by a
    thread of its own while it runs (a copy and an upload block; the run's event loop never
    waits on them; a failed checkpoint is only logged: the next, or the last, catches up), and
    once more, with its manifest, when it ends."""

    def __init__(self, storage: Storage, spec: ShardSpec, work: Path) -> None:
        self.storage, self.spec, self.work = storage, spec, work
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, ledger: Ledger) -> None:
        if self.storage.local is None:

            def checkpoints() -> None:
                while not self.stop.wait(self.spec.checkpoint_every):
                    try:
                        ledger.flush()
                        self.checkpoint()
                    except StorageError as err:
                        log.warning("shard %s: %s", self.spec.name, err.message)

            self.thread = threading.Thread(
                target=checkpoints, name="imggw-checkpoints", daemon=True
            )
            self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None and self.thread.is_alive():
            self.thread.join()

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
            self.close()  # none of its uploads may land after the last
            self.checkpoint()
            self.storage.put(manifest, f"{self.spec.folder}/{MANIFEST_NAME}")

    def checkpoint(self) -> None:
        """Copies the shard's ledger into the output folder, whole."""
        tmp = temp_name(self.work / LEDGER_NAME)
        try:
            copy_ledger(self.work / LEDGER_NAME, tmp)
            self.storage.put(tmp, f"{self.spec.folder}/{LEDGER_NAME}")
        finally:
            tmp.unlink(missing_ok=True)

    def restore(self) -> None:
        """Puts the shard's checkpoint in its work folder, unless the ledger there is as new."""
        ledger = self.work / LEDGER_NAME
        fetched = self.work / f".{LEDGER_NAME}.restore"
        if not self.storage.get(f"{self.spec.folder}/{LEDGER_NAME}", fetched):
            return
        if checkpoint_number(fetched) > checkpoint_number(ledger):
            for suffix in ("-wal", "-shm"):
                Path(f"{ledger}{suffix}").unlink(missing_ok=True)
            os.replace(fetched, ledger)
        else:
            fetched.unlink(missing_ok=True)


def _prepare(
    storage: Storage,
    spec: ShardSpec,
    surface: str,
    work: Path,
    derive: Callable[[], str],
    fingerprint: str | None = None,
) -> tuple[_identity.RunIdentity, str, range, Slice]:
    """The run's identity (made once), the shard's input, its range, and the part of that input
    the shard reads; a run made with another key than ``fingerprint``'s is refused
    (``KeyChangedError``). Blocking."""
    if spec.sliced:  # an engine's driver made the identity and cut the input
        run = _identity.load_stored(storage)
        if run is None or spec.lines is None:
            raise RequestValidationError(
                "out_dir", f"{storage.url} has no run.json: the driver makes it before dispatch"
            )
        run = _identity.adopt_key(storage, run, fingerprint)
        # A CSV slice begins with the header row: the line before the shard's first.
        header = reads_csv(spec.source, format=spec.options.format)
        part = Slice(None, spec.lines.start - header, spec.first_entry, sliced=True)
        local = storage.local
        if local is not None:
            return run, str(local / spec.source), spec.lines, part
        path = work / Path(spec.source).name
        if not storage.get(spec.source, path):
            raise StorageError(f"{storage.where(spec.source)} is missing", code="storage_failed")
        return run, str(path), spec.lines, part
    lines = spec.lines or shard_range(spec.index, spec.count, count_lines(spec.source))
    run = _identity.load_stored(storage)
    if run is None:
        # A fresh folder: the whole input is checked first, so that whichever shard makes the
        # run id publishes the record of its input at once.
        scan = scan_input(
            spec.source, work, surface=surface, record=None, options=spec.options, refuse=False
        )
        try:
            run, _ = _identity.claim(
                storage,
                scan.digests,
                scan.plan.input_digest,
                run_id=derive(),
                surface=surface,
                key_fingerprint=fingerprint,
                name=spec.options.name,
                input_path=os.path.abspath(spec.source),
            )
        finally:
            scan.discard()
    run = _identity.adopt_key(storage, run, fingerprint)
    # If its maker died before lines.fp, the shard compares with nothing, as a first run does.
    _identity.wait_for_lines(storage)
    return run, spec.source, lines, Slice(lines)


async def arun_shard(
    spec: ShardSpec,
    *,
    client: AsyncClient,
    on_progress: Callable[[BatchProgress], None] | None = None,
    guard: Guard | None = None,
) -> ShardReport:
    """Runs (or resumes) one shard of a sharded run on the tracker's loop; any number of shards may
    run at once, on any machines, into one output folder. ``guard`` is the run's, when one
    holds it for every shard (a Dask scheduler); without, each shard holds 1/``count`` of the
    spend caps, so that the shards of a run together stay within them.

    Example::

        async with AsyncClient() as client:
            report = await arun_shard(ShardSpec("prompts.jsonl", "out/", 1, 3), client=client)
    """
    check_shard(spec.index, spec.count)
    options = spec.options
    storage = open_storage(spec.dest, spec.storage_options)
    surface = check_surface(options.surface or client.surface)
    local = storage.local
    work = (
        local / spec.folder
        if local is not None
        else (scratch_folder(storage.url, spec.scratch) / spec.name)
    )
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {work}: {exc.strerror}", code="storage_failed") from exc
    derive = lambda: run_id_for(storage.url, client)  # noqa: E731 - called once, if at all
    fingerprint = await anyio.to_thread.run_sync(lambda: client.key_fingerprint)  # slow once
    run, source, lines, part = await anyio.to_thread.run_sync(
        _prepare, storage, spec, surface, work, derive, fingerprint
    )
    store = ShardStore(storage, spec, work)
    with Ledger.open(work, prepare=None if local is not None else store.restore) as ledger:
        identity = await anyio.to_thread.run_sync(ShardIdentity, storage, spec, work, run, lines)
        store.start(ledger)
        try:
            # A shard reads its part as a plain run (its gallery is the merge's).
            shard_options = BatchOptions.of(
                {**options.as_keywords(), "gallery": False, "wait": True}
            )
            if guard is None:
                shard_options = _share_of(shard_options, spec.count)
            space = Workspace(work, ledger, identity, store, part)
            report = await execute(
                source,
                space,
                client=client,
                options=shard_options,
                on_progress=on_progress,
                guard=guard,
            )
        finally:
            store.close()
    if local is None and report.exit_code != ExitCode.UNFINISHED:  # nothing left to resume
        shutil.rmtree(work, ignore_errors=True)
    return ShardReport.of(spec, lines, report, storage.where(f"{spec.folder}/{MANIFEST_NAME}"))


def _share_of(options: BatchOptions, count: int) -> BatchOptions:
    """A shard's share of the run's spend caps when nothing holds them for every shard."""
    return replace(
        options,
        max_credits=None if options.max_credits is None else options.max_credits / count,
        max_cost=None if options.max_cost is None else options.max_cost / count,
    )


def run_shard(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    index: int,
    count: int,
    client_factory: Callable[[], AsyncClient] | None = None,
    rate_limit: RateLimit | None = None,
    storage_options: dict[str, Any] | None = None,
    scratch: str | os.PathLike[str] | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    **options: Unpack[RunOptions],
) -> ShardReport:
    """Runs shard ``index`` of ``count`` (1-based) of ``source`` into ``dest`` (a folder or an
    fsspec URL), in this process, with no engine: what ``imggw batch FILE -o DEST --shard I/N``
    runs, for Kubernetes indexed jobs, Slurm arrays or ``xargs -P``. Any number of shards may
    run at once on one output folder; the first one on a fresh folder makes its run id, the
    others load it (each derives the same one from the folder, the gateway and the API key, as
    :func:`run_batch` does). ``options`` as :func:`run_batch` takes them; the spend caps
    (``max_credits``, ``max_cost``) are the whole run's: this shard holds 1/``count`` of them.
    Then :func:`merge` writes ``manifest.jsonl``.

    Each process has its own request budget (``rate_limit``): divide the gateway's limit among
    the processes that run at once, or run on Dask (:func:`run_sharded`), whose budget is one.

    Example::

        for i in (1, 2, 3):
            run_shard("prompts.jsonl", "out/", index=i, count=3)
        merge("out/")
    """
    make = client_maker(client_factory, rate_limit)
    spec = ShardSpec(
        source=os.fspath(source),
        dest=os.fspath(dest),
        index=index,
        count=count,
        options=BatchOptions.of(options),
        storage_options=dict(storage_options or {}),
        scratch=None if scratch is None else os.fspath(scratch),
    )

    async def main() -> ShardReport:
        async with make() as client:
            return await arun_shard(spec, client=client, on_progress=on_progress)

    return anyio.run(main)


SLICE_NAME = "input"
_SHARD_TEXT = "must be I/N with 1 <= I <= N (shard I of N)"


def shard_name(index: int, count: int) -> str:
    """The shard's folder name under ``shards/``: ``0002-of-0004``."""
    return f"{index:04d}-of-{count:04d}"


def shard_folder(index: int, count: int) -> str:
    """The shard's folder, relative to the output folder: ``shards/0002-of-0004``."""
    return f"{SHARDS_DIR}/{shard_name(index, count)}"


def shard_range(index: int, count: int, total: int) -> range:
    """The line numbers of shard ``index`` (1-based) of ``count`` in a file of ``total`` lines.

    Example::

        assert shard_range(2, 3, 10) == range(4, 7)   # lines 4, 5 and 6
    """
    check_shard(index, count)
    return range((index - 1) * total // count + 1, index * total // count + 1)


def check_shard(index: object, count: object) -> tuple[int, int]:
    """``(index, count)`` when they name a shard, else one clear error."""
    ok = isinstance(index, int) and isinstance(count, int) and not isinstance(index, bool)
    if not ok or not 1 <= index <= count:  # type: ignore[operator]
        raise RequestValidationError("shard", _SHARD_TEXT, code="invalid_shard")
    return index, count  # type: ignore[return-value]


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: shard 2 of 4.

    Example::

        index, count = parse_shard("2/4")
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None:
        raise RequestValidationError("shard", _SHARD_TEXT, code="invalid_shard")
    return check_shard(int(match[1]), int(match[2]))


def scratch_folder(dest: str, scratch: str | os.PathLike[str] | None) -> Path:
    """Where a remote folder's shards work on this machine (one folder per output folder)."""
    base = Path(scratch) if scratch is not None else Path(tempfile.gettempdir()) / "imggw-scratch"
    return base / hashlib.sha256(dest.rstrip("/").encode()).hexdigest()[:16]


def slice_name(source: str) -> str:
    """The name of a shard's slice of ``source`` (its kind kept: JSONL, CSV, text, or
    ``.json``, read line by line as its source is)."""
    suffix = Path(source).suffix.lower()
    kept = (*JSONL_SUFFIXES, JSON_SUFFIX, *CSV_SUFFIXES)
    return SLICE_NAME + (suffix if suffix in kept else ".txt")


def write_slices(
    source: str,
    storage: Storage,
    count: int,
    total: int,
    work: Path,
    *,
    format: str | None = None,
) -> list[int]:
    """Cuts ``source`` into the slices of ``count`` shards, each put in its shard's folder in
    the output folder (where every worker can read it); returns each slice's first entry
    number (see ``InputLine``). Blocking.

    A CSV record belongs to the shard its first line is in: its slice begins with the header
    row, then holds the shard's lines, a record that goes on past them whole, and a blank line
    in place of the header row and of the rest of a record begun in an earlier slice, so that
    each line keeps its place (the slice's lines are numbered from the one before the shard's
    first: see ``_shards``)."""
    name = slice_name(source)
    first_entries = []
    entries = 0
    kinds = line_kinds(source, format=format)
    header = next((raw for raw, kind in line_kinds(source, format=format) if kind == HEADER), None)
    ahead: deque[tuple[str, str]] = deque()  # lines read past a slice, to place in the next
    for index in range(1, count + 1):
        first_entries.append(entries + 1)
        part = work / f".{name}.{index}.{secrets.token_hex(TEMP_BYTES)}"
        with os.fdopen(create_new(part), "w", encoding="utf-8", newline="") as out:
            if header is not None:
                out.write(header)
            mine = False  # the record going on began in this slice
            for _ in shard_range(index, count, total):
                raw, kind = ahead.popleft() if ahead else next(kinds)
                entries += kind == ENTRY
                if kind != MORE:
                    mine = kind == ENTRY
                out.write("\n" if kind == HEADER or (kind == MORE and not mine) else raw)
            while mine and header is not None:  # the last record, to its end
                following = next(kinds, None)
                if following is None:
                    break
                ahead.append(following)
                mine = following[1] == MORE
                if mine:
                    out.write(following[0])
        try:
            storage.put(part, f"{shard_folder(index, count)}/{name}")
        finally:
            part.unlink(missing_ok=True)
    kinds.close()
    return first_entries
