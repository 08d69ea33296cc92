"""When a task's result links stop working (DESIGN 12).

From the record where the gateway states it (an ``expires_at`` on a surface-B image object, or
beside the URLs in surface A's ``resultJson``: Unix seconds or ISO 8601), else from the links'
own signed expiry:

=================  =================================================================
AWS SigV4          ``X-Amz-Date`` (``20250102T030405Z``) plus ``X-Amz-Expires`` seconds
GCS V4             ``X-Goog-Date`` plus ``X-Goog-Expires`` seconds
CloudFront, SigV2  ``Expires`` (Unix seconds)
Azure SAS          ``se`` (ISO 8601 UTC)
=================  =================================================================

The earliest moment wins: once one link dies, the task's results are no longer all there.
Anything malformed or absurd (before 2000, past 9999, a lifetime over a year) counts as unknown:
this module never raises.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

__all__ = ["earliest", "from_record_value", "from_url", "stated"]

_EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(9999, 1, 1, tzinfo=timezone.utc)
_MAX_LIFETIME = 366 * 86_400  # SigV4 allows a week, GCS V4 a week; a year is already generous
_RECORD_KEYS = ("expires_at", "expiresAt", "expire_at", "expiration")
F = TypeVar("F", bound=Callable[..., Any])


def _unknown_on_error(read: F) -> F:
    """What a gateway sends is read, never trusted: a value that makes any step overflow or
    fail (a 400-digit number, a date one minute past 9999 once in UTC, a superscript digit)
    is simply unknown."""

    @functools.wraps(read)
    def guarded(*args: Any) -> Any:
        try:
            return read(*args)
        except (ArithmeticError, ValueError, TypeError):
            return None

    return guarded  # type: ignore[return-value]


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _checked(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    moment = moment.astimezone(timezone.utc)
    return moment if _EARLIEST <= moment <= _LATEST else None


def _unix(value: object) -> datetime | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > 20 or not _digits(text.replace(".", "", 1)):
            return None
        value = float(text)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if value > 1e11:  # milliseconds, as some gateways send
        value = value / 1000
    try:
        return _checked(datetime.fromtimestamp(value, tz=timezone.utc))
    except (OverflowError, OSError, ValueError):
        return None


def _iso(value: object) -> datetime | None:
    if not isinstance(value, str) or len(value) > 40:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        return _checked(datetime.fromisoformat(text))
    except ValueError:
        return None


@_unknown_on_error
def from_record_value(value: object) -> datetime | None:
    """An ``expires_at`` as a gateway states it: Unix seconds (or milliseconds), as a number or
    digits, or ISO 8601."""
    if isinstance(value, str) and not _digits(value.strip().replace(".", "", 1)):
        return _iso(value)
    return _unix(value)


def _compact(value: str) -> datetime | None:
    """``20250102T030405Z``, the basic ISO form SigV4 and GCS V4 sign with."""
    if len(value) != 16:
        return None
    try:
        return _checked(datetime.strptime(value, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return None


def _plus(start: datetime | None, seconds: str | None) -> datetime | None:
    if start is None or seconds is None or not _digits(seconds) or len(seconds) > 9:
        return None
    lifetime = int(seconds)
    return _checked(start + timedelta(seconds=lifetime)) if lifetime <= _MAX_LIFETIME else None


@_unknown_on_error
def from_url(url: str) -> datetime | None:
    """The expiry a presigned link carries in its query, or None."""
    query = {k.lower(): v for k, v in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
    for date, lifetime in (("x-amz-date", "x-amz-expires"), ("x-goog-date", "x-goog-expires")):
        if date in query or lifetime in query:
            return _plus(_compact(query.get(date, "")), query.get(lifetime))
    if "expires" in query:
        return _unix(query["expires"])
    if "se" in query and "sig" in query:  # Azure SAS: the signature names the scheme
        return _iso(query["se"])
    return None


def stated(container: object) -> list[datetime | None]:
    """Every ``expires_at`` stated in a result object and its images (None where unreadable)."""
    if not isinstance(container, Mapping):
        return []
    found = [from_record_value(container[k]) for k in _RECORD_KEYS if k in container]
    images = container.get("images")
    for image in images if isinstance(images, list) else []:
        if isinstance(image, Mapping):
            found += [from_record_value(image[k]) for k in _RECORD_KEYS if k in image]
    return found


def earliest(record_values: Iterable[datetime | None], urls: Iterable[str]) -> datetime | None:
    """The task's expiry: the earliest the record states, else the earliest its links carry."""
    stated_times = [t for t in record_values if t is not None]
    if stated_times:
        return min(stated_times)
    signed = [t for t in (from_url(u) for u in urls) if t is not None]
    return min(signed) if signed else None
