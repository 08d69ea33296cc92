"""Request budgets shared through a Redis store (DESIGN 16): the drivers that run the core's
scripts (``_core.shared_budget``) for an ``AsyncClient`` and a ``Client``; redis-py is the
``imggw[redis]`` extra. The store is an aid, never a gate: any failure of it sends the request
on under an in-process budget at the same rates, warned once each way, and every call to it is
bounded by ``STORE_TIMEOUT`` or the request's own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ._base_client import key_fingerprint
from ._core import shared_budget as shared
from ._core.budget import MAX_PAUSE, QUERY, SUBMIT, Budget, Ended
from ._core.config import Settings, redact_store
from ._core.exceptions import ConfigurationError
from ._core.shared_budget import EPOCH_NONE, Steps, StoreAnswerError, StoreTicket

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["AsyncStoreBudget", "StoreBudget", "require_redis"]

log = logging.getLogger("imggw_client")

INSTALL = "pip install 'imggw[redis]'"
REJOIN_AFTER = 5.0  # seconds between tries of a store that failed; requests go on meanwhile
KINDS = (SUBMIT, QUERY)
# The longest one question waits for a place in a full window before the flow has it back (to
# keep its deadline); meanwhile it sleeps until one of this process's requests of the kind ends.
HOLD = 1.0
HOLDING = "hold"  # the step that sleeps (its argument: the longest, in seconds), not a script


def require_redis() -> None:
    """Raises ConfigurationError, before anything is sent, when redis-py is missing."""
    if importlib.util.find_spec("redis") is None:
        raise ConfigurationError(
            f"RateLimit.store needs the redis library: {INSTALL}", code="missing_extra"
        )


def _settle(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


def _ticket(ticket: Hashable) -> StoreTicket:
    assert isinstance(ticket, StoreTicket)  # a driver's own ticket, handed back by the flows
    return ticket


class _Driver:
    """What both drivers share, and the operations, written once."""

    def __init__(self, settings: Settings) -> None:
        require_redis()
        self.limit = limit = settings.rate_limit
        assert limit.store is not None
        self.url, self.label = limit.store, redact_store(limit.store)
        self.local = Budget(limit)  # while the store is away
        # The slow fingerprint, worked out once per client (its copies share this budget).
        fingerprint = key_fingerprint(settings.api_key)
        lanes = {kind: shared.lane_key(fingerprint, settings.base_url, kind) for kind in KINDS}
        self.keys = {kind: [lane, shared.flying_key(lane)] for kind, lane in lanes.items()}
        self.timeout = min(settings.timeout, shared.STORE_TIMEOUT)
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._quiet_until = dict.fromkeys(KINDS, 0.0)  # no request before this, after a switch
        self.held: dict[str, set[str]] = {kind: set() for kind in KINDS}  # leases to renew
        # Questions asleep until a place in the window frees, oldest first; one of them (the
        # poller) also asks again every two round trips, for places other processes free.
        self._sleepers: dict[str, deque[Any]] = {kind: deque() for kind in KINDS}
        self._poller: dict[str, StoreTicket | None] = dict.fromkeys(KINDS)
        self._owed: dict[str, list[float]] = {kind: [] for kind in KINDS}  # isolated 429s' hints
        self._lock = threading.Lock()

    def options(self, retry: type[Any]) -> dict[str, Any]:
        """redis-py's settings, with its client's retry class: one try per call."""
        from redis.backoff import NoBackoff

        return {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "retry": retry(NoBackoff(), 0),
            "health_check_interval": 0,
        }

    def _renew_soon(self) -> None:
        """Starts renewing the leases held, unless it runs already."""

    def waited(self, ticket: StoreTicket) -> Steps:
        """The seconds ``ticket`` still waits; a full window is waited here (up to ``HOLD``),
        asleep until an answer frees a place: never polled."""
        wait = yield from self._asked(ticket)
        until = time.monotonic() + HOLD
        try:
            while wait > 0 and ticket.full and (left := until - time.monotonic()) > 0:
                with self._lock:
                    if self._poller[ticket.kind] is None:
                        self._poller[ticket.kind] = ticket
                    polls = self._poller[ticket.kind] is ticket
                yield HOLDING, [repr(min(wait, left) if polls else left)]
                wait = yield from self._asked(ticket)
        finally:
            with self._lock:
                handed = self._poller[ticket.kind] is ticket
                if handed:
                    self._poller[ticket.kind] = None
            if handed:  # the next in line asks now, and polls in its turn
                self._wake(ticket.kind)
        return wait

    def _asked(self, ticket: StoreTicket) -> Steps:
        """The seconds ``ticket`` still waits, asked once."""
        kind, now = ticket.kind, time.monotonic()
        ticket.full = False
        with self._lock:
            if ticket.epoch == EPOCH_NONE and ticket.not_before == 0.0 and self._owed[kind]:
                ticket.not_before = self._owed[kind].pop(0)  # its retry waits a 429's hint
        if ticket.not_before > now:
            return ticket.not_before - now
        if ticket.local is None and self._use_store(now):
            try:
                wait = yield from shared.take_steps(self.limit, ticket)
            except Exception as exc:
                if self._failed(exc):  # going alone from now: one interval first, as below
                    self._quiet_until[kind] = time.monotonic() + shared.interval(self.limit, kind)
            else:
                if wait == 0 and ticket.token:
                    with self._lock:
                        self.held[kind].add(ticket.token)
                    self._renew_soon()
                # Back from going alone, the store never heard of this process's last request:
                # one interval first (the store counted this one as sent: asked again, it goes).
                return shared.interval(self.limit, kind) if self._answered() and not wait else wait
        now = time.monotonic()
        if ticket.local is None:
            ticket.local = self.local.reserve(kind, now)
        return max(self.local.wait_time(ticket.local, now), self._quiet_until[kind] - now)

    def released(self, ticket: StoreTicket) -> Steps:
        """Gives back the place of ``ticket``."""
        self._unhold(ticket)
        if ticket.local is not None:
            self.local.release(ticket.local)
        elif ticket.epoch != EPOCH_NONE:
            args = [str(ticket.epoch), repr(ticket.slot), ticket.token]
            yield from self._quiet(shared.one("release", args))
            self._wake(ticket.kind)

    def ended(self, ticket: StoreTicket, ended: Ended) -> Steps:
        """Tells how the request of ``ticket`` ended."""
        self._unhold(ticket)
        if ticket.local is not None:
            self.local.finished(ticket.local, time.monotonic(), **ended)
            return
        owed = yield from self._quiet(shared.finished_steps(self.limit, ticket, **ended))
        self._wake(ticket.kind)  # its place in the window is free: the longest waiter asks
        if owed:  # an isolated 429's hint, for its retry
            with self._lock:
                self._owed[ticket.kind].append(time.monotonic() + min(owed, MAX_PAUSE))

    def _wake(self, kind: str) -> None:
        """Wakes the oldest question asleep for a place of ``kind`` (a sleeper: a call that
        wakes it, False if it woke already)."""
        with self._lock:
            sleepers = self._sleepers[kind]
            while sleepers and not sleepers.popleft()():
                pass

    def asleep(self, kind: str, sleeper: Callable[[], bool]) -> None:
        """Notes ``sleeper`` in line for a place of ``kind``."""
        with self._lock:
            self._sleepers[kind].append(sleeper)

    def awake(self, kind: str, sleeper: Callable[[], bool]) -> None:
        """Takes ``sleeper`` out of the line (woken, or its time came)."""
        with self._lock, contextlib.suppress(ValueError):
            self._sleepers[kind].remove(sleeper)

    def renewals(self) -> list[tuple[str, Steps]]:
        """The renew script's calls for the leases held now, by kind."""
        with self._lock:
            held = [(kind, [repr(shared.LEASE), *tokens]) for kind, tokens in self.held.items()]
        return [(k, self._quiet(shared.one("renew", args))) for k, args in held if len(args) > 1]

    def _quiet(self, steps: Steps) -> Steps:
        """A release, a finish or a renewal, whose failure is only noted: a lost one costs an
        interval once, or an answer the other processes meet themselves."""
        try:
            return (yield from steps)
        except Exception as exc:
            self._failed(exc)
            return None

    def _unhold(self, ticket: StoreTicket) -> None:
        with self._lock:
            self.held[ticket.kind].discard(ticket.token)

    def _use_store(self, now: float) -> bool:
        """Whether to ask the store now: it answered last time, or its retry is due."""
        with self._lock:
            if self._down_since is None:
                return True
            if now >= self._retry_at:
                self._retry_at = now + REJOIN_AFTER  # one caller tries; the others go on
                return True
            return False

    def _failed(self, exc: BaseException) -> bool:
        """Notes a failure of the store; True (and a warning) if it was answering until now."""
        with self._lock:
            now = time.monotonic()
            self._retry_at = now + REJOIN_AFTER
            if self._down_since is not None:
                return False
            self._down_since = now
        # Its class, never its text (which may quote the URL and its password).
        why = str(exc) if isinstance(exc, StoreAnswerError) else type(exc).__name__
        log.warning(
            f"rate store {self.label} not usable ({why}): this process paces its requests alone "
            f"at the configured rates, and tries the store again every {REJOIN_AFTER:g} s"
        )
        return True

    def _answered(self) -> bool:
        """Notes an answer of the store; True (and a note) if it was away until now."""
        with self._lock:
            if self._down_since is None:
                return False
            away, self._down_since = time.monotonic() - self._down_since, None
        log.warning(f"rate store {self.label} answers again after {away:.0f} s: shared again")
        return True


