"""Plain values exchanged between the core and the drivers: no I/O, no httpx."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from .budget import DEFAULT_BACKOFF, WriteGate
from .models import DownloadedFile, Submission, Task


@dataclass(frozen=True, slots=True)
class WireRequest:
    """An HTTP request to the gateway, relative to the base URL and without credentials."""

    method: str
    path: str
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete HTTP response as the driver read it. ``headers`` is looked up by lower-case
    name (``httpx.Headers`` or any mapping with lower-case keys)."""

    status: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True, slots=True)
class TransportFailure:
    """No complete response. ``sent`` is False only when the request surely never left.
    ``error`` is what the driver caught: an httpx error, or one of the two below."""

    sent: bool
    timeout: bool
    error: BaseException


class ClientClosed(Exception):
    """The client was closed before or while the request was made."""


class ReplyTooLarge(Exception):
    """The reply's body passed the SDK's limit; reading stopped there."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the reply was larger than {limit} bytes")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Fetched:
    """A streamed result download. ``file`` is set when a 200 body was saved and verified
    (``body`` instead, at its start, when the fetch named no folder: the caller's to close);
    ``incomplete`` when the body ended short of its Content-Length or the image is cut short;
    ``too_large`` when it passed ``max_bytes`` (nothing was kept); ``document`` names what was
    served instead of an image (an error page, say: nothing was kept)."""

    status: int
    file: DownloadedFile | None = None
    incomplete: bool = False
    too_large: bool = False
    document: str | None = None
    body: BinaryIO | None = None


# Actions a flow yields; the driver performs each and sends back the result shown.
@dataclass(frozen=True, slots=True)
class Send:
    """Perform the request (with the API key) -> ``Reply | TransportFailure``. ``timeout``
    bounds the whole exchange, from sending to the last byte of the reply. A paced request
    carries its budget's ``gate``, asked right before its head is written."""

    request: WireRequest
    timeout: float
    gate: WriteGate | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep this many seconds -> ``None``. A wait for the request budget carries ``arm``: a
    driver that can be woken from any thread calls it with its wake first, and sleeps what it
    returns instead (0.0: not at all), or until woken (``Budget.arm``)."""

    seconds: float
    arm: Callable[[Callable[[], object]], float] | None = field(
        default=None, compare=False, repr=False
    )


@dataclass(frozen=True, slots=True)
class Notify:
    """Call the user's ``on_update`` with the task (awaiting what it returns) -> ``None``."""

    task: Task


@dataclass(frozen=True, slots=True)
class Fetch:
    """Stream a result URL, without credentials, to ``dest_dir/stem.<ext>`` -> ``Fetched |
    TransportFailure``. Never overwrites unless ``overwrite``; ``timeout`` bounds the whole
    download; a body past ``max_bytes`` is abandoned. ``dest_dir`` None: into a stream the
    driver holds (memory, then an anonymous temporary file), handed back verified."""

    url: str
    dest_dir: Path | None
    stem: str
    overwrite: bool
    timeout: float
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Pace:
    """Ask a budget held elsewhere (one for a whole run on many machines, DESIGN 9 and 10) for
    a slot of one request of ``kind`` -> ``(ticket, seconds to wait)``: with ``ticket`` None a
    new slot is reserved, else the same ticket asks again after its wait. Only a client whose
    budget is a :class:`~imggw_client._core.budget.RemoteBudget` meets this action."""

    kind: str
    ticket: object = None


@dataclass(frozen=True, slots=True)
class Paced:
    """Tell the budget held elsewhere how the request of ``ticket`` ended -> ``None``: answered,
    failed, or (``limited``) met a 429 with the hint ``retry_after``; ``sent=False`` gives back
    a slot that will not be used (its request's deadline came first)."""

    ticket: object
    sent: bool = True
    limited: bool = False
    retry_after: float | None = None
    backoff: tuple[float, float] = DEFAULT_BACKOFF


# What an Observe reports (DESIGN 17).
REQUEST = "request"  # one attempt's outcome: kind (submit, query, download), outcome
BUDGET_WAIT = "budget_wait"  # seconds one request waited for the budget (value), kind
POLL = "poll"  # one query of a wait
TASK_DONE = "task_done"  # a wait saw its task terminal: seconds since its submit (value)
PHASE = "phase"  # generate moves on to its submit or its wait (kind), for the task task_id


@dataclass(frozen=True, slots=True)
class Observe:
    """Something worth measuring happened -> ``None``: the driver hands it to telemetry.
    Yielded only by flows whose client observes (``Flows.observe``: the OpenTelemetry API is
    installed). ``event`` is one of the names above; the other fields apply as they say. The
    protocol's judgements (was it a 429, did the task finish) are made here in the core, so
    that the drivers only count."""

    event: str
    value: float = 1.0
    kind: str = ""
    outcome: str = ""
    surface: str = ""
    task_id: str = ""
    status: str = ""
    limited: bool = False  # a request the gateway answered with a 429


@dataclass(frozen=True, slots=True)
class Record:
    """Write ``event`` (one of :mod:`~imggw_client._core.states`' events) to the client's
    journal, committed before the flow goes on -> ``None``. Yielded only by flows whose client
    keeps a journal (``Flows.journaled``): a client without one writes nothing."""

    event: object


@dataclass(frozen=True, slots=True)
class Answered:
    """A submit was answered: call the user's ``on_submit`` with the submission (awaiting
    what it returns) -> ``None``, before anything else happens to it."""

    submission: Submission


Action = Send | Sleep | Notify | Fetch | Pace | Paced | Observe | Record | Answered
Outcome = Any  # Reply | TransportFailure | Fetched | (ticket, seconds) | None, by action

T = TypeVar("T")
# An operation with no I/O: it yields actions, the driver sends each one's outcome back, and its
# return value is the operation's result.
Flow = Generator[Action, Any, T]
