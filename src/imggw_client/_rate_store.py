"""Request budgets shared through a Redis store (DESIGN 16): the drivers that run the core's
scripts (``_core.shared_budget``) for an ``AsyncClient`` and a ``Client``; redis-py is the
``imggw[redis]`` extra. The store is an aid, never a gate: any failure of it sends the request
on under an in-process budget at the same rates, warned once each way, and every call to it is
bounded by ``STORE_TIMEOUT`` or the request's own timeout.

The operations are written once, as coroutines (:class:`_Driver`); the blocking driver's I/O
never suspends, so it runs each to its end with one ``send`` (:func:`_blocking`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import math
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Hashable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

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
T = TypeVar("T")

INSTALL = "pip install 'imggw[redis]'"
REJOIN_AFTER = 5.0  # seconds between tries of a store that failed; requests go on meanwhile
KINDS = (SUBMIT, QUERY)
# The longest one question waits for a place in a full window before the flow has it back (to
# keep its deadline); meanwhile it sleeps until one of this process's requests of the kind ends.
HOLD = 1.0


def require_redis() -> None:
    """Raises ConfigurationError, before anything is sent, when redis-py is missing."""
    if importlib.util.find_spec("redis") is None:
        raise ConfigurationError(
            f"RateLimit.store needs the redis library: {INSTALL}", code="missing_extra"
        )


def _ticket(ticket: Hashable) -> StoreTicket:
    assert isinstance(ticket, StoreTicket)  # a driver's own ticket, handed back by the flows
    return ticket


def _new(kind: str) -> StoreTicket:
    return StoreTicket(kind, token=secrets.token_hex(8))


def _blocking(operation: Coroutine[Any, Any, T]) -> T:
    """Runs an operation of the blocking driver (whose I/O never suspends) to its end."""
    try:
        operation.send(None)
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]
    operation.close()
    raise AssertionError("the blocking driver's I/O suspended")


class _Driver:
    """The operations, written once; a driver supplies ``_call``, ``_sleep`` and renewals."""

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
        # Questions asleep until a place in the window frees, oldest first (each a call that
        # wakes it, False if it woke already); one of them (the poller) also asks again every
        # two round trips, for places other processes free.
        self._sleepers: dict[str, deque[Callable[[], bool]]] = {kind: deque() for kind in KINDS}
        self._poller: dict[str, StoreTicket | None] = dict.fromkeys(KINDS)
        self._owed: dict[str, list[float]] = {kind: [] for kind in KINDS}  # isolated 429s' hints
        # This process's own ceiling, whatever pace the lane keeps (a process with no ceiling may
        # have made it): one request of a kind asks the store at a time, an interval after the
        # last this process sent.
        self._asking: dict[str, StoreTicket | None] = dict.fromkeys(KINDS)
        self._last_sent = dict.fromkeys(KINDS, -math.inf)
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

    async def _call(self, kind: str, name: str, args: list[str]) -> object:
        """One call of the script ``name`` on the lane of ``kind``."""
        raise NotImplementedError

    async def _sleep(self, kind: str, seconds: float) -> None:
        """Sleeps until a place of ``kind`` frees here (:meth:`_wake`), or ``seconds`` pass."""
        raise NotImplementedError

    def _renew_soon(self) -> None:
        """Starts renewing the leases held, unless it runs already."""

    async def _run(self, kind: str, steps: Steps) -> Any:
        """Runs an operation's script calls on the store; a failure is thrown into it."""
        answer, failure = None, None
        try:
            while True:
                name, args = steps.throw(failure) if failure else steps.send(answer)
                try:
                    answer, failure = await self._call(kind, name, args), None
                except Exception as exc:
                    failure = exc
        except StopIteration as end:
            return end.value
        finally:
            steps.close()

    async def _quiet(self, kind: str, steps: Steps) -> Any:
        """A release, a finish or a renewal, whose failure is only noted: a lost one costs an
        interval once, or an answer the other processes meet themselves."""
        try:
            return await self._run(kind, steps)
        except Exception as exc:
            self._failed(exc)
            return None

    async def _wait(self, ticket: StoreTicket) -> float:
        """The seconds ``ticket`` still waits; a full window is waited here (up to ``HOLD``),
        asleep until an answer frees a place: never polled."""
        wait = await self._asked(ticket)
        until, kind = time.monotonic() + HOLD, ticket.kind
        try:
            while wait > 0 and ticket.full and (left := until - time.monotonic()) > 0:
                with self._lock:
                    polls = self._poller[kind] in (None, ticket)
                    if polls:
                        self._poller[kind] = ticket
                await self._sleep(kind, min(wait, left) if polls else left)
                wait = await self._asked(ticket)
        finally:
            with self._lock:
                handed = self._poller[kind] is ticket
                if handed:
                    self._poller[kind] = None
            if handed:  # the next in line asks now, and polls in its turn
                self._wake(kind)
        return wait

    async def _asked(self, ticket: StoreTicket) -> float:
        """The seconds ``ticket`` still waits, asked once."""
        kind, now = ticket.kind, time.monotonic()
        ticket.full = False
        with self._lock:
            if ticket.epoch == EPOCH_NONE and ticket.not_before == 0.0 and self._owed[kind]:
                ticket.not_before = self._owed[kind].pop(0)  # its retry waits a 429's hint
        if ticket.not_before > now:
            return ticket.not_before - now
        if ticket.local is None and self._use_store(now):
            spaced = self._spaced(ticket, now)
            if spaced:
                return spaced
            try:
                wait: float = await self._run(kind, shared.take_steps(self.limit, ticket))
            except Exception as exc:
                self._unhold(ticket)  # no longer asking: the next of this process may
                if self._failed(exc):  # going alone from now: one interval first, as below
                    self._quiet_until[kind] = time.monotonic() + shared.interval(self.limit, kind)
            else:
                if wait == 0:
                    self._went(ticket, now)
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

    async def _release(self, ticket: StoreTicket) -> None:
        """Gives back the place of ``ticket``."""
        self._unhold(ticket)
        if ticket.local is not None:
            self.local.release(ticket.local)
        elif ticket.epoch != EPOCH_NONE:
            args = [str(ticket.epoch), repr(ticket.slot), ticket.token]
            await self._quiet(ticket.kind, shared.one("release", args))
            self._wake(ticket.kind)

    async def _finish(self, ticket: StoreTicket, ended: Ended) -> None:
        """Tells how the request of ``ticket`` ended."""
        self._unhold(ticket)
        if ticket.local is not None:
            self.local.finished(ticket.local, time.monotonic(), **ended)
            return
        steps = shared.finished_steps(self.limit, ticket, **ended)
        owed = await self._quiet(ticket.kind, steps)
        self._wake(ticket.kind)  # its place in the window is free: the longest waiter asks
        if owed:  # an isolated 429's hint, for its retry
            with self._lock:
                self._owed[ticket.kind].append(time.monotonic() + min(owed, MAX_PAUSE))

    async def _renew(self) -> bool:
        """Renews the leases held now; False if none are."""
        with self._lock:
            held = [(kind, [repr(shared.LEASE), *tokens]) for kind, tokens in self.held.items()]
        for kind, args in held:
            if len(args) > 1:
                await self._quiet(kind, shared.one("renew", args))
        return any(len(args) > 1 for _, args in held)

    def _wake(self, kind: str) -> None:
        """Wakes the oldest question asleep for a place of ``kind``."""
        with self._lock:
            sleepers = self._sleepers[kind]
            while sleepers and not sleepers.popleft()():
                pass

    @contextlib.contextmanager
    def _asleep(self, kind: str, wake: Callable[[], bool]) -> Iterator[None]:
        """Keeps ``wake`` in line for a place of ``kind`` while the body sleeps."""
        with self._lock:
            self._sleepers[kind].append(wake)
        try:
            yield
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._sleepers[kind].remove(wake)

    def _unhold(self, ticket: StoreTicket) -> None:
        with self._lock:
            self.held[ticket.kind].discard(ticket.token)
            asking = self._asking[ticket.kind] is ticket
            if asking:
                self._asking[ticket.kind] = None
        if asking:
            self._wake(ticket.kind)

    def _spaced(self, ticket: StoreTicket, now: float) -> float:
        """0 if this process's ceiling lets ``ticket`` ask the store now (it asks alone until
        it goes or gives up its place), else the seconds to wait (asleep, if another asks)."""
        gap = shared.interval(self.limit, ticket.kind)
        if not gap:
            return 0.0
        with self._lock:
            asking = self._asking[ticket.kind]
            if asking is not None and asking is not ticket:
                ticket.full = True  # woken when that one goes
                return gap
            wait = self._last_sent[ticket.kind] + gap - now
            if wait > 0:
                return wait
            self._asking[ticket.kind] = ticket
            return 0.0

    def _went(self, ticket: StoreTicket, asked: float) -> None:
        """The store, asked at ``asked``, let ``ticket`` go: this process's next request asks
        an interval after (the store's round trip is in both)."""
        with self._lock:
            self._last_sent[ticket.kind] = asked
            asking = self._asking[ticket.kind] is ticket
            if asking:
                self._asking[ticket.kind] = None
        if asking:
            self._wake(ticket.kind)

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


