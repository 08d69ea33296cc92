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
import time
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from ._base_client import key_fingerprint
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


class _Shared:
    """What both drivers share: the lanes' names, the fallback, and how redis-py is set up."""

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
        lanes = {kind: shared.lane_key(fingerprint, settings.base_url, kind)
                 for kind in (SUBMIT, QUERY)}  # fmt: skip
        # Each lane, and its requests in flight (the start window's, DESIGN 20).
        self.keys = {kind: [lane, shared.flying_key(lane)] for kind, lane in lanes.items()}
        self.timeout = min(settings.timeout, shared.STORE_TIMEOUT)
        # Per kind: no request before this, just after going alone.
        self._quiet_until = {SUBMIT: 0.0, QUERY: 0.0}

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

    # Each operation is planned here (the script's arguments, or None when the in-process
    # budget answers it), run by a driver, and its answer (or failure) read here.

    def plan_take(self, ticket: StoreTicket) -> list[str] | None:
        if ticket.local is None and self.fallback.use_store(time.monotonic()):
            return shared.place_args("take", self.limit, ticket)
        return None

    def took(self, ticket: StoreTicket, answer: object) -> float:
        """The seconds ``ticket`` still waits, from the store's answer (or failure)."""
        if not isinstance(answer, BaseException):
            try:
                wait = shared.read_take(ticket, answer)
            except shared.StoreAnswerError as exc:
                answer = exc
            else:
                if self._answered() and wait == 0:
                    # Back from going alone: the store's lane never heard of this process's
                    # last request, which may have gone a moment ago. One interval first (the
                    # store counted this one as sent: asked again, it goes).
                    return shared.interval(self.limit, ticket.kind)
                return wait
        if self._failed(answer):
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

    def plan_release(self, ticket: StoreTicket) -> list[str] | None:
        if ticket.local is not None:
            self.fallback.budget.release(ticket.local)
        elif ticket.epoch != shared.EPOCH_NONE:
            return shared.place_args("release", self.limit, ticket)
        return None

    def plan_finished(self, ticket: StoreTicket, **ended: Unpack[Ended]) -> list[str] | None:
        if ticket.local is None:
            return shared.finished_args(self.limit, ticket, **ended)
        self.fallback.budget.finished(ticket.local, time.monotonic(), **ended)
        return None

    def done(self, answer: object) -> None:
        """Reads the answer to a release or a finish. A lost one costs little: a place not
        given back delays the next request by one interval, once; an answer the other
        processes do not hear of is one they meet themselves."""
        if not isinstance(answer, BaseException):
            try:
                shared.read_ok(answer)
            except shared.StoreAnswerError as exc:
                answer = exc
        if isinstance(answer, BaseException):
            self._failed(answer)

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


class AsyncStoreBudget(_Shared):
    """The shared budget as an ``AsyncClient`` asks it (a ``BudgetService``). redis-py's
    asyncio client belongs to one event loop, so one is made per loop the client runs under.

    Example::

        budget = AsyncStoreBudget(settings)       # AsyncClient does this for RateLimit(store=)
        ticket, wait = await budget.reserve("submit")
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._scripts: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()

    def _script(self) -> Any:
        import redis.asyncio
        from redis.asyncio.retry import Retry

        loop = asyncio.get_running_loop()  # under trio this raises: the fallback paces
        made = self._scripts.get(loop)
        if made is None:
            store = redis.asyncio.Redis.from_url(self.url, **self.options(Retry))
            made = self._scripts[loop] = (store, store.register_script(shared.SCRIPT))
        return made[1]

    async def _call(self, kind: str, args: list[str]) -> object:
        """The script's answer, or the failure it met: whatever the store did, the request
        goes on."""
        try:
            script = self._script()
            # The socket timeouts bound each read; this bounds the whole call.
            return await asyncio.wait_for(script(keys=self.keys[kind], args=args),
                                          self.timeout)  # fmt: skip
        except Exception as exc:
            return exc

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = StoreTicket(kind, token=secrets.token_hex(8))
        return ticket, await self.wait_time(ticket)

    async def wait_time(self, ticket: Hashable) -> float:
        assert isinstance(ticket, StoreTicket)
        args = self.plan_take(ticket)
        if args is None:
            return self.local_wait(ticket)
        return self.took(ticket, await self._call(ticket.kind, args))

    async def release(self, ticket: Hashable) -> None:
        assert isinstance(ticket, StoreTicket)
        args = self.plan_release(ticket)
        if args is not None:
            self.done(await self._call(ticket.kind, args))

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        assert isinstance(ticket, StoreTicket)
        args = self.plan_finished(ticket, **ended)
        if args is not None:
            self.done(await self._call(ticket.kind, args))

    async def close(self) -> None:
        """Closes the store's connections of the running event loop (the others' loops are
        gone or elsewhere: their connections close with them)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        made = self._scripts.pop(loop, None)
        if made is not None:
            await made[0].aclose()


class StoreBudget(_Shared):
    """The shared budget as a ``Client`` asks it (a ``SyncBudgetService``); threads share its
    connection pool.

    Example::

        budget = StoreBudget(settings)            # Client does this for RateLimit(store=)
        ticket, wait = budget.reserve("query")
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        import redis
        from redis.retry import Retry

        self._store = redis.Redis.from_url(self.url, **self.options(Retry))
        self._script = self._store.register_script(shared.SCRIPT)

    def _call(self, kind: str, args: list[str]) -> object:
        """The script's answer, or the failure it met (see :class:`AsyncStoreBudget`)."""
        try:
            answer: object = self._script(keys=self.keys[kind], args=args)
        except Exception as exc:
            return exc
        return answer

    def reserve(self, kind: str) -> tuple[Hashable, float]:
        ticket = StoreTicket(kind, token=secrets.token_hex(8))
        return ticket, self.wait_time(ticket)

    def wait_time(self, ticket: Hashable) -> float:
        assert isinstance(ticket, StoreTicket)
        args = self.plan_take(ticket)
        if args is None:
            return self.local_wait(ticket)
        return self.took(ticket, self._call(ticket.kind, args))

    def release(self, ticket: Hashable) -> None:
        assert isinstance(ticket, StoreTicket)
        args = self.plan_release(ticket)
        if args is not None:
            self.done(self._call(ticket.kind, args))

    def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        assert isinstance(ticket, StoreTicket)
        args = self.plan_finished(ticket, **ended)
        if args is not None:
            self.done(self._call(ticket.kind, args))

    def close(self) -> None:
        """Closes the store's connections."""
        self._store.close()
