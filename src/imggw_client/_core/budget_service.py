"""The seam of a request budget held elsewhere (DESIGN 10, 16): what a client's driver asks
of one (a Dask scheduler's, a shared store's, any service's), and how a request ended as it
is told. The policy such a holder runs is :mod:`imggw_client._core.budget`'s."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Protocol, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack


class Ended(TypedDict):
    """How a request ended, as every budget held elsewhere is told it (the keywords of
    :meth:`BudgetService.finished`; see :meth:`~imggw_client._core.budget.Budget.finished`):
    ``limited``, it met a 429 with the hint ``retry_after`` (seconds, or None); ``backoff``,
    the retry policy's first and longest backoff.
    """

    limited: bool
    retry_after: float | None
    backoff: tuple[float, float]


class BudgetService(Protocol):
    """A :class:`~imggw_client._core.budget.Budget` held elsewhere, asked over the network (by
    the driver, never by the flows), as an ``AsyncClient`` asks it: the same four operations,
    awaited, on the holder's clock. A Dask scheduler plugin holds one for a whole run
    (``imggw_client.batch``); any service that can hold one may do. Its blocking twin, for a
    ``Client``, is :class:`SyncBudgetService`.

    Example::

        class Unpaced:                             # the shape of one: every request goes now
            async def reserve(self, kind: str) -> tuple[Hashable, float]:
                return kind, 0.0                   # a ticket (never None), no wait
            async def wait_time(self, ticket: Hashable) -> float:
                return 0.0
            async def release(self, ticket: Hashable) -> None: ...
            async def finished(self, ticket, *, limited, retry_after, backoff) -> None: ...

        async_client.share_budget(Unpaced())
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

    def reserve(self, kind: str) -> tuple[Hashable, float]:
        """See :meth:`BudgetService.reserve`."""

    def wait_time(self, ticket: Hashable) -> float:
        """See :meth:`BudgetService.wait_time`."""

    def release(self, ticket: Hashable) -> None:
        """See :meth:`BudgetService.release`."""

    def finished(self, ticket: Hashable, **ended: Unpack[Ended]) -> None:
        """See :meth:`BudgetService.finished`."""


class RemoteBudget:
    """The budget of a client that shares one with other processes: the flows then hand each
    slot to the driver (``Pace`` and ``Paced`` actions), which asks ``service`` (awaited by an
    ``AsyncClient``, called by a ``Client``). The logic stays in the budget the service
    holds; a local client never sees this class.
    """

    def __init__(self, service: BudgetService | SyncBudgetService) -> None:
        self.service = service
