"""The seam of a request budget held elsewhere (DESIGN 10, 16, 25): what a client's driver asks
of one (a Dask scheduler's, a shared store's, any service's). The policy is ``_core.budget``'s."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Protocol, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack


# The longest a client spends giving back the slots of requests cut short (``RemoteBudget``).
GIVE_BACK_TIMEOUT = 5.0


class Ended(TypedDict):
    """How a request ended (see :meth:`~imggw_client._core.budget.Budget.finished`)."""

    limited: bool  # it met a 429 ...
    retry_after: float | None  # ... with this hint, in seconds
    backoff: tuple[float, float]  # the retry policy's first and longest backoff


class BudgetService(Protocol):
    """A :class:`~imggw_client._core.budget.Budget` held elsewhere, as an ``AsyncClient`` asks
    it: the same four operations, awaited, on the holder's clock. A Dask scheduler plugin holds
    one for a whole run (``imggw_client.batch``); any service that can hold one may do.

    Example::

        class Unpaced:                             # the shape of one: every request goes now
            async def reserve(self, kind: str) -> tuple[Hashable, float]:
                return kind, 0.0                   # a ticket (never None), no wait
            async def wait_time(self, ticket: Hashable) -> float:
                return 0.0
            async def release(self, ticket: Hashable) -> None: ...
            async def finished(self, ticket, *, limited, retry_after, backoff) -> None: ...

        async with AsyncClient() as async_client:
            async_client.share_budget(Unpaced())
            task = await async_client.get(sub.task_id)
    """

    async def reserve(self, kind: str) -> tuple[Hashable, float]:
        """A new slot of ``kind``: its ticket, and the seconds to wait before it (0: go now)."""

    async def wait_time(self, ticket: Hashable) -> float:
        """Seconds the ticket must still wait (0: go now; the send is then recorded)."""

    async def release(self, ticket: Hashable) -> None:
        """Gives back a slot that will not be used."""

    async def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        """The request of ``ticket`` ended: its keywords are :class:`Ended`'s."""


class SyncBudgetService(Protocol):
    """:class:`BudgetService` for a blocking ``Client``: the same four operations, each a plain
    call that blocks until the holder answers (threads of one client may call at once).

    Example::

        class Unpaced:                             # the shape of one: every request goes now
            def reserve(self, kind: str) -> tuple[Hashable, float]:
                return kind, 0.0                   # a ticket (never None), no wait
            def wait_time(self, ticket: Hashable) -> float:
                return 0.0
            def release(self, ticket: Hashable) -> None: ...
            def finished(self, ticket, *, limited, retry_after, backoff) -> None: ...

        client.share_budget(Unpaced())
    """

    def reserve(self, kind: str) -> tuple[Hashable, float]: ...
    def wait_time(self, ticket: Hashable) -> float: ...
    def release(self, ticket: Hashable) -> None: ...
    def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None: ...


class RemoteBudget:
    """The budget of a client that shares one: the flows hand each slot to the driver (``Pace``
    and ``Paced`` actions), which asks ``service``; a local client never sees this class."""

    def __init__(self, service: BudgetService | SyncBudgetService) -> None:
        self.service = service
        # Slots of requests cut short (cancelled, closed) that a flow could not give back
        # itself, since it cannot ask the driver once stopped: the driver releases them next.
        self.abandoned: deque[Hashable] = deque()
