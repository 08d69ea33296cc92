"""Request budgets shared through a Redis store (DESIGN 16): the drivers that run the core's
script (``_core.shared_budget``) for an ``AsyncClient`` (:class:`AsyncStoreBudget`, a
``BudgetService``) and a ``Client`` (:class:`StoreBudget`, a ``SyncBudgetService``).

Imported only when a ``RateLimit`` names a store; redis-py is the ``imggw[redis]`` extra. The
store is an aid, never a gate: any failure of it (unreachable, slow, killed, answering
garbage) sends the request on under the in-process budget (``Fallback``), and every call to
it is bounded by :data:`~imggw_client._core.shared_budget.STORE_TIMEOUT` or the request's own
timeout, whichever is shorter.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Generator, Hashable
from typing import TYPE_CHECKING, Any

from ._base_client import key_fingerprint
from ._core import budget as rules
from ._core import shared_budget as shared
from ._core.budget import QUERY, SUBMIT, Ended
from ._core.config import Settings, redact_store
from ._core.exceptions import ConfigurationError
from ._core.shared_budget import Fallback, StoreTicket

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["AsyncStoreBudget", "StoreBudget", "require_redis"]

log = logging.getLogger("imggw_client")

INSTALL = "pip install 'imggw[redis]'"


def require_redis() -> None:
    """Raises ConfigurationError, before anything is sent, when redis-py is missing."""
    if importlib.util.find_spec("redis") is None:
        raise ConfigurationError(
            f"RateLimit.store needs the redis library: {INSTALL}", code="missing_extra"
        )


Steps = Generator[tuple[str, list[str]], object, Any]


class _Shared:
    """What both drivers share: the lanes' names, the fallback, the requests this process
    holds in flight (whose leases it renews), and how redis-py is set up."""

    def __init__(self, settings: Settings) -> None:
        require_redis()
        limit = settings.rate_limit
        assert limit.store is not None
        self.url = limit.store
        self.limit = limit
        self.label = redact_store(limit.store)
        self.fallback = Fallback(limit, self.label)
        # The slow fingerprint, worked out once per client (its copies share this budget).
        fingerprint = key_fingerprint(settings.api_key)
        lanes = {
            kind: shared.lane_key(fingerprint, settings.base_url, kind) for kind in (SUBMIT, QUERY)
        }
        # Each lane, and its requests in flight (the start window's, DESIGN 20).
        self.keys = {kind: [lane, shared.flying_key(lane)] for kind, lane in lanes.items()}
        self.timeout = min(settings.timeout, shared.STORE_TIMEOUT)
        # Per kind: no request before this, just after going alone.
        self._quiet_until = {SUBMIT: 0.0, QUERY: 0.0}
        # The tokens of this process's requests in flight, by kind: their leases are renewed
        # every third of LEASE while they last (``renewals``).
        self.held: dict[str, set[str]] = {SUBMIT: set(), QUERY: set()}
        # Isolated 429s' hints, by kind: the next request of the kind waits one (its retry).
        self._owed: dict[str, list[float]] = {SUBMIT: [], QUERY: []}
        self._lock = threading.Lock()

    def options(self, retry: type[Any]) -> dict[str, Any]:
        """redis-py's settings for a store client whose retry objects are ``retry`` (redis-py
        has one class for each of its clients, and warns when its asyncio client gets the
        blocking one)."""
        from redis.backoff import NoBackoff

        # One try per call: a store that does not answer at once is waited for no longer
        # than the timeout, and the request goes on without it.
        return {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "retry": retry(NoBackoff(), 0),
            "health_check_interval": 0,
        }

    # Each operation is planned here (its steps, or None when the in-process budget answers
    # it), run by a driver, and its result (or failure) read here.

    def owed_wait(self, ticket: StoreTicket) -> float:
        """Seconds a new ticket first waits: an isolated 429's hint, owed by its retry."""
        now = time.monotonic()
        with self._lock:
            owed = self._owed[ticket.kind]
            if ticket.epoch == shared.EPOCH_NONE and ticket.not_before == 0.0 and owed:
                ticket.not_before = owed.pop(0)
        return max(0.0, ticket.not_before - now)

    def plan_take(self, ticket: StoreTicket) -> Steps | None:
        if ticket.local is None and self.fallback.use_store(time.monotonic()):
            return shared.take_steps(self.limit, ticket)
        return None

    def took(self, ticket: StoreTicket, result: object) -> float:
        """The seconds ``ticket`` still waits, from the steps' result (or failure)."""
        if not isinstance(result, BaseException):
            wait = float(result)  # type: ignore[arg-type]  # take_steps returns a float
            if wait == 0 and ticket.token:
                self._hold(ticket, True)
            if self._answered() and wait == 0:
                # Back from going alone: the store's lane never heard of this process's
                # last request, which may have gone a moment ago. One interval first (the
                # store counted this one as sent: asked again, it goes).
                return shared.interval(self.limit, ticket.kind)
            return wait
        if self._failed(result):
            # Going alone from now: the in-process budget never heard of the store's last
            # request, which may have gone a moment ago. One interval first.
            self._quiet_until[ticket.kind] = time.monotonic() + shared.interval(
                self.limit, ticket.kind
            )
        return self.local_wait(ticket)

    def local_wait(self, ticket: StoreTicket) -> float:
        """The in-process budget's answer, while the store is away."""
        now = time.monotonic()
        if ticket.local is None:
            ticket.local = self.fallback.budget.reserve(ticket.kind, now)
        wait = self.fallback.budget.wait_time(ticket.local, now)
        return max(wait, self._quiet_until[ticket.kind] - now)

    def plan_release(self, ticket: StoreTicket) -> Steps | None:
        self._hold(ticket, False)
        if ticket.local is not None:
            self.fallback.budget.release(ticket.local)
        elif ticket.epoch != shared.EPOCH_NONE:
            return _one("release", shared.release_args(ticket))
        return None

    def plan_finished(self, ticket: StoreTicket, **ended: Unpack[Ended]) -> Steps | None:
        self._hold(ticket, False)
        if ticket.local is None:
            return shared.finished_steps(self.limit, ticket, **ended)
        self.fallback.budget.finished(ticket.local, time.monotonic(), **ended)
        return None

    def renewals(self) -> list[tuple[str, list[str]]]:
        """The renew script's calls for the leases held now: (kind, arguments)."""
        with self._lock:
            return [
                (kind, [repr(shared.LEASE), *tokens])
                for kind, tokens in self.held.items()
                if tokens
            ]

    def _hold(self, ticket: StoreTicket, holding: bool) -> bool:
        """Notes a request in flight (or no more); True if it is the first one held."""
        with self._lock:
            first = not any(self.held.values())
            if holding:
                self.held[ticket.kind].add(ticket.token)
            else:
                self.held[ticket.kind].discard(ticket.token)
            return first and holding

    def done(self, result: object, kind: str = SUBMIT) -> None:
        """Reads the result of a release or a finish (a hint owed, for a finish). A lost one
        costs little: a place not given back delays the next request by one interval, once
        (a lease, 5 s of a window place at most); an answer the other processes do not hear
        of is one they meet."""
        if isinstance(result, BaseException):
            self._failed(result)
        elif isinstance(result, float) and result > 0:
            with self._lock:
                self._owed[kind].append(time.monotonic() + min(result, rules.MAX_PAUSE))

    def _failed(self, exc: BaseException) -> bool:
        """Notes a failure of the store; True if it was answering until now."""
        warning = self.fallback.failed(time.monotonic(), shared.reason(exc))
        if warning is not None:
            log.warning(warning)
        return warning is not None

    def _answered(self) -> bool:
        """Notes an answer of the store; True if it was away until now."""
        note = self.fallback.answered(time.monotonic())
        if note is not None:
            log.warning(note)
        return note is not None