class AsyncStoreBudget(_Driver):
    """The shared budget as an ``AsyncClient`` asks it: a redis-py client per event loop (it
    belongs to one), and a task renewing the leases while any are held."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._stores: weakref.WeakKeyDictionary[Any, tuple[Any, dict[str, Any]]] = (
            weakref.WeakKeyDictionary()
        )
        self._renewing: weakref.WeakKeyDictionary[Any, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    def _scripts(self) -> dict[str, Any]:
        import redis.asyncio
        from redis.asyncio.retry import Retry

        loop = asyncio.get_running_loop()  # under trio this raises: the in-process budget paces
        made = self._stores.get(loop)
        if made is None:
            store = redis.asyncio.Redis.from_url(self.url, **self.options(Retry))
            scripts = {name: store.register_script(body) for name, body in shared.SCRIPTS.items()}
            made = self._stores[loop] = (store, scripts)
        return made[1]

    async def _do(self, kind: str, steps: Steps) -> Any:
        """Runs an operation's script calls on the store; a failure is thrown into it."""
        answer, failure = None, None
        try:
            while True:
                name, args = steps.throw(failure) if failure else steps.send(answer)
                if name == HOLDING:
                    await self._hold(kind, float(args[0]))
                    answer, failure = None, None
                    continue
                try:
                    # The socket timeouts bound each read; this bounds the whole call.
                    call = self._scripts()[name](keys=self.keys[kind], args=args)
                    answer, failure = await asyncio.wait_for(call, self.timeout), None
                except Exception as exc:
                    failure = exc
        except StopIteration as end:
            return end.value
        finally:  # cut short (a cancel in a hold): its waiting line is left at once
            steps.close()

    async def _hold(self, kind: str, seconds: float) -> None:
        """Sleeps until a place of ``kind`` frees here, or ``seconds`` pass."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake() -> bool:  # from any thread: the future's loop sets it
            if woken.done() or loop.is_closed():
                return False
            loop.call_soon_threadsafe(_settle, woken)
            return True

        self.asleep(kind, wake)
        try:
            await asyncio.wait([woken], timeout=seconds)
        finally:
            self.awake(kind, wake)
            woken.cancel()

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = StoreTicket(kind, token=secrets.token_hex(8))
        return ticket, await self.wait_time(ticket)

    async def wait_time(self, ticket: Hashable) -> float:
        t = _ticket(ticket)
        return float(await self._do(t.kind, self.waited(t)))

    async def release(self, ticket: Hashable) -> None:
        t = _ticket(ticket)
        await self._do(t.kind, self.released(t))

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        t = _ticket(ticket)
        await self._do(t.kind, self.ended(t, ended))

    def _renew_soon(self) -> None:
        loop = asyncio.get_running_loop()
        task = self._renewing.get(loop)
        if task is None or task.done():
            self._renewing[loop] = loop.create_task(self._renew())

    async def _renew(self) -> None:
        """Renews the leases held every third of ``LEASE``, while any are held."""
        while True:
            await asyncio.sleep(shared.LEASE / 3)
            if not (calls := self.renewals()):
                return
            for kind, steps in calls:
                await self._do(kind, steps)

    async def close(self) -> None:
        """Closes the store's connections of the running event loop (the others' close with
        their loops)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = self._renewing.pop(loop, None)
        if task is not None:
            task.cancel()
        made = self._stores.pop(loop, None)
        if made is not None:
            await made[0].aclose()


