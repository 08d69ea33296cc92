"""What Client and AsyncClient share: settings, the core flows, the HTTP connection and its
ownership, ``with_options``. The drivers add only how actions are performed (blocking or
awaited)."""

from __future__ import annotations

import copy
import hashlib
import random
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import httpx

from ._config import PollPolicy, RateLimit, RetryPolicy, Settings, resolve_settings, updated
from ._core.flows import Flows, log
from ._core.wire import ClientClosed, TransportFailure
from ._exceptions import ConfigurationError
from ._transport import user_agent

H = TypeVar("H", httpx.Client, httpx.AsyncClient)
B = TypeVar("B", bound="BaseClient[Any]")

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_WAIT_TIMEOUT = 600.0
DEFAULT_DOWNLOAD_CONCURRENCY = 4
DEFAULT_POLL = PollPolicy()
# A fixed salt and a slow hash: a fingerprint names a key without revealing it, and guessing a
# key from one costs this many rounds a guess.
KEY_FINGERPRINT_SALT = b"imggw key fingerprint v1"
KEY_FINGERPRINT_ROUNDS = 100_000


def key_fingerprint(api_key: str) -> str:
    """The fingerprint of ``api_key``: PBKDF2-HMAC-SHA256, hex (see
    :attr:`BaseClient.key_fingerprint`)."""
    digest = hashlib.pbkdf2_hmac(
        "sha256", api_key.encode(), KEY_FINGERPRINT_SALT, KEY_FINGERPRINT_ROUNDS
    )
    return digest.hex()


class Connection(Generic[H]):
    """The HTTP client behind a client and all its ``with_options`` copies. ``factory`` makes a
    fresh one (None for a caller's own client, which we never replace)."""

    def __init__(self, http: H, *, owned: bool, factory: Callable[[], H] | None) -> None:
        self.http: H = http
        self.owned = owned
        self.factory: Callable[[], H] | None = factory
        self.loop: object = None  # the event loop an AsyncClient's connections belong to


class BaseClient(Generic[H]):
    _http_type: type[H]
    _conn: Connection[H]

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        *,
        surface: str,
        timeout: float,
        max_retries: int,
        retry: RetryPolicy | None,
        poll: PollPolicy | None,
        rate_limit: RateLimit | None,
        http_client: H | None,
    ) -> None:
        self._settings: Settings = resolve_settings(
            api_key,
            base_url,
            surface=surface,
            timeout=timeout,
            max_retries=max_retries,
            retry=retry,
            poll=poll,
            rate_limit=rate_limit,
        )
        self._flows = Flows(self._settings)
        if http_client is not None and not isinstance(http_client, self._http_type):
            raise ConfigurationError(
                f"http_client must be an {self._http_type.__module__}.{self._http_type.__name__}"
            )
        if http_client is None:
            factory = self._new_http
            self._conn = Connection(factory(), owned=True, factory=factory)
        else:
            self._conn = Connection(http_client, owned=False, factory=None)
        self._agent = user_agent(self._conn.http)
        self._closed = False
        self._copy = False  # a with_options copy never closes the connection it borrows

    def _new_http(self) -> H:
        return self._http_type()

    @property
    def _http(self) -> H:
        return self._conn.http

    @property
    def _owns_http(self) -> bool:
        return self._conn.owned and not self._copy

    @property
    def base_url(self) -> str:
        """The gateway's base URL, without a trailing slash."""
        return self._settings.base_url

    @property
    def surface(self) -> str:
        """The default surface, ``"alpha"`` or ``"beta"``."""
        return self._settings.surface

    @property
    def key_fingerprint(self) -> str:
        """A fingerprint of the API key (64 hex digits): the same key gives the same one on
        every machine, and the key cannot be read back from it (PBKDF2-HMAC-SHA256, 100,000
        rounds, so each guess of a key costs that much). What tells one key's work from
        another's without keeping the key, as the batch runner's run ids do. Worked out on
        first use (a few tens of milliseconds), then kept.

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
    def rate_limit(self) -> RateLimit:
        """The request budget this client (and every ``with_options`` copy) shares."""
        return self._settings.rate_limit

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` was called on this client (or on the one it was copied from,
        when that one owns the connection)."""
        return self._closed or self._conn.http.is_closed

    def with_options(
        self: B,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
        retry: RetryPolicy | None = None,
        poll: PollPolicy | None = None,
    ) -> B:
        """A copy of this client with other settings for the calls made through it. It shares
        the HTTP connection pool and the request budget; this client is unchanged. Closing the
        copy closes only the copy.

        Example::

            task = client.with_options(timeout=120, poll=PollPolicy(initial_interval=5)).wait(sub)
        """
        settings = updated(
            self._settings, timeout=timeout, max_retries=max_retries, retry=retry, poll=poll
        )
        clone = copy.copy(self)
        clone._settings = settings
        clone._flows = Flows(
            settings,
            clock=self._flows.clock,
            wall=self._flows.wall,
            rng=random.Random(),
            budget=self._flows.budget,
        )
        clone._closed = self._closed
        clone._copy = True
        return clone

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, surface={self.surface!r})"