def _one(name: str, args: list[str]) -> Steps:
    """The steps of a single script call, whose answer is ``{1}``."""
    shared.read_ok((yield name, args))


class AsyncStoreBudget(_Shared):
    """The shared budget as an ``AsyncClient`` asks it (a ``BudgetService``). redis-py's
    asyncio client belongs to one event loop, so one is made per loop the client runs under,
    with a task renewing the leases of its requests in flight while there are any.
    """

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

        loop = asyncio.get_running_loop()  # under trio this raises: the fallback paces
        made = self._stores.get(loop)
        if made is None:
            store = redis.asyncio.Redis.from_url(self.url, **self.options(Retry))
            scripts = {name: store.register_script(body) for name, body in shared.SCRIPTS.items()}
            made = self._stores[loop] = (store, scripts)
        return made[1]

    async def _run(self, kind: str, steps: Steps) -> object:
        """The steps' result, or the failure they met: whatever the store did, the request
        goes on."""
        try:
            scripts = self._scripts()
            answer: object = None
            while True:
                name, args = steps.send(answer)
                # The socket timeouts bound each read; this bounds the whole call.
                answer = await asyncio.wait_for(
                    scripts[name](keys=self.keys[kind], args=args), self.timeout
                )
        except StopIteration as end:
            return end.value
        except Exception as exc:
            return exc

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = StoreTicket(kind, token=secrets.token_hex(8))
        return ticket, await self.wait_time(ticket)

    async def wait_time(self, ticket: Hashable) -> float:
        assert isinstance(ticket, StoreTicket)
        if owed := self.owed_wait(ticket):
            return owed
        steps = self.plan_take(ticket)
        if steps is None:
            return self.local_wait(ticket)
        wait = self.took(ticket, await self._run(ticket.kind, steps))
        if wait == 0 and ticket.local is None and ticket.token:
            self._renew_soon()
        return wait

    async def release(self, ticket: Hashable) -> None:
        assert isinstance(ticket, StoreTicket)
        steps = self.plan_release(ticket)
        if steps is not None:
            self.done(await self._run(ticket.kind, steps))

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        assert isinstance(ticket, StoreTicket)
        steps = self.plan_finished(ticket, **ended)
        if steps is not None:
            self.done(await self._run(ticket.kind, steps), ticket.kind)

    def _renew_soon(self) -> None:
        """Starts this loop's renewing task, unless it runs already."""
        loop = asyncio.get_running_loop()
        task = self._renewing.get(loop)
        if task is None or task.done():
            self._renewing[loop] = loop.create_task(self._renew())

    async def _renew(self) -> None:
        """Renews the leases held every third of LEASE, while any are held."""
        while True:
            await asyncio.sleep(shared.LEASE / 3)
            calls = self.renewals()
            if not calls:
                return
            for kind, args in calls:
                self.done(await self._run(kind, _one("renew", args)))

    async def close(self) -> None:
        """Closes the store's connections of the running event loop (the others' loops are
        gone or elsewhere: their connections close with them)."""
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


