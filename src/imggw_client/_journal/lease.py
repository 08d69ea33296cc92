"""Which process works on a journal row (DESIGN 22): a lease, so that a sibling sharing the
journal (a recovery, ``imggw tasks collect``) does not take over a task a live process is
submitting or waiting on, querying and downloading it a second time.

A row's lease names its holder (host, pid and a token of the :class:`Leases` that took it) and
an expiry. A process holds the rows it submits and those it claims to recover; a daemon thread
renews its leases while it has rows that still need work, so a process that dies leaves them
within :data:`LEASE_SECONDS`, and at once to a process of the same host, which sees its pid
gone.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path

__all__ = ["LEASE_SECONDS", "Leases"]

LEASE_SECONDS = 15.0  # how long a lease lasts unless renewed
RENEW_EVERY = 5.0  # how often a live holder renews its leases
GIVE_UP_AFTER = 12  # rounds in a row the file could not be written: the renewer stops
HOST = socket.gethostname()


class Leases:
    """This process's leases on one journal file (see the module's docstring). ``open_states``
    are the states of rows that still need work: only those are renewed."""

    def __init__(self, path: Path, open_states: list[str]) -> None:
        self.path = path
        self._open = open_states
        self._lock = threading.Lock()
        self._pid = -1
        self._owner = ""
        self._claims = 0  # leases taken: a renewer that found none held looks again
        self._running = False
        self._stop = threading.Event()

    @property
    def owner(self) -> str:
        """This process's name on the rows it holds (a forked child gets its own)."""
        if self._pid != os.getpid():
            with self._lock:
                self._pid, self._running = os.getpid(), False
                self._owner = f"{self._pid}@{HOST}#{secrets.token_hex(8)}"
                self._stop = threading.Event()
        return self._owner

    def until(self, now: float) -> float:
        """The expiry of a lease taken or renewed at ``now``."""
        return now + LEASE_SECONDS

    def free(self, owner: object, until: object, now: float) -> bool:
        """Whether a row whose lease is (``owner``, ``until``) may be taken by this process:
        no lease, its own (any journal of this process), a lapsed one, or one of a process of
        this host that is gone."""
        if owner is None or owner == self.owner:
            return True
        if not isinstance(owner, str):
            return True  # not a lease this code wrote: nothing holds the row
        pid_text, _, rest = owner.partition("@")
        host = rest.rpartition("#")[0]
        pid = int(pid_text) if pid_text.isascii() and pid_text.isdigit() else None
        if pid is not None and not 0 < pid < 2**31:
            return True  # no process has it: not a lease this code wrote
        if host == HOST and pid == os.getpid():
            return True
        if not isinstance(until, (int, float)) or not math.isfinite(until) or until < now:
            return True
        if host == HOST and pid is not None:  # its process tells, whatever the clock did
            return not _alive(pid)
        return until > now + LEASE_SECONDS * 2  # no renewal sets one so far: not a lease

    def forked(self) -> None:
        """In a forked child: a lock another thread of the parent held stays held for good."""
        self._lock = threading.Lock()

    def taken(self) -> None:
        """This process took leases (a submit, a claim): they are renewed while it lives."""
        owner = self.owner
        with self._lock:
            self._claims += 1
            if self._running:
                return
            self._running = True
            stop = self._stop
        thread = threading.Thread(
            target=self._renew, args=(owner, stop), daemon=True, name="imggw-journal-leases"
        )
        thread.start()

    def stop(self) -> None:
        """No more renewals (the journal is closed): this process's leases lapse."""
        self._stop.set()

    def _renew(self, owner: str, stop: threading.Event) -> None:
        """The renewer: every RENEW_EVERY seconds, until none of its rows needs work, the
        journal closes, or the file is gone. A busy file skips a round (a lease outlives two
        missed ones)."""
        db: sqlite3.Connection | None = None
        marks = ",".join("?" * len(self._open))
        failures = 0
        try:
            while not stop.wait(RENEW_EVERY):
                with self._lock:
                    claims = self._claims
                try:
                    if db is None:  # the file as it is: never a new one made where it was
                        uri = f"{self.path.absolute().as_uri()}?mode=rw"
                        db = sqlite3.connect(uri, uri=True, timeout=1.0, isolation_level=None)
                    held = db.execute(
                        f"UPDATE tasks SET lease_until = ? WHERE lease_owner = ? AND state IN "
                        f"({marks})",
                        (self.until(time.time()), owner, *self._open),
                    ).rowcount
                    failures = 0
                except sqlite3.Error:
                    failures += 1
                    if failures < GIVE_UP_AFTER:
                        continue
                    held = 0  # gone or unreadable for good: its leases lapse
                with self._lock:
                    if held == 0 and claims == self._claims:
                        self._running = False
                        return
        finally:
            if db is not None:
                db.close()
            with self._lock:
                if stop is self._stop:
                    self._running = self._running and not stop.is_set()


def _alive(pid: int) -> bool:
    """Whether a process of this host has ``pid`` (a process of another user's counts)."""
    if sys.platform == "win32":  # signal 0 is not a probe there: the lease's expiry tells
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
