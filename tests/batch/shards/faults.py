"""A shard that raises, injected from the test: a Dask worker plugin that wraps the shard runner
in each worker process, so that production code carries no fault switch. Its own module, light
to import, since every worker imports it to unpickle the plugin."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from imggw_client.batch.scale import _shards


class ShardRaises(WorkerPlugin):
    """One try of shard ``index`` raises, from each progress report once ``after`` of its lines
    finished, wherever it runs: the first try to reach that point creates ``marker``, every later
    try (on any worker, a restarted one included) runs clean. ``marker`` existing proves the
    fault fired."""

    def __init__(self, index: int, after: int, marker: Path) -> None:
        self.index, self.after, self.marker = index, after, str(marker)

    def setup(self, worker: Any) -> None:
        """Wraps ``arun_shard`` in this worker process (the shard task imports it per call)."""
        original = self.original = _shards.arun_shard
        index, after, marker = self.index, self.after, self.marker

        async def arun_shard(spec: Any, **kwargs: Any) -> Any:
            if spec.index != index:
                return await original(spec, **kwargs)

            this_try: list[bool] = []  # the try that claimed the fault keeps raising

            def fault(progress: Any) -> None:
                if progress.finished_this_run >= after and (this_try or _claim(marker)):
                    this_try.append(True)
                    raise RuntimeError(f"injected fault in shard {spec.name}")

            return await original(spec, **{**kwargs, "on_progress": fault})

        _shards.arun_shard = arun_shard

    def teardown(self, worker: Any) -> None:
        """Gives the worker its shard runner back, for the session's later tests."""
        _shards.arun_shard = self.original


def _claim(marker: str) -> bool:
    """True for the one caller, in any process, that creates ``marker``."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
