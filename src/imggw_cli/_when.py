"""Times for people: spans of time, when result links expire, and moments for ``--json``."""

from __future__ import annotations

from datetime import datetime, timezone


def span(seconds: float) -> str:
    """A span in its two largest units, rounded down: ``45 s``, ``12 min``, ``23 h 59 min``,
    ``3 d 4 h``. Rounding down never promises more time than there is."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _utc(moment: datetime) -> datetime:
    # The SDK hands out aware UTC datetimes; a naive one is read as UTC rather than local time.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with a ``Z``: ``2025-06-02T12:00:00Z``."""
    return _utc(moment).isoformat().replace("+00:00", "Z")


def until(moment: datetime, now: datetime | None = None) -> str:
    """``in 23 h 59 min`` or ``5 min ago``."""
    left = (_utc(moment) - (now or datetime.now(timezone.utc))).total_seconds()
    return f"in {span(left)}" if left > 0 else f"{span(-left)} ago"


def links_expire(moment: datetime, now: datetime | None = None) -> str:
    """``links expire in 23 h 59 min (2025-06-02T12:00:00Z)``, or ``links expired 5 min ago
    (...)`` once the moment has passed."""
    phrase = until(moment, now)
    verb = "expired" if phrase.endswith(" ago") else "expire"
    return f"links {verb} {phrase} ({iso_utc(moment)})"
