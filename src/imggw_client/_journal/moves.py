"""An event's move on a journal's rows (DESIGN 19, 22): which rows an event is about, what the
one table (``_core/states.py``) makes of them, and the columns it sets. A submit's row is made
before its request leaves, with the call that made it; a refusal, or a request that surely
never left, removes that call's row only (an earlier row of the same key may hold a paid
task); a key journaled for another request is refused before anything is sent.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from .._core import reasons, states
from .._core.exceptions import IdempotencyConflictError
from .._core.models import Task
from .._core.states import State
from .._core.text import printable
from .schema import Scope

__all__ = ["Memo", "apply", "event_of", "named", "seen_values"]

# What a write leaves in one task's row, for the journal's memo: its key, state, expiry, charge.
Memo = tuple[tuple[str, str, str, str], State | None, Any, Any]
_KINDS: dict[type, states.Event] = {
    states.Accepted: states.Event.PENDING,
    states.Refused: states.Event.REFUSED,
    states.NotSent: states.Event.NOT_SENT,
    states.Saved: states.Event.SAVED,
    states.Expired: states.Event.EXPIRED,
    states.NotFound: states.Event.NOT_FOUND,
}


def apply(
    db: sqlite3.Connection, event: object, scope: Scope, lease: tuple[str, float], path: Path
) -> Memo | None:
    """Runs ``event``'s move on its rows (``db`` in a transaction); returns what its one row
    holds after it (for the memo; its state None when the row went, or when the event found no
    row or several). A submit's row is held by ``lease`` (owner, expiry); ``path`` names the
    journal in an error."""
    base = (scope.gateway, scope.key_fingerprint)
    now = time.time()
    if isinstance(event, states.Sending):
        _send(db, event, base, now, lease, path)
        return None
    surface: str
    task_id: str | None
    if isinstance(event, (states.Refused, states.NotSent)):
        # Only the row this submit call made: an earlier one may hold a paid task.
        surface, key, task_id = event.surface, event.key, None
        which, args = "idempotency_key = ? AND attempt = ?", [key, event.attempt]
    elif isinstance(event, states.Accepted):
        sub = event.submission
        surface, key, task_id = sub.surface, sub.idempotency_key, sub.task_id
        which, args = "idempotency_key = ?", [key]
    elif isinstance(event, states.Seen):
        surface, task_id = event.task.surface, event.task.id
        which, args = "task_id = ?", [task_id]
    else:
        assert isinstance(event, (states.Saved, states.Expired, states.NotFound)), event
        surface, task_id = event.surface, event.task_id
        which, args = "task_id = ?", [task_id]
    happened = event_of(event)
    found = db.execute(
        "SELECT row, state, expires_at, charge FROM tasks WHERE gateway = ? AND key_fp = ? AND"
        f" surface = ? AND {which}",
        (*base, surface, *args),
    ).fetchall()
    after: tuple[State, Any, Any] | None = None
    for row, stored, expires, charge in found:
        try:
            state = State(stored)
        except (ValueError, TypeError):  # a damaged row: left as it is, reported when read
            continue
        target = states.move(state, happened)
        if target is None:
            db.execute("DELETE FROM tasks WHERE row = ?", (row,))
            continue
        changes = {**_changes(event, target), "changed": now}
        sets = ", ".join(f"{name} = ?" for name in changes)
        db.execute(f"UPDATE tasks SET {sets} WHERE row = ?", (*changes.values(), row))
        after = (target, changes.get("expires_at", expires), changes.get("charge", charge))
    if task_id is None:
        return None
    known = after if len(found) == 1 and after is not None else (None, None, None)
    return ((*base, surface, task_id), *known)


def _send(
    db: sqlite3.Connection,
    event: states.Sending,
    base: tuple[str, str],
    now: float,
    lease: tuple[str, float],
    path: Path,
) -> None:
    """A submit about to leave: its row made (``created`` is its first send, which a resend
    keeps) and held by this process; a key journaled for another request is refused."""
    request = event.request
    asked = (request.prompt, request.aspect_ratio, request.resolution)
    # Whether the row was made, from the connection's count of changes: a cursor's rowcount is
    # -1 for an INSERT where the C library's tolower() is a Turkish locale's ("I" is not "i").
    before = db.total_changes
    db.execute(
        "INSERT INTO tasks (gateway, key_fp, surface, idempotency_key, state, prompt,"
        " aspect_ratio, resolution, created, attempt, changed, lease_owner, lease_until)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
        (
            *base,
            event.surface,
            event.key,
            State.UNKNOWN.value,
            *asked,
            now,
            event.attempt,
            now,
            *lease,
        ),
    )
    if db.total_changes != before:
        return
    row, *journaled = db.execute(
        "SELECT row, prompt, aspect_ratio, resolution FROM tasks WHERE gateway = ? AND"
        " key_fp = ? AND surface = ? AND idempotency_key = ?",
        (*base, event.surface, event.key),
    ).fetchone()
    if tuple(journaled) != asked:
        raise IdempotencyConflictError(
            f"the idempotency key {printable(event.key, 80)!r} is in the journal {path} for "
            "another request (its prompt, aspect ratio or resolution differ): nothing was "
            "sent. A new request needs a new key (leave idempotency_key out); the same request "
            "with this key gets its task back",
            code=reasons.IDEMPOTENCY_KEY_REUSED.code,
            surface=event.surface,
        )
    db.execute("UPDATE tasks SET lease_owner = ?, lease_until = ? WHERE row = ?", (*lease, row))


def event_of(event: object) -> states.Event:
    """The table's event for what a flow (or a driver) reports."""
    if isinstance(event, states.Seen):
        return states.event_of(event.task.status)
    return _KINDS[type(event)]


def named(event: object) -> str:
    """What an event is about, as a warning names it: its key, else its task."""
    if isinstance(event, states.Accepted):
        return f"idempotency key {printable(event.submission.idempotency_key, 80)}"
    if isinstance(event, (states.Sending, states.Refused, states.NotSent)):
        return f"idempotency key {printable(event.key, 80)}"
    if isinstance(event, states.Seen):
        return f"task {printable(event.task.id, 80)}"
    return f"task {printable(getattr(event, 'task_id', '?'), 80)}"


def _changes(event: object, target: State) -> dict[str, Any]:
    """The columns ``event`` sets on a row that moves to ``target``."""
    changes: dict[str, Any] = {"state": target.value}
    if isinstance(event, states.Accepted):
        changes["task_id"] = event.submission.task_id
        if event.submission.submitted_at is not None:
            changes["submitted_at"] = event.submission.submitted_at.timestamp()
    elif isinstance(event, states.Seen):
        expires, charge = seen_values(event.task)
        if expires is not None:
            changes["expires_at"] = expires
        if charge is not None:
            changes["charge"] = charge
        for stated in ("credits", "cost"):  # each as a batch line keeps it, beside the charge
            value = getattr(event.task, stated)
            if value is not None and math.isfinite(value):
                changes[stated] = float(value)
    elif isinstance(event, states.Saved) and target is State.SAVED:
        changes["files"] = json.dumps([os.fspath(path) for path in event.files])
    return changes


def seen_values(task: Task) -> tuple[float | None, float | None]:
    """The link expiry and charge an answer gives (as stored), each None when it gives none."""
    expires = None if task.expires_at is None else task.expires_at.timestamp()
    charge = task.credits if task.credits is not None else task.cost
    if charge is None or not math.isfinite(charge):
        return expires, None
    return expires, float(charge)
