"""The reference gateway's settings: one table that MockGateway(...), ``python -m
imggw_client.mock`` and ``imggw mock serve`` all take (dashes on the command line).

Request limits are written ``N/S``: at most N requests of that kind per API key in any
S-second window (``--submit-limit 20/10 --query-limit 10/1``, as the provider behind surface A
documents).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from .._core.exceptions import ConfigurationError

FAULT_KINDS: tuple[str, ...] = (
    "lost",  # the task is created, then the connection drops: the answer never arrives
    "reset",  # the connection drops before anything is processed
    "latency",  # the answer comes late (up to `latency` s); the key is in flight meanwhile
    "429",  # rate limited, with Retry-After; nothing processed
    "500",
    "502",
    "503",
    "504",  # server errors; nothing processed
    "malformed",  # processed, but the body is garbled (results: cut short)
)
QUIRKS: tuple[str, ...] = (
    "alpha_http200",  # surface A answers every error with HTTP 200, the code only in the body
    "extra_states",  # A says `queuing`; B says `submitted` and `in_progress`
    "no_progress",  # records omit `progress`
    "beta_no_code",  # surface B error bodies omit the top-level `code`
    "no_retry_after",  # 429 answers carry no Retry-After (as the provider behind surface A)
    "no_charge",  # records state no credits nor cost (a gateway that bills elsewhere)
    "charge_at_end",  # records state a charge of 0 until the task ends (many providers do)
)
DEFAULT_API_KEY = "test-key"


def _option(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


def parse_limit(value: str | None, name: str = "limit") -> tuple[int, float] | None:
    """``"N/S"`` as ``(N, S)``: at most N requests in any S seconds; None stays None."""
    if value is None:
        return None
    count, slash, seconds = str(value).partition("/")
    try:
        limit = (int(count), float(seconds)) if slash else None
    except ValueError:
        limit = None
    if limit is None or limit[0] < 1 or not (math.isfinite(limit[1]) and limit[1] > 0):
        raise ConfigurationError(
            f"{name} must be N/S: at most N requests (a whole number >= 1) in any S seconds "
            "(a number > 0), such as 20/10"
        )
    return limit


@dataclass(frozen=True, kw_only=True)
class MockConfig:
    """Settings of a :class:`MockGateway`; every field is also a command-line option.

    Example::

        MockConfig(duration_min=0.1, duration_max=0.5, fault_rate=0.3, faults=("lost", "503"))
    """

    api_keys: tuple[str, ...] = _option((DEFAULT_API_KEY,), "accepted API key (repeatable)")
    seed: int = _option(0, "seed of every random choice (durations, failures, faults)")
    duration_min: float = _option(1.0, "shortest task duration, seconds")
    duration_max: float = _option(5.0, "longest task duration, seconds")
    failure_rate: float = _option(0.0, "share of tasks that end failed, 0..1")
    fault_rate: float = _option(0.0, "share of requests that meet a fault, 0..1")
    faults: tuple[str, ...] = _option(FAULT_KINDS, "fault kinds to draw from", choices=FAULT_KINDS)
    quirks: tuple[str, ...] = _option((), "provider quirks to imitate", choices=QUIRKS)
    retention: float = _option(86_400.0, "seconds a result file is kept after completion")
    link_ttl: float | None = _option(
        None,
        "seconds a result link handed out by a query stays valid (never past the retention) "
        "[the retention]",
        type=float,
    )
    manual_clock: bool = _option(False, "time moves only by POST /_mock/advance?seconds=N")
    latency: float = _option(0.5, "longest delay of the latency fault, seconds")
    retry_after: int = _option(1, "Retry-After of injected 429s, seconds")
    idempotency_ttl: float = _option(86_400.0, "seconds an idempotency key is remembered")
    image_size: int = _option(64, "long side of result PNGs, pixels")
    first_task_id: int = _option(1, "id of the first task; ids count up from it")
    result_size: int = _option(0, "pad result PNGs to at least this many bytes (benchmarks)")
    submit_limit: str | None = _option(
        None,
        "at most N submits per API key in any S seconds, both surfaces: N/S [no limit]",
        type=str,
    )
    query_limit: str | None = _option(
        None,
        "at most N queries per API key in any S seconds, both surfaces: N/S [no limit]",
        type=str,
    )
    credits: float | None = _option(
        None,
        "every API key's balance of credits; a submit it cannot cover answers 402 "
        "insufficient_credits and creates nothing (tasks cost 4, 8, 16 credits at 1k, 2k, "
        "4k) [no limit]",
        type=float,
    )
    request_timeout: float = _option(
        10.0, "seconds a client has to send a whole request over a socket before it is cut off"
    )

    def __post_init__(self) -> None:
        keys = tuple(self.api_keys)
        object.__setattr__(self, "api_keys", keys)
        object.__setattr__(self, "faults", tuple(self.faults))
        object.__setattr__(self, "quirks", tuple(self.quirks))
        checks = [
            (
                bool(keys) and all(isinstance(k, str) and k.strip() == k and k for k in keys),
                "api_keys must be non-empty strings without surrounding spaces",
            ),
            (
                0 <= self.duration_min <= self.duration_max and math.isfinite(self.duration_max),
                f"need 0 <= duration_min ({self.duration_min:g}) <= duration_max "
                f"({self.duration_max:g}); set both",
            ),
            (0 <= self.failure_rate <= 1, "failure_rate must be within 0..1"),
            (0 <= self.fault_rate <= 1, "fault_rate must be within 0..1"),
            (
                bool(self.faults) and set(self.faults) <= set(FAULT_KINDS),
                f"faults must be some of {', '.join(FAULT_KINDS)}",
            ),
            (set(self.quirks) <= set(QUIRKS), f"quirks must be some of {', '.join(QUIRKS)}"),
            (0 <= self.retention < math.inf, "retention must be a finite number >= 0"),
            (self.link_ttl is None or self.link_ttl > 0, "link_ttl must be > 0 seconds"),
            (
                math.isfinite(self.request_timeout) and self.request_timeout > 0,
                "request_timeout must be > 0 seconds",
            ),
            (self.latency >= 0, "latency must be >= 0"),
            (self.retry_after >= 0, "retry_after must be >= 0"),
            (self.idempotency_ttl >= 0, "idempotency_ttl must be >= 0"),
            (1 <= self.image_size <= 8192, "image_size must be within 1..8192"),
            (self.first_task_id >= 1, "first_task_id must be >= 1"),
            (0 <= self.result_size < 2**31, "result_size must be within 0..2**31-1"),
            (
                self.credits is None or (math.isfinite(self.credits) and self.credits >= 0),
                "credits must be a number >= 0, or None for no limit",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigurationError(message)
        parse_limit(self.submit_limit, "submit_limit")
        parse_limit(self.query_limit, "query_limit")


def options() -> list[tuple[str, Any, dict[str, Any]]]:
    """``(name, default, metadata)`` for every setting, for command-line front ends."""
    return [(f.name, f.default, dict(f.metadata)) for f in fields(MockConfig)]
