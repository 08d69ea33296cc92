"""The tracker's downloads: finished tasks queue for download slots, the soonest-expiring first
(:class:`DownloadQueue`), with the pace of recent downloads that tells which results are at risk
of expiring in the queue; result links as a store keeps them (:func:`kept_links`: one that
carries the API key is kept blanked, and its download asks the gateway for it again); and the
partial files a killed collect left (:func:`sweep_partial_files`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import re
import stat
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from .. import _telemetry
from .._async_client import AsyncClient

__all__ = ["DownloadQueue", "kept_links", "sweep_partial_files"]

# A download's partial file while it is written, as a collect names its results
# (`{task id}-{index}`, after `{surface}-` for the other surface's, then the download's hidden
# temporary name).
_PARTIAL = re.compile(r"\.(?:(?:alpha|beta)-)?[1-9][0-9]*-[0-9]+\.[0-9a-f]{8}\.part")
PARTIAL_AFTER = 600.0  # seconds unwritten after which a partial file is no live download's


def kept_links(client: AsyncClient, urls: Iterable[str]) -> list[str]:
    """Result links as a store keeps them: one that carries the API key (a gateway may sign
    links so) is kept blanked, for no file a store writes holds the key; its download asks the
    gateway for the link again.
    """
    return [client.redact_url(url) for url in urls]


@dataclass(order=True)
class _Queued:
    """A finished task waiting for a download slot: soonest expiry first, then (unknown
    expiry) in the order they finished."""

    expires: float
    seq: int
    item: Any = field(compare=False)
    done: anyio.Event = field(compare=False)
    context: object = field(compare=False, default=None)  # the line's span, for its download


class DownloadQueue:
    """Finished tasks waiting for a download slot, the soonest-expiring first, and the pace
    of recent downloads (what tells which results are at risk of expiring in the queue).
    """

    def __init__(self) -> None:
        self._heap: list[_Queued] = []
        self._ready = anyio.Semaphore(0)
        self._order = itertools.count()
        self.downloaded: deque[float] = deque(maxlen=64)  # when recent downloads ended

    def __len__(self) -> int:
        return len(self._heap)

    async def put(self, item: Any) -> None:
        """Queues the item (anything with an ``expires_at``: Unix seconds or None) for a
        download slot and waits for its turn to end."""
        queued = _Queued(
            item.expires_at or math.inf,
            next(self._order),
            item,
            anyio.Event(),
            _telemetry.current(),
        )
        heapq.heappush(self._heap, queued)
        self._ready.release()
        await queued.done.wait()

    async def serve(self, save: Callable[[Any], Awaitable[None]]) -> None:
        """One download slot: always the queued result whose links die first."""
        while True:
            await self._ready.acquire()
            item = heapq.heappop(self._heap)
            try:
                with _telemetry.resumed(item.context):
                    await save(item.item)
            finally:
                item.done.set()

    def expiries(self) -> list[float]:
        """The known link expiries of the queued results (Unix seconds), soonest first."""
        return sorted(q.expires for q in self._heap if math.isfinite(q.expires))

    def at_risk(self, expiries: list[float]) -> int:
        """Queued results whose links die before their turn at the recent download pace."""
        if not expiries or len(self.downloaded) < 2:
            return 0
        span = self.downloaded[-1] - self.downloaded[0]
        pace = (len(self.downloaded) - 1) / span if span > 0 else math.inf
        now = time.time()
        return sum(1 for turn, expires in enumerate(expiries) if now + turn / pace > expires)


def sweep_partial_files(folder: Path, quiet_for: float = PARTIAL_AFTER) -> int:
    """Removes the partial files of downloads a killed collect left in ``folder`` (those of a
    collect's naming, see :data:`_PARTIAL`, unwritten for ``quiet_for`` seconds: a live
    download, bounded by its timeout, writes sooner). Returns how many went. Blocking.
    """
    gone = 0
    try:
        names = os.listdir(folder)
    except OSError:  # no folder yet (made by the first download), or not ours to read
        return 0
    before = time.time() - quiet_for
    for name in names:
        if not _PARTIAL.fullmatch(name):
            continue
        path = folder / name
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours: left alone
            found = os.lstat(path)
            if stat.S_ISREG(found.st_mode) and found.st_mtime < before:
                path.unlink()
                gone += 1
    return gone
