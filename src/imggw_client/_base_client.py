"""What Client and AsyncClient share: settings, the core flows, the HTTP connection and its
ownership, ``with_options``, the read-only views of the settings. The drivers add only how
actions are performed (blocking or awaited)."""

from __future__ import annotations

import functools
import hashlib
import os
import random
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, cast

import httpx

from . import _logs, _telemetry
from ._core.budget import Budget, RemoteBudget
from ._core.config import PollPolicy, RateLimit, RetryPolicy, Settings, check_surface, updated
from ._core.durations import DurationModel
from ._core.exceptions import ConfigurationError, ImggwError, RequestValidationError
from ._core.flows import Flows, log
from ._core.models import Submission, Task, raise_violations
from ._core.rules import RESOLUTIONS, Resolution, Violation
from ._core.silence import Silence
from ._core.spec import Surface
from ._core.surfaces import redact_url, transport_error
from ._core.text import REDACTED, printable
from ._core.wire import ClientClosed, TransportFailure
from ._transport import Connection, H, require_http_client, user_agent

if TYPE_CHECKING:
    import httpx2

    from ._journal.journal import Journal, JournalEntry, Scope

Transport = httpx.BaseTransport | httpx.AsyncBaseTransport
B = TypeVar("B", bound="BaseClient[Any]")

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_WAIT_TIMEOUT = 600.0
DEFAULT_DOWNLOAD_CONCURRENCY = 4
# The most queries as_completed has in flight at once (its budget paces them anyway): a Client
# runs its waits on this many threads at most, however many tasks it waits on.
COMPLETIONS_IN_FLIGHT = 16
# The most journaled submits unfinished() sends again at once (the budget paces them anyway):
# 500 of them against a gateway answering in 50 ms take about 1.6 s, not 25 s one by one.
RESENDS_IN_FLIGHT = 16
DEFAULT_POLL = PollPolicy()
# A fixed salt and a slow hash: a fingerprint names a key without revealing it, and guessing a
# key from one costs this many rounds a guess.
KEY_FINGERPRINT_SALT = b"imggw key fingerprint v1"
KEY_FINGERPRINT_ROUNDS = 100_000


# Fingerprints this process worked out, at most this many: a process serving many tenants
# with a client per request (a journal's scope, a shared store's lanes) pays the slow hash
# (about 40 ms, on an AsyncClient's event loop) once per key, not once per client.
FINGERPRINTS_KEPT = 4096
# Names a key among those kept without holding it: a hash salted anew in each process.
_FINGERPRINT_NAME_SALT = os.urandom(16)
_fingerprints: dict[bytes, str] = {}
_fingerprints_lock = threading.Lock()


def key_fingerprint(api_key: str) -> str:
    """The fingerprint of ``api_key``: PBKDF2-HMAC-SHA256, hex (see
    :attr:`BaseClient.key_fingerprint`); each key's worked out once in a process."""
    name = hashlib.sha256(_FINGERPRINT_NAME_SALT + api_key.encode()).digest()
    with _fingerprints_lock:
        known = _fingerprints.pop(name, None)
        if known is not None:
            _fingerprints[name] = known  # the most recently used last
            return known
    digest = hashlib.pbkdf2_hmac(
        "sha256", api_key.encode(), KEY_FINGERPRINT_SALT, KEY_FINGERPRINT_ROUNDS
    ).hex()
    with _fingerprints_lock:
        if len(_fingerprints) >= FINGERPRINTS_KEPT:
            _fingerprints.pop(next(iter(_fingerprints)))  # the least recently used
        _fingerprints[name] = digest
    return digest


def watch(client: object, key: str) -> weakref.finalize[[str], object]:
    """Blanks ``key`` in every log record and task repr while ``client`` is open: until its
    ``close()`` calls what this returns, or it is collected unclosed. A process that makes a
    client per tenant or per request then blanks its live tenants' keys, never every key it
    ever saw (10,000 of them made each log record cost a millisecond)."""
    _logs.watch_key(key)
    return weakref.finalize(client, _logs.unwatch_key, key)