def _settle(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


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

    async def _call(self, kind: str, name: str, args: list[str]) -> object:
        import redis.asyncio
        from redis.asyncio.retry import Retry

        loop = asyncio.get_running_loop()  # under trio this raises: the in-process budget paces
        made = self._stores.get(loop)
        if made is None:
            store = redis.asyncio.Redis.from_url(self.url, **self.options(Retry))
            scripts = {name: store.register_script(body) for name, body in shared.SCRIPTS.items()}
            made = self._stores[loop] = (store, scripts)
        # The socket timeouts bound each read; this bounds the whole call.
        return await asyncio.wait_for(made[1][name](keys=self.keys[kind], args=args), self.timeout)

    async def _sleep(self, kind: str, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake() -> bool:  # from any thread: the future's loop sets it
            if woken.done() or loop.is_closed():
                return False
            loop.call_soon_threadsafe(_settle, woken)
            return True

        # asyncio.wait times out without cancelling this task (wait_for would, from 3.12),
        # which anyio's cancel scopes around a request must not see.
        with self._asleep(kind, wake):
            try:
                await asyncio.wait([woken], timeout=seconds)
            finally:
                woken.cancel()

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = _new(kind)
        return ticket, await self._wait(ticket)

    async def wait_time(self, ticket: Hashable) -> float:
        return await self._wait(_ticket(ticket))

    async def release(self, ticket: Hashable) -> None:
        await self._release(_ticket(ticket))

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        await self._finish(_ticket(ticket), ended)

    def _renew_soon(self) -> None:
        loop = asyncio.get_running_loop()
        task = self._renewing.get(loop)
        if task is None or task.done():
            self._renewing[loop] = loop.create_task(self._renewal())

    async def _renewal(self) -> None:
        """Renews the leases held every third of ``LEASE``, while any are held."""
        while True:
            await asyncio.sleep(shared.LEASE / 3)
            if not await self._renew():
                return

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

    async def _call(self, kind: str, name: str, args: list[str]) -> object:
        return self._scripts[name](keys=self.keys[kind], args=args)

    async def _sleep(self, kind: str, seconds: float) -> None:
        woken = threading.Event()

        def wake() -> bool:
            if woken.is_set():
                return False
            woken.set()
            return True

        with self._asleep(kind, wake):
            woken.wait(seconds)

    def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = _new(kind)
        return ticket, _blocking(self._wait(ticket))

    def wait_time(self, ticket: Hashable) -> float:
        return _blocking(self._wait(_ticket(ticket)))

    def release(self, ticket: Hashable) -> None:
        _blocking(self._release(_ticket(ticket)))

    def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        _blocking(self._finish(_ticket(ticket), ended))

    def _renew_soon(self) -> None:
        with self._lock:
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(
                    target=self._renewal, name="imggw-lease", daemon=True
                )
                self._renewer.start()

    def _renewal(self) -> None:
        """Renews the leases held every third of ``LEASE``, while any are held."""
        while not self._closed.wait(shared.LEASE / 3) and _blocking(self._renew()):
            pass

    def close(self) -> None:
        """Closes the store's connections."""
        self._closed.set()
        self._store.close()