class StoreBudget(_Driver):
    """The shared budget as a ``Client`` asks it: one connection pool, and a daemon thread
    renewing the leases while any are held."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        import redis
        from redis.retry import Retry

        self._store = redis.Redis.from_url(self.url, **self.options(Retry))
        self._scripts = {n: self._store.register_script(b) for n, b in shared.SCRIPTS.items()}
        self._renewer: threading.Thread | None = None
        self._closed = threading.Event()

    def _do(self, kind: str, steps: Steps) -> Any:
        """Runs an operation's script calls on the store; a failure is thrown into it."""
        answer, failure = None, None
        try:
            while True:
                name, args = steps.throw(failure) if failure else steps.send(answer)
                if name == HOLDING:
                    self._hold(kind, float(args[0]))
                    answer, failure = None, None
                    continue
                try:
                    answer, failure = self._scripts[name](keys=self.keys[kind], args=args), None
                except Exception as exc:
                    failure = exc
        except StopIteration as end:
            return end.value
        finally:  # cut short: its waiting line is left at once
            steps.close()

    def _hold(self, kind: str, seconds: float) -> None:
        """Sleeps until a place of ``kind`` frees here, or ``seconds`` pass."""
        woken = threading.Event()

        def wake() -> bool:
            if woken.is_set():
                return False
            woken.set()
            return True

        self.asleep(kind, wake)
        try:
            woken.wait(seconds)
        finally:
            self.awake(kind, wake)

    def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = StoreTicket(kind, token=secrets.token_hex(8))
        return ticket, self.wait_time(ticket)

    def wait_time(self, ticket: Hashable) -> float:
        t = _ticket(ticket)
        return float(self._do(t.kind, self.waited(t)))

    def release(self, ticket: Hashable) -> None:
        t = _ticket(ticket)
        self._do(t.kind, self.released(t))

    def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        t = _ticket(ticket)
        self._do(t.kind, self.ended(t, ended))

    def _renew_soon(self) -> None:
        with self._lock:
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(
                    target=self._renew, name="imggw-lease", daemon=True
                )
                self._renewer.start()

    def _renew(self) -> None:
        """Renews the leases held every third of ``LEASE``, while any are held."""
        while not self._closed.wait(shared.LEASE / 3) and (calls := self.renewals()):
            for kind, steps in calls:
                self._do(kind, steps)

    def close(self) -> None:
        """Closes the store's connections."""
        self._closed.set()
        self._store.close()
