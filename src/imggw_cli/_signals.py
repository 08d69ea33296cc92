"""SIGTERM and SIGHUP end a command as Ctrl-C does (DESIGN 18): systemd, Kubernetes and
``timeout`` stop a process with SIGTERM, a closed terminal or a dropped ssh session sends SIGHUP,
and either deserves what Ctrl-C gets: the resume hint, the ``interrupted`` event, a batch's
manifest written; the exit code says which signal it was (128 + its number: 143, 129; 130 for
Ctrl-C).

Nothing here decides how a command stops: the signal is handed to whatever handles SIGINT at
that moment. That is Python's own handler (``KeyboardInterrupt``) in a blocking command, and
the event loop's in a batch (it cancels the run's main task, so the run winds down and writes
its manifest as on Ctrl-C, then raises ``KeyboardInterrupt``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

HANDLED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

_received: list[int] = []  # the signal that interrupted the command being run, once one did
_depth = [0]  # commands inside commands (download of several ids) install the handlers once


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    if not _received:
        _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
        return
    # Ctrl-C ignored (a job started in the background by a shell): stop as Python's handler would.
    raise KeyboardInterrupt


@contextmanager
def as_ctrl_c() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP are handled as SIGINT is (unless the process was
    started ignoring one, as ``nohup`` does SIGHUP); the handlers found are put back after it.
    Only the main thread may set handlers: elsewhere (a command run from
    another thread by a program embedding the CLI) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth[0]:
        _depth[0] += 1
        try:
            yield
        finally:
            _depth[0] -= 1
        return
    _received.clear()
    kept: dict[int, Any] = {}
    try:
        for number in HANDLED:
            if signal.getsignal(number) is signal.SIG_IGN:
                continue  # ignored on purpose (nohup ignores SIGHUP): it stays ignored
            kept[number] = signal.signal(number, _as_ctrl_c)
        _depth[0] = 1
        yield
    finally:
        _depth[0] = 0
        for number, handler in kept.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)


def interruption() -> tuple[int, str]:
    """The number and name of the signal that interrupted the command: SIGTERM or SIGHUP if one
    of them came first, else SIGINT (Ctrl-C)."""
    number = _received[0] if _received else int(signal.SIGINT)
    return number, signal.Signals(number).name
