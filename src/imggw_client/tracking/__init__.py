"""Every paid task on disk, from before its request leaves until its results are saved
(DESIGN 19): the :class:`Journal` (one SQLite file, shared by processes), its
:class:`JournalEntry` rows, and the :class:`Tracker` that collects what a journal holds.

A client writes a journal only when given one (``Client(journal=...)`` or ``IMGGW_JOURNAL``);
the ``imggw`` command keeps one by default.

Example::

    from imggw_client import Client
    from imggw_client.tracking import Journal

    with Client(journal="state/imggw.sqlite") as client:
        subs = client.unfinished()                    # what a killed process left
        for task in client.as_completed(subs):
            client.download(task, "out/")
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._files import StorageError
    from .._journal.journal import DamagedRow, Journal, JournalEntry, Scope
    from ._tracker import CollectReport, Tracker

__all__ = [
    "CollectReport",
    "DamagedRow",
    "Journal",
    "JournalEntry",
    "Scope",
    "StorageError",
    "Tracker",
]

# Loaded on first use (PEP 562): the journal's names without the tracker and the clients it
# imports, and none of them for `import imggw_client.tracking` alone.
_HOMES = {
    "StorageError": "imggw_client._files",
    "CollectReport": "imggw_client.tracking._tracker",
    "Tracker": "imggw_client.tracking._tracker",
    **dict.fromkeys(
        ["DamagedRow", "Journal", "JournalEntry", "Scope"], "imggw_client._journal.journal"
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(home)
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
