"""What a Dask run shows between shard completions: lines per status across every shard, read
from the output folder as ``status()`` reads it (each running shard's ledger on a local
folder, its latest checkpoint on a remote one), by a thread of the driver's, every few
seconds; a read that fails is tried again the next time, and the run never waits for one."""

from __future__ import annotations

import logging
import re
import tempfile
import time
from bisect import bisect_right
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from ..._journal.schema import LEDGER_NAME, SHARDS_DIR
from .._input import line_kinds
from .._lines import ENTRY
from .._schema import count_statuses
from ._shards import shard_range
from ._storage import Storage

if TYPE_CHECKING:
    from distributed import Client as DaskClient

__all__ = ["PROGRESS_EVERY", "SHARD_KEY", "ProgressReader", "ShardedProgress", "watch"]

log = logging.getLogger("imggw_client")
PROGRESS_EVERY = 2.0  # seconds between two readings of the run's progress
SHARD_KEY = "imggw-shard-"  # the driver's Dask keys: this, the shard's name, the run id's start


@dataclass(frozen=True)
class ShardedProgress:
    """How far a sharded run has come across every shard, as last read from its output folder:
    ``total`` lines (bad input lines apart, in ``bad``), ``counts`` per state as :func:`status`
    names them (pending, running, succeeded, failed), the shards that ended in this run,
    seconds since dispatch began and lines finished per second since the first reading.

    Example::

        def show(p: ShardedProgress) -> None:
            print(f"{p.finished}/{p.total} lines, {p.shards_ended}/{p.shards} shards ended")

        run_sharded("prompts.jsonl", "out/", workers=4, on_progress=show)
    """

    total: int
    counts: dict[str, int]
    bad: int
    shards: int
    shards_ended: int
    elapsed: float
    throughput: float

    @property
    def finished(self) -> int:
        """Lines that are done with: succeeded (saved) or failed."""
        return self.counts["succeeded"] + self.counts["failed"]


class ProgressReader:
    """Lines per state of every shard, read from the output folder. Blocking: it runs in a
    thread. A shard is read once before it runs (a resumed run's shards did some already),
    while it runs (the scheduler says which do) and once after it ended; on a remote folder,
    no sooner than a new checkpoint can be there. A shard that cannot be read now keeps what
    was read before, and is read again the next time."""

    def __init__(
        self,
        storage: Storage,
        names: list[str],
        entries: list[int],
        bad: int,
        *,
        checkpoint_every: float,
    ) -> None:
        self.storage = storage
        self.names = names
        self.total = max(0, sum(entries) - bad)
        self.bad = bad
        self.every = 0.0 if storage.local is not None else checkpoint_every
        self.counts: dict[str, dict[str, int]] = {}
        self.read_at: dict[str, float] = {}
        self.final: set[str] = set()
        self.first: tuple[float, int] | None = None

    def read(self, running: set[str] | None, ended: set[str], elapsed: float) -> ShardedProgress:
        """Reads the shards due (``running``: those on a worker now, None if unknown; ``ended``:
        those that ended in this run) and returns the run's progress."""
        now = time.monotonic()
        remote = self.storage.local is None
        with tempfile.TemporaryDirectory(prefix="imggw-") if remote else nullcontext() as tmp:
            for name in self.names:
                if not self._due(name, running, ended, now):
                    continue
                try:
                    found = self._shard(name, None if tmp is None else Path(tmp))
                except Exception as exc:  # a file being replaced, a store that failed a GET
                    log.debug("progress of shard %s not read now: %r", name, exc)
                    continue
                self.read_at[name] = now
                if found is not None:
                    self.counts[name] = found
                if name in ended:
                    self.final.add(name)
        return self._snapshot(len(ended), elapsed)

    def _due(self, name: str, running: set[str] | None, ended: set[str], now: float) -> bool:
        if name in self.final:
            return False
        last = self.read_at.get(name)
        if last is None or name in ended:  # its state before it runs; its last state
            return True
        if running is not None and name not in running:  # waiting: nothing changes
            return False
        return now - last >= self.every

    def _shard(self, name: str, tmp: Path | None) -> dict[str, int] | None:
        rel = f"{SHARDS_DIR}/{name}/{LEDGER_NAME}"
        local = self.storage.local
        if local is not None:
            path = (local / rel).resolve()
            if not path.exists():
                return None
        else:
            assert tmp is not None
            path = tmp / f"{name}.sqlite"
            if not self.storage.get(rel, path):
                return None
        return count_statuses(path) or {}

    def _snapshot(self, ended: int, elapsed: float) -> ShardedProgress:
        seen = {"running": 0, "succeeded": 0, "failed": 0}
        for counts in self.counts.values():
            for state in seen:
                seen[state] += counts.get(state, 0)
        # Lines no ledger speaks of yet are pending, as in status().
        counts = {"pending": max(0, self.total - sum(seen.values())), **seen}
        finished = seen["succeeded"] + seen["failed"]
        if self.first is None:
            self.first = (elapsed, finished)
        took = elapsed - self.first[0]
        throughput = (finished - self.first[1]) / took if took > 0 else 0.0
        return ShardedProgress(
            total=self.total,
            counts=counts,
            bad=self.bad,
            shards=len(self.names),
            shards_ended=ended,
            elapsed=elapsed,
            throughput=max(0.0, throughput),
        )


def entries(source: str, count: int, total: int, *, format: str | None = None) -> list[int]:
    """Each shard's entries (lines neither blank nor comments; CSV records, each in the shard
    of its first line), counted as ``write_slices`` counts them. Blocking."""
    found = [0] * count
    starts = [shard_range(i, count, total).start for i in range(1, count + 1)]
    for number, (_, kind) in enumerate(line_kinds(source, format=format), 1):
        if kind == ENTRY:
            found[bisect_right(starts, number) - 1] += 1
    return found


async def _running(dask: DaskClient, run_id: str) -> set[str] | None:
    """The run's shards the scheduler has on a worker now, or None if it cannot tell."""
    pattern = re.compile(re.escape(SHARD_KEY) + r"(\d{4,}-of-\d{4,})-" + re.escape(run_id[:8]))
    try:
        processing = await dask.processing()  # type: ignore[no-untyped-call]
    except Exception as exc:  # a scheduler busy or gone: every shard is read instead
        log.debug("running shards not known now: %r", exc)
        return None
    return {
        match[1]
        for keys in processing.values()
        for key in keys
        if isinstance(key, str) and (match := pattern.match(key))
    }


async def watch(
    dask: DaskClient,
    reader: ProgressReader,
    ended_shards: Callable[[], set[str]],
    run_id: str,
    began: float,
    every: float,
    on_progress: Callable[[ShardedProgress], None],
) -> None:
    """Reads the run's progress every ``every`` seconds, off the event loop, until cancelled
    (``ended_shards`` names the shards that ended so far); the next reading starts ``every``
    seconds after the last one ended, so a slow store slows the readings, never the run."""
    while True:
        running = await _running(dask, run_id)
        ended = ended_shards()
        elapsed = time.monotonic() - began
        try:
            # Abandoned, not awaited, when the run ends: a stalled read cannot hold it up.
            progress = await anyio.to_thread.run_sync(
                reader.read, running, ended, elapsed, abandon_on_cancel=True
            )
        except Exception as exc:
            log.debug("progress not read now: %r", exc)
        else:
            on_progress(progress)
        await anyio.sleep(every)
