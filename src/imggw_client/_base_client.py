"""What Client and AsyncClient share: settings, the core flows, and ownership of the httpx
client. The drivers add only how actions are performed (blocking or awaited)."""

from __future__ import annotations

from typing import Generic, TypeVar

import httpx

from ._config import PollPolicy, RateLimit, RetryPolicy, Settings, resolve_settings
from ._core.flows import Flows
from ._exceptions import ConfigurationError
from ._transport import user_agent

H = TypeVar("H", httpx.Client, httpx.AsyncClient)

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_WAIT_TIMEOUT = 600.0
DEFAULT_DOWNLOAD_CONCURRENCY = 4
DEFAULT_POLL = PollPolicy()


class BaseClient(Generic[H]):
    _http_type: type[H]

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
        self._owns_http = http_client is None
        self._http: H = http_client if http_client is not None else self._http_type()
        self._agent = user_agent(self._http)

    @property
    def base_url(self) -> str:
        """The gateway's base URL, without a trailing slash."""
        return self._settings.base_url

    @property
    def surface(self) -> str:
        """The default surface, ``"alpha"`` or ``"beta"``."""
        return self._settings.surface

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, surface={self.surface!r})"