class StoreBudget(_Shared):
    """The shared budget as a ``Client`` asks it (a ``SyncBudgetService``); threads share its
    connection pool, and a daemon thread renews the leases of their requests in flight while
    there are any.
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        import redis
        from redis.retry import Retry

        self._store = redis.Redis.from_url(self.url, **self.options(Retry))
        self._scripts = {
            name: self._store.register_script(body) for name, body in shared.SCRIPTS.items()
        }
        self._renewer: threading.Thread | None = None
        self._closed = threading.Event()

    def _run(self, kind: str, steps: Steps) -> object:
        """The steps' result, or the failure they met (see :class:`AsyncStoreBudget`)."""
        try:
            answer: object = None
            while True:
                name, args = steps.send(answer)
                answer = self._scripts[name](keys=self.keys[kind], args=args)
        except StopIteration as end:
            return end.value
        except Exception as exc:
            return exc

    def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = StoreTicket(kind, token=secrets.token_hex(8))
        return ticket, self.wait_time(ticket)

    def wait_time(self, ticket: Hashable) -> float:
        assert isinstance(ticket, StoreTicket)
        if owed := self.owed_wait(ticket):
            return owed
        steps = self.plan_take(ticket)
        if steps is None:
            return self.local_wait(ticket)
        wait = self.took(ticket, self._run(ticket.kind, steps))
        if wait == 0 and ticket.local is None and ticket.token:
            self._renew_soon()
        return wait

    def release(self, ticket: Hashable) -> None:
        assert isinstance(ticket, StoreTicket)
        steps = self.plan_release(ticket)
        if steps is not None:
            self.done(self._run(ticket.kind, steps))

    def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        assert isinstance(ticket, StoreTicket)
        steps = self.plan_finished(ticket, **ended)
        if steps is not None:
            self.done(self._run(ticket.kind, steps), ticket.kind)

    def _renew_soon(self) -> None:
        """Starts the renewing thread, unless it runs already."""
        with self._lock:
            if self._renewer is not None and self._renewer.is_alive():
                return
            self._renewer = threading.Thread(
                target=self._renew, name="imggw-rate-lease", daemon=True
            )
            self._renewer.start()

    def _renew(self) -> None:
        """Renews the leases held every third of LEASE, while any are held."""
        while not self._closed.wait(shared.LEASE / 3):
            calls = self.renewals()
            if not calls:
                return
            for kind, args in calls:
                self.done(self._run(kind, _one("renew", args)))

    def close(self) -> None:
        """Closes the store's connections."""
        self._closed.set()
        self._store.close()
