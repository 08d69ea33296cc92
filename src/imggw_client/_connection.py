"""The HTTP client behind a client and its ``with_options`` copies: whose it is (the caller's or
the client's), which process's (``fork()``), which event loop's, and how it is closed (by the
client, by the end of its loop's run, or when dropped)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import httpx

from ._core.exceptions import ConfigurationError

H = TypeVar("H", httpx.Client, httpx.AsyncClient)


# HTTP clients a forked process inherited from its parent: their sockets are the parent's too.
# Kept, never closed (closing could send a TLS close_notify or an HTTP/2 GOAWAY on the parent's
# connections) and never used; one per client and fork, gone when the process ends.
_INHERITED: list[object] = []


class Guard(Protocol):
    """What closes the HTTP client made for one event loop, on that loop, when it ends (the
    asynchronous driver's)."""

    async def close(self) -> None:
        """Closes it now, on its loop (the running one)."""

    def close_soon(self) -> None:
        """Closes it on its loop, running in another thread, without waiting."""

    def dropped(self) -> None:
        """Its connection was let go: closed on its loop by the loop, or, a loop that is
        closed, by nothing (never an error at that loop's expense)."""


class Connection(Generic[H]):
    """The HTTP client behind a client and all its ``with_options`` copies. ``factory`` makes a
    fresh one (None for a caller's own client, or one over a transport that pools connections:
    neither can be replaced).

    Connections belong to the process that opened them: after a ``fork()`` the child holds the
    parent's very sockets, and two processes writing requests on one keep-alive connection read
    each other's answers (one task id handed to two submits: a paid task no one owns). So
    before each request the process is checked (a PID check, not an at-fork hook: it holds
    for a fork made in C too, and keeps no registry of clients): in a child our own HTTP client
    is set aside unclosed (the parent's to use and close) and a new one made; a caller's own
    one, or a pooled transport's, that this client sent requests through before the fork is
    refused. One that sent nothing before the fork holds no connection of ours: kept.

    An ``AsyncClient``'s connections belong to the event loop that opened them, so each loop
    that uses the client (one ``asyncio.run`` after another, threads each with a loop of their
    own) gets an HTTP client of its own (``bound``, when ``per_loop``), made by ``factory``; the
    driver closes it on that loop when the loop ends (``keep``), since after that nothing can.
    Over a caller's transport (not ``per_loop``), the HTTP client is made anew on a new loop
    and the one before let go: the transport, closed once by ``close``, holds the
    connections."""

    def __init__(
        self, http: H, *, owned: bool, factory: Callable[[], H] | None, per_loop: bool = False
    ) -> None:
        self.http: H = http  # the one made (or given) last: the client's, while it has one loop
        self.owned = owned
        self.factory: Callable[[], H] | None = factory
        # Each of its HTTP clients pools connections of its own: one per event loop (else
        # the caller's transport holds them, and one closed would close it for every loop).
        self.per_loop = per_loop
        self.loop: object = None  # the event loop ``http``'s connections belong to
        self.bound: dict[object, H] = {}  # event loop -> the HTTP client made for it
        self.guards: dict[object, Guard] = {}  # event loop -> what closes its HTTP client
        self.shut = False  # closed by the client that owns it
        self.pid = os.getpid()  # the process whose connections ``http`` holds
        self.used = False  # whether a request went through ``http`` in that process
        self._fork_lock = threading.Lock()
        self._lock = threading.Lock()  # threads, each with an event loop, claim at once

    @property
    def mine(self) -> bool:
        """Whether ``http`` is this process's (False in a child forked after it was made,
        until the child makes its own)."""
        return self.pid == os.getpid()

    @property
    def closed(self) -> bool:
        """Closed by its owner (or, a caller's own HTTP client, by the caller)."""
        return self.shut or (not self.owned and self.http.is_closed)

    def claim(self, loop: object) -> tuple[H, bool]:
        """Called before every request: the HTTP client for ``loop``, and whether it was made
        for it now (the driver then arranges its close at the loop's end). In a process
        forked since ``http`` was made, the connections are the parent's: see the class.
        Then, connections belong to the event loop that opened them; one used from another
        loop fails after the request was written (a task billed, the answer lost). So a loop
        gets an HTTP client of its own before anything is sent, and one that cannot be made
        is refused. Threads have no loop (``None``): nothing to do."""
        if self.pid != os.getpid():  # not self.mine: asked before every request
            self._forked()
        self.used = True
        if loop is None:
            return self.http, False
        factory = self.factory
        if factory is None or not self.per_loop:
            if self.loop is None or self.loop is loop:
                self.loop = loop
                return self.http, False
            if factory is None:
                raise ConfigurationError(
                    "this AsyncClient's connections were opened under another event loop (its "
                    "http_client's, or its transport's pool); make the client (and its "
                    "http_client or transport) inside the event loop that uses it"
                )
            # Over the caller's transport, which holds what connections there are.
            self.http, self.loop = factory(), loop
            return self.http, False
        http = self.bound.get(loop)  # the usual case, without the lock
        if http is not None:
            return http, False
        with self._lock:
            unused = self.loop is None and not self.http.is_closed  # made with the client
            http = self.http if unused else factory()
            self.http, self.loop = http, loop
            self.bound[loop] = http
            # Loops closed without ending their runs (loop.close() alone): their connections
            # can be closed by nothing now; their HTTP clients are let go.
            stale = [
                guard
                for old, guard in self.guards.items()
                if isinstance(old, asyncio.AbstractEventLoop) and old.is_closed()
            ]
        for guard in stale:
            guard.dropped()
        return http, True

    def keep(self, loop: object, guard: Guard) -> None:
        """Holds what closes ``loop``'s HTTP client when that loop ends (the driver's)."""
        with self._lock:
            self.guards[loop] = guard

    def ended(self, loop: object, http: object) -> None:
        """``loop`` ended (or the client was closed), and ``http``, its HTTP client, with it."""
        with self._lock:
            if self.bound.get(loop) is http:
                del self.bound[loop]
                self.guards.pop(loop, None)
            if self.loop is loop:
                self.loop = None  # ``http`` is closed: the next loop makes one anew

    def _forked(self) -> None:
        with self._fork_lock:  # the child's threads may all send their first request at once
            if self.mine:
                return
            if not self.used:  # no request went through it: it holds no connection of ours
                self.pid = os.getpid()
                return
            if self.factory is None:
                raise ConfigurationError(
                    "this client sent requests through its http_client (or its "
                    f"transport's pool) in process {self.pid}, and this process was forked "
                    "from it: those connections are shared with it, and requests from both "
                    "would mix on one socket. Make the client and its http_client in this "
                    "process (after the fork: a pool initializer, gunicorn's post_fork), or "
                    "let the client make its own (no http_client=): it makes a new one in "
                    "each process by itself"
                )
            # The parent's HTTP clients, and what would close them at its loops' ends (each
            # closes nothing outside the process that made it): kept, never used.
            _INHERITED.extend([self.http, *self.bound.values(), *self.guards.values()])
            self._lock = threading.Lock()  # a thread of the parent may have held it
            self.bound, self.guards = {}, {}
            self.http, self.loop = self.factory(), None
            self.pid, self.used = os.getpid(), False

    def __del__(self) -> None:
        # The client (and every with_options copy of it) was dropped unclosed: the HTTP client
        # it made is closed here, so that no socket is left to the garbage collector
        # (a ResourceWarning under -X dev). Never a caller's own, nor a parent process's. One
        # made for an event loop is closed on that loop by its guard, dropped with this.
        if not getattr(self, "owned", False) or not self.mine:
            return
        with contextlib.suppress(Exception):  # at interpreter exit, say: nothing left to do
            for guard in list(self.guards.values()):
                guard.dropped()
            if self.http not in self.bound.values():
                _close_dropped(self.http, self.loop)


# An AsyncClient's pool closed by the garbage collector: kept until the close has run.
_CLOSING: set[asyncio.Task[None]] = set()


def _close_dropped(http: httpx.Client | httpx.AsyncClient, loop: object) -> None:
    """Closes a dropped client's HTTP client. A blocking one at once; an asynchronous one on
    the asyncio loop its connections belong to, while that loop runs (as openai-python does):
    under a loop that has ended, nothing can close them any more."""
    if http.is_closed:
        return
    if isinstance(http, httpx.Client):
        http.close()
        return
    if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_closed():
        return

    def start() -> None:
        task = loop.create_task(http.aclose())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        start()
    elif loop.is_running():  # collected in another thread
        loop.call_soon_threadsafe(start)