class BaseClient(Generic[H]):
    _http_type: type[H]
    _transport_type: type[Any]
    _defer_journal = False  # open a journal given by path on first use (the driver's choice)
    _conn: Connection[H]
    make_http_client: Callable[..., H]  # the driver's: how it makes its own HTTP client

    def __init__(
        self,
        settings: Settings,
        *,
        http_client: object,
        transport: Transport | None,
        journal: Any = None,
    ) -> None:
        self._settings = settings
        self._watching = watch(self, self._settings.api_key)  # no log line shows it
        self._flows = Flows(self._settings, budget=self._own_budget(self._settings))
        # The gateway's silence as this client's requests see it (shared by its copies to the
        # same gateway and key): what a batch's progress tells of a gateway down or hung.
        self._silence = Silence()
        self._owns_budget = True  # closes its budget's connections (a shared store's) on close
        self._journal, self._owns_journal = open_journal(journal, defer=self._defer_journal)
        self._flows.journaled = self._journal is not None
        self._conn = self._connect(http_client, transport)
        self._agent = user_agent(self._conn.http)
        self._closed = False
        self._copy = False  # a with_options copy never closes the connection it borrows

    def _connect(self, http_client: object, transport: Transport | None) -> Connection[H]:
        if http_client is not None:
            require_http_client(http_client, self._http_type.__name__)
            if transport is not None:
                raise ConfigurationError("pass either http_client= or transport=, not both")
            # httpx2's client has httpx's API: it is driven as one.
            return Connection(cast(H, http_client), owned=False, factory=None)
        if transport is not None:
            _require_transport(transport, self._transport_type)
        factory = functools.partial(self.make_http_client, transport=transport)
        # A pool's connections belong to the event loop that opened them: one made again
        # over the same pool would be no fresher.
        pooled = isinstance(transport, (httpx.HTTPTransport, httpx.AsyncHTTPTransport))
        return Connection(
            factory(), owned=True, factory=None if pooled else factory, per_loop=transport is None
        )

    @property
    def _http(self) -> H:
        return self._conn.http

    @property
    def _owns_http(self) -> bool:
        # In a forked child, the HTTP client inherited from the parent is the parent's to close.
        return self._conn.owned and not self._copy and self._conn.mine

    @property
    def base_url(self) -> str:
        """The gateway's base URL, without a trailing slash."""
        return self._settings.base_url

    @property
    def surface(self) -> Surface:
        """The default surface, ``"alpha"`` or ``"beta"``."""
        return self._settings.surface

    @property
    def default_headers(self) -> dict[str, str]:
        """The headers sent on every request to the gateway (``default_headers=``), beside
        the SDK's own; never on result downloads, which go to other hosts. A copy: change
        them with :meth:`with_options`.

        Example::

            client = Client(default_headers={"X-Tenant": "acme"})
            client.with_options(default_headers={"X-Trace": "1"}).default_headers
            # {'X-Tenant': 'acme', 'X-Trace': '1'}
        """
        return dict(self._settings.headers)

    @property
    def key_fingerprint(self) -> str:
        """A fingerprint of the API key (64 hex digits): the same key gives the same one on
        every machine, and the key cannot be read back from it (PBKDF2-HMAC-SHA256, 100,000
        rounds, so each guess of a key costs that much). What tells one key's work from
        another's without keeping the key, as the batch runner's run ids do. Worked out on
        first use (a few tens of milliseconds), then kept, for every client of this key in
        the process (the most recent 4,096 keys').

        Example::

            with Client() as client:
                print(client.key_fingerprint[:12])   # never the key itself
        """
        cached: str | None = self.__dict__.get("_key_fingerprint")
        if cached is None:
            cached = key_fingerprint(self._settings.api_key)
            self.__dict__["_key_fingerprint"] = cached
        return cached

    @property
    def journal(self) -> Journal | None:
        """The :class:`~imggw_client.tracking.Journal` this client records its tasks in, or
        None (the default: the SDK writes nothing unless given one, or ``IMGGW_JOURNAL``).

        Example::

            client = Client(journal="state/imggw.sqlite")
            print([e.task_id for e in client.journal.tasks(unfinished=True)])
        """
        return self._journal

    @property
    def journal_scope(self) -> Scope:
        """Whose tasks this client's journal rows are: its gateway and key fingerprint.

        Example::

            mine = client.journal.tasks(scope=client.journal_scope)
        """
        from ._journal.journal import Scope

        return Scope(self._settings.base_url, self.key_fingerprint)

    def _open_entries(self) -> list[JournalEntry]:
        """This client's journaled tasks that still need work and that no other live process
        works on, oldest first; this process holds them from now on (a lease renewed while it
        lives, so that a sibling sharing the journal leaves them alone). Blocking."""
        assert self._journal is not None
        return self._journal._claim(self.journal_scope)[0]

    @property
    def timeout(self) -> float | httpx.Timeout:
        """What bounds each request, as given: seconds each request may take, from sending
        it to its last byte, or an ``httpx.Timeout`` (each phase bounded as httpx does, and
        the whole request by the largest of its limits). Not a wait's deadline: that is
        ``wait_timeout=`` on :meth:`wait` and :meth:`generate`.

        Example::

            client.with_options(timeout=120).timeout    # 120.0
            client.with_options(timeout=httpx.Timeout(60, connect=5)).timeout
        """
        given = self._settings.http_timeout
        return self._settings.timeout if given is None else given

    @property
    def retry(self) -> RetryPolicy:
        """The :class:`RetryPolicy` of this client's requests (``max_retries`` included).

        Example::

            Client(max_retries=2).retry.max_attempts    # 3
        """
        return self._settings.retry

    @property
    def poll(self) -> PollPolicy:
        """The :class:`PollPolicy` of this client's waits.

        Example::

            delay = client.poll.initial_interval
        """
        return self._settings.poll

    def redact(self, text: object) -> str:
        """``text`` (or, if it is not a string, ``str(text)``: an exception, say) with every
        occurrence of this client's API key replaced by ``[redacted]``: for a log line built
        from an exception or a gateway's words, without ever holding the key.

        Example::

            try:
                client.get("12345")
            except NotFoundError as err:
                log.warning("line 7 failed: %s", client.redact(err))
        """
        return str(text).replace(self._settings.api_key, REDACTED)

    def redact_url(self, url: str) -> str:
        """``url`` with this client's API key blanked wherever a gateway put it, as
        :func:`imggw_client.text.redact_url` does given the key (a key under 8 characters only
        where it is a whole path segment or query value): a result link as it may be printed,
        or kept in a file that must never hold the key.

        Example::

            print(client.redact_url(task.image_urls[0]))   # '...?sig=[redacted]' if signed so
        """
        return redact_url(url, (self._settings.api_key,))

    @property
    def gateway_silent_for(self) -> float:
        """Seconds the gateway has been asked and has answered nothing (no reply, or a 5xx),
        as the requests of this client and of its ``with_options`` copies to the same gateway
        and key see it; 0.0 while it answers, or when nothing was asked. What tells a gateway
        down or hung from one slow to finish its tasks (a batch's progress shows it).

        Example::

            if client.gateway_silent_for > 60:
                log.warning("the gateway has answered nothing for a minute")
        """
        return self._silence.silent_for(time.monotonic())

    def typical_durations(self, surface: Surface | None = None) -> dict[str, float]:
        """The median running time (seconds from submit to finish) this client learned of its
        tasks on ``surface`` (None: its own), per resolution, for those it knows: what its
        waits poll by (shared with its ``with_options`` copies to the same gateway and key).
        Empty until a wait saw a task run and finish.

        Example::

            client.typical_durations("beta")     # {'1k': 8.2, '4k': 31.0}
        """
        chosen, now = self._flows.surface(surface), self._flows.clock()
        model = self._flows.durations
        found = {res: model.quantile((chosen, res), 0.5, now) for res in RESOLUTIONS}
        return {res: round(took, 3) for res, took in found.items() if took is not None}

    def learn_durations(
        self, surface: Surface, resolution: Resolution, durations: Iterable[float]
    ) -> int:
        """Starts this client's waits on ``resolution`` tasks on ``surface`` from durations
        seen before (seconds from each submit until its task was seen finished, oldest first),
        not from nothing, as a resumed batch does from its ledger. The newest 50 are kept and
        garbage is dropped; returns how many were kept.

        Example::

            client.learn_durations("beta", "1k", [52.0, 61.5, 48.2])    # 3
        """
        size = resolution.lower() if isinstance(resolution, str) else resolution
        if size not in RESOLUTIONS:
            raise ConfigurationError(f"resolution must be one of {', '.join(RESOLUTIONS)}")
        kind, grace = (self._flows.surface(surface), size), self._settings.poll.initial_interval
        return self._flows.durations.seed(kind, durations, self._flows.clock(), grace=grace)

    @property
    def idempotency_window(self) -> float:
        """How long (seconds) the gateway remembers an idempotency key (``idempotency_window=``,
        else ``IMGGW_IDEMPOTENCY_WINDOW``, else 86400, the usual 24 h). A journaled submit
        whose outcome is unknown and whose first send is older than this is never sent again
        on its own (:meth:`unfinished`): the gateway may have forgotten its key and would bill
        a second task.

        Example::

            Client(idempotency_window=3600).idempotency_window    # 3600.0
        """
        return self._settings.idempotency_window

    @property
    def rate_limit(self) -> RateLimit:
        """The request budget this client (and every ``with_options`` copy) shares."""
        return self._settings.rate_limit

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` was called on this client (or on the one it was copied from,
        when that one owns the connection)."""
        return self._closed or self._conn.closed

    def with_options(
        self: B,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        surface: Surface | None = None,
        default_headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout | httpx2.Timeout | None = None,
        max_retries: int | None = None,
        retry: RetryPolicy | None = None,
        poll: PollPolicy | None = None,
        idempotency_window: float | None = None,
    ) -> B:
        """A copy of this client with other settings for the calls made through it (None:
        unchanged); this client is unchanged. ``default_headers`` are added to this client's
        (a name given again replaces its value).

        The copy shares the HTTP connection pool and the journal. It shares the request
        budget and what the client learned of its tasks' durations too, unless it talks to
        another gateway or with another key (``base_url``, ``api_key``): a gateway limits and
        times each key apart, so that copy starts with a budget of its own (the same
        ``rate_limit``; through the same store, when one is named, in that key's lanes) and
        learns afresh. Closing the copy closes only the copy.

        Example::

            task = client.with_options(timeout=120, poll=PollPolicy(initial_interval=5)).wait(sub)
            alpha = client.with_options(surface="alpha", default_headers={"X-Team": "ml"})
            other = client.with_options(api_key="sk-another-key")   # its own budget
        """
        settings = updated(
            self._settings,
            api_key=api_key,
            base_url=base_url,
            surface=surface,
            default_headers=default_headers,
            timeout=timeout,
            max_retries=max_retries,
            retry=retry,
            poll=poll,
            idempotency_window=idempotency_window,
        )
        elsewhere = (settings.api_key, settings.base_url) != (
            self._settings.api_key,
            self._settings.base_url,
        )
        clone = object.__new__(type(self))  # not copy.copy: that is this method
        clone.__dict__.update(self.__dict__)
        clone._settings = settings
        clone._flows = Flows(
            settings,
            clock=self._flows.clock,
            wall=self._flows.wall,
            rng=random.Random(),
            budget=self._own_budget(settings) if elsewhere else self._flows.budget,
            durations=DurationModel() if elsewhere else self._flows.durations,
        )
        clone._flows.journaled = self._flows.journaled
        clone._closed = self._closed
        clone._copy = True
        clone._owns_budget = elsewhere
        clone._watching = watch(clone, settings.api_key)  # its own: closing it ends only it
        if elsewhere:
            clone._silence = Silence()  # another gateway's silence is not this one's
            clone.__dict__.pop("_key_fingerprint", None)  # another key's: never this one's
        return clone

    def _own_budget(self, settings: Settings) -> Budget | RemoteBudget:
        """A new request budget for ``settings`` (the driver's, when a store shares it)."""
        return Budget(settings.rate_limit)

    def generation(self, *, surface: Surface | None = None) -> AbstractContextManager[Any]:
        """One generate made of separate calls, as OpenTelemetry sees it (DESIGN 17): the block
        is one ``imggw.generate`` span whose children are the spans of the calls made in it
        (``imggw.submit``, ``imggw.wait``, ``imggw.download``...), with the task id, status,
        attempts and polls they saw, as :meth:`generate`'s own span has. For code that keeps
        the task id between the steps, or saves the results under the same span. It sends
        nothing, and does nothing when no OpenTelemetry SDK is configured. A plain ``with`` on
        either client: it needs no event loop. ``surface``: the span's ``imggw.surface``
        (default: the client's).

        Example::

            with client.generation():
                sub = client.submit("a lighthouse at dusk")
                Path("last-task.txt").write_text(sub.task_id)   # yours, before the wait
                task = client.wait(sub)
                files = client.download(task, "out/")
        """
        return _telemetry.group("imggw.generate", surface or self._settings.surface)

    def _operation(self, name: str, surface: object) -> _telemetry.Watch:
        """The span of one public call (DESIGN 17): a null one when telemetry is off."""
        # The flows observe only while something records: a provider is set once, at start.
        self._flows.observe = observe = _telemetry.active()
        if not observe:
            return _telemetry.NULL
        shown = surface if isinstance(surface, str) else self._settings.surface
        return _telemetry.Operation(name, shown)

    def _check_open(self) -> None:
        """Raises what a closed client's calls raise, before they record or send anything
        (``ClientClosedError``), whatever they would do first."""
        closed = self._closed_failure()
        if closed is not None:  # in an except clause, what was caught is not the news
            raise transport_error(self.surface, closed) from None

    def _closed_failure(self) -> TransportFailure | None:
        """The failure to report instead of sending, once the client is closed."""
        if self.is_closed:
            return TransportFailure(sent=False, timeout=False, error=ClientClosed())
        return None

    def _failure(self, exc: Exception) -> TransportFailure:
        """Anything else a send raised (a client closed under it, a broken pool): reported as a
        failure that may have reached the gateway, so a submit keeps its key and is never
        billed twice."""
        if self.is_closed:
            return TransportFailure(sent=True, timeout=False, error=ClientClosed())
        log.warning("a request failed (%s); treated as a lost answer", type(exc).__name__)
        return TransportFailure(sent=True, timeout=False, error=exc)

    def __copy__(self: B) -> B:
        """``copy.copy(client)`` is ``client.with_options()``: the copy shares the pool, the
        budget and the journal, and closing it closes only the copy. A plain copy would own
        them all, and its close would close the original's."""
        return self.with_options()

    def __reduce__(self) -> NoReturn:
        # pickle and copy.deepcopy: a client's connections, locks and journal are its
        # process's; said plainly, not as "cannot pickle '_thread.lock' object".
        raise TypeError(
            f"a {type(self).__name__} cannot be pickled or deep-copied: its connections and "
            "journal belong to this process. Make one where it is used (in each worker: a "
            "pool initializer, post_fork); copy.copy() or with_options() shares this one"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, surface={self.surface!r})"


ENV_JOURNAL = "IMGGW_JOURNAL"


def unique(items: Iterable[Submission | Task | str], surface: str) -> list[Submission | Task | str]:
    """``as_completed``'s items, each task once (by surface and id; a bare id is on
    ``surface``), in the order given. One item given where a list belongs (a task id, whose
    characters would each be waited on as an id) and an item of another kind are refused."""
    if isinstance(items, (str, bytes, Submission, Task, Mapping)) or not isinstance(
        items, Iterable
    ):
        rule = f"must be a list of submissions, tasks or task ids, not {type(items).__name__}"
        raise RequestValidationError("items", rule)
    seen: set[tuple[str, str]] = set()
    kept: list[Submission | Task | str] = []
    for item in items:
        name: tuple[str, str]
        if isinstance(item, Submission):
            name = (item.surface, item.task_id)
        elif isinstance(item, Task):
            name = (item.surface, item.id)
        elif isinstance(item, str):
            name = (surface, item)
        else:
            rule = f"must hold submissions, tasks or task ids (str), not {type(item).__name__}"
            raise RequestValidationError("items", rule)
        if name not in seen:
            seen.add(name)
            kept.append(item)
    return kept


def wait_deadline(wait_timeout: float, timeout: float | None) -> float:
    """A wait's deadline, from ``wait_timeout=`` or the deprecated ``timeout=`` (which says
    so once per call, pointing at the caller's line). Checked before anything is sent."""
    field, deadline = "wait_timeout", wait_timeout
    if timeout is not None:
        warnings.warn(
            "timeout= on wait() and generate() is deprecated: it is the wait's deadline, now "
            "named wait_timeout= (timeout= is the client's request limit, as in with_options)",
            DeprecationWarning,
            stacklevel=3,
        )
        if wait_timeout != DEFAULT_WAIT_TIMEOUT and wait_timeout != timeout:
            rule = "is the deprecated name of wait_timeout: pass wait_timeout= alone"
            raise_violations([Violation("timeout", rule, "invalid_timeout")])
        field, deadline = "timeout", timeout
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not deadline >= 0:
        raise_violations([Violation(field, "must be seconds >= 0", "invalid_timeout")])
    return float(deadline)


def log_resend(key: str, err: BaseException) -> None:
    """A journaled submit ``unfinished`` sent again and did not get back."""
    log.warning(
        "a journaled submit (idempotency key %s) was not resumed: %s", printable(key, 255), err
    )


def log_forgotten(entry: JournalEntry, window: float) -> None:
    """A journaled submit of unknown outcome that ``unfinished`` leaves unsent: its first
    send is older than the gateway's memory of keys."""
    first = entry.created_at
    when = "at a time not known" if first is None else first.strftime("%Y-%m-%d %H:%M:%S UTC")
    log.warning(
        "a journaled submit (idempotency key %s, surface %s) was first sent %s, longer ago "
        "than the gateway remembers keys (idempotency_window=%gs): sending it again could bill "
        "a second task, so it was not sent; it stays in the journal. To send it anyway, "
        "call unfinished(resend_expired_keys=True)",
        printable(entry.idempotency_key, 255),
        printable(entry.surface, 20),
        when,
        window,
    )


def journaled(entry: JournalEntry) -> Submission | None:
    """The submission a journal row with a task id stands for, or None (logged) when the row
    cannot be one: one bad row is not every row's end."""
    assert entry.task_id is not None
    try:
        return Submission(
            task_id=entry.task_id,
            surface=check_surface(entry.surface),
            idempotency_key=entry.idempotency_key,
            resolution=entry.request.resolution,
            submitted_at=entry.submitted_at,
            request=entry.request,
        )
    except (ImggwError, ValueError) as err:  # pydantic's ValidationError is a ValueError
        log.warning(
            "a journal row (idempotency key %s) cannot be resumed: %s",
            printable(entry.idempotency_key, 255),
            type(err).__name__,
        )
        return None


def open_journal(journal: object, *, defer: bool = False) -> tuple[Journal | None, bool]:
    """The client's journal and whether the client opened it (and so closes it): a
    :class:`Journal` as given, a path opened (``defer``: on first use), or None, when
    ``IMGGW_JOURNAL`` (a path; ``off`` or empty for none) names none either."""
    if journal is False:
        return None, False
    if journal is None:
        named = os.environ.get(ENV_JOURNAL, "")
        if not named or named.strip().lower() == "off":
            return None, False
        journal = named
    from ._journal.journal import Journal  # here: a client with no journal never loads SQLite

    if isinstance(journal, Journal):
        return _writable(journal), False
    if isinstance(journal, (str, os.PathLike)) and os.fspath(journal):
        try:
            os.fsencode(journal)
        except UnicodeError:  # a lone surrogate: no file system can name it
            raise ConfigurationError(
                "journal names no path the file system can hold", code="journal_unusable"
            ) from None
        opened = _writable(Journal._deferred(journal), close=True)  # a folder: never opened
        if not defer:  # opened now, as Journal(path) is; a ledger's own file is known then
            with opened._connection(writing=False):
                pass
            _writable(opened, close=True)
        return opened, True
    raise ConfigurationError(
        "journal must be a Journal, a path, False or None", code="journal_unusable"
    )


def _writable(journal: Journal, *, close: bool = False) -> Journal:
    """``journal``, unless it is a batch folder's ledger (listed, never written by a client:
    its run writes it; one opened here is closed). A ledger's file opened on first use (an
    ``AsyncClient``'s) is refused at its first write, before anything is sent."""
    if journal._ledger:
        if close:
            journal.close()
        if journal.path.is_file():
            why = f"{journal.path} is a batch folder's ledger: list it with Journal(folder).tasks()"
        else:  # a folder of a sharded run, or of nothing: no ledger a client could mistake
            folder = journal.path.parent
            why = f"{folder} is a folder: name a file, such as {folder / 'journal.sqlite'}"
        raise ConfigurationError(
            f"the journal {why}; a client needs a journal of its own", code="journal_unusable"
        )
    return journal


def _require_transport(transport: object, expected: type[Any]) -> None:
    if not isinstance(transport, expected):
        # httpx2's transports go inside an httpx2 client of the caller's, as http_client=.
        client = expected.__name__.replace("BaseTransport", "Client")
        raise ConfigurationError(
            f"transport must be an httpx.{expected.__name__}; an httpx2 "
            f"transport goes in your own client: http_client=httpx2.{client}(transport=...)"
        )
