"""OpenTelemetry traces and metrics (DESIGN 17), through the global tracer and meter
providers: nothing is recorded until the application configures an OpenTelemetry SDK, and
without the ``imggw[otel]`` extra (``opentelemetry-api``) nothing here does anything at all.

Each public call of a client is an :class:`Operation`: a span (``imggw.submit``, ``imggw.get``,
``imggw.wait``, ``imggw.download``, ``imggw.generate`` with its submit and wait as children),
current while the call runs, so that an application's span is its parent and httpx's own
instrumentation nests under it. The core's flows yield ``Observe`` actions (what a request's
outcome was, how long it waited for the budget, a poll, a task seen finished); the operation
counts them into the span's attributes and the metrics. Never the API key, never the prompt:
attributes are the surface, task ids, statuses and counts, and an error's class and code.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from ._core.wire import BUDGET_WAIT, PHASE, POLL, REQUEST, TASK_DONE, Observe
from ._version import __version__

try:
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # the extra is not installed: operations are the null one
    ENABLED = False
    _UNSET: tuple[type, ...] = ()
else:
    ENABLED = True
    # The providers the API hands out until an application sets its own (the meter's is not
    # public: found by name, and if it ever moves, telemetry is simply always on).
    from opentelemetry.metrics import _internal as _metrics_internal

    _proxy_meters = getattr(_metrics_internal, "_ProxyMeterProvider", None)
    _UNSET = (_trace.ProxyTracerProvider, *((_proxy_meters,) if _proxy_meters else ()))

__all__ = [
    "ENABLED",
    "NULL",
    "Operation",
    "Watch",
    "active",
    "current",
    "group",
    "line_span",
    "resumed",
]

NAME = "imggw_client"


class _Instruments:
    """The metrics (DESIGN 17), made once from the global meter provider: a proxy until the
    application sets one, which then takes them over."""

    def __init__(self) -> None:
        meter = _metrics.get_meter(NAME, __version__)
        self.requests = meter.create_counter(
            "imggw.requests",
            unit="{request}",
            description="Requests sent to the gateway, and "
            "result downloads, by kind (submit, query, download) and outcome",
        )
        self.rate_limited = meter.create_counter(
            "imggw.rate_limited",
            unit="{request}",
            description="Requests the gateway answered with a 429 (rate limited), by kind",
        )
        self.task_duration = meter.create_histogram(
            "imggw.task.duration",
            unit="s",
            description="From a task's submit to the "
            "terminal state a wait saw, by surface and status",
        )
        self.budget_wait = meter.create_histogram(
            "imggw.budget.wait",
            unit="s",
            description="Seconds one request waited for the client's request budget, by kind",
        )
        self.polls = meter.create_counter(
            "imggw.polls", unit="{query}", description="Queries sent by waits, by surface"
        )


_instruments: _Instruments | None = None


def _made() -> _Instruments:
    global _instruments
    if _instruments is None:
        _instruments = _Instruments()
    return _instruments


class _Current:
    """A span, current (the parent of what starts in it) until :meth:`end`."""

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.span = _trace.get_tracer(NAME, __version__).start_span(name, attributes=attributes)
        self._token = _context.attach(_trace.set_span_in_context(self.span))

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            _failed(self.span, error)
        _context.detach(self._token)
        self.span.end()


class Operation:
    """One public call's span, current while the call runs, and what its flow observed;
    ``generate``'s submit and wait are child spans of it, one after the other.

    A group (:func:`group`) is an operation made of the public calls run inside it: their
    spans are its children, and each one's attempts, polls, task id and status count into it
    as a flow's observations count into a call's."""

    def __init__(self, name: str, surface: str, *, grouping: bool = False) -> None:
        self.name = name
        self.surface = surface
        self.attempts = 0
        self.polls = 0
        self._own: Any = None
        self._child: _Current | None = None
        self._child_from = (0, 0)  # attempts and polls when the child began
        self._grouping = grouping
        self._outer: Operation | None = None  # the group this call runs in, if one
        self._token: contextvars.Token[Operation | None] | None = None

    def __enter__(self) -> Operation:
        self._outer = _group.get()
        self._own = _Current(self.name, {"imggw.surface": self.surface})
        if self._grouping:
            self._token = _group.set(self)
        return self

    def observe(self, seen: Observe) -> None:
        """Counts one observation into this call's span and the metrics. ``imggw.attempts``
        counts the requests the call sent, retries included (a wait's polls among them)."""
        made = _made()
        if seen.event == REQUEST:
            self.attempts += 1
            made.requests.add(1, {"kind": seen.kind, "outcome": seen.outcome})
            if seen.limited:
                made.rate_limited.add(1, {"kind": seen.kind})
        elif seen.event == BUDGET_WAIT:
            made.budget_wait.record(max(0.0, seen.value), {"kind": seen.kind})
        elif seen.event == POLL:
            self.polls += 1
            made.polls.add(1, {"surface": seen.surface})
        elif seen.event == TASK_DONE:
            if seen.value >= 0:  # a task whose submit this process did not see: not known
                made.task_duration.record(
                    seen.value, {"surface": seen.surface, "status": seen.status}
                )
        elif seen.event == PHASE:
            self._phase(seen.kind, seen.task_id)

    def _phase(self, phase: str, task_id: str) -> None:
        """``generate`` moved on: its current child span ends, the next begins."""
        attributes: dict[str, Any] = {"imggw.surface": self.surface}
        if task_id:
            attributes["imggw.task_id"] = task_id
            self._set("imggw.task_id", task_id)
        self._end_child()
        self._child = _Current(f"imggw.{phase}", attributes)
        self._child_from = (self.attempts, self.polls)

    def _set(self, name: str, value: Any) -> None:
        """An attribute of the call's span and of its current child, if one."""
        self._own.span.set_attribute(name, value)
        if self._child is not None:
            self._child.span.set_attribute(name, value)

    def _end_child(self, error: BaseException | None = None) -> None:
        if self._child is None:
            return
        attempts, polls = self._child_from
        self._child.span.set_attribute("imggw.attempts", self.attempts - attempts)
        if self._child.name == "imggw.wait":
            self._child.span.set_attribute("imggw.polls", self.polls - polls)
        self._child.end(error)
        self._child = None

    def result(self, value: object) -> None:
        """The call's result: its task id and status become the span's attributes (and its
        group's)."""
        task_id = getattr(value, "task_id", None) or getattr(value, "id", None)
        if isinstance(task_id, str):
            self._own.span.set_attribute("imggw.task_id", task_id)
        status = getattr(value, "status", None)
        if status is not None:
            self._set("imggw.status", str(getattr(status, "value", status)))
        if self._outer is not None:
            self._outer.result(value)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _group.reset(self._token)
        self._end_child(exc)
        self._own.span.set_attribute("imggw.attempts", self.attempts)
        if self.name in ("imggw.wait", "imggw.generate"):
            self._own.span.set_attribute("imggw.polls", self.polls)
        self._own.end(exc)
        if self._outer is not None:
            self._outer.attempts += self.attempts
            self._outer.polls += self.polls


# The group (an operation made of calls) that a call starting now belongs to, if one.
_group: contextvars.ContextVar[Operation | None] = contextvars.ContextVar(
    "imggw_group", default=None
)


def _failed(span: Any, exc: BaseException) -> None:
    """An error's class and public code on the span, and its status; never its message
    (which may quote what the gateway said about a prompt)."""
    code = getattr(exc, "code", None)
    span.set_attribute("error.type", type(exc).__name__)
    if isinstance(code, str):
        span.set_attribute("imggw.error.code", code)
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(exc).__name__))


class _Null:
    """The operation when telemetry is off: does nothing, as cheaply as can be."""

    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def observe(self, seen: Observe) -> None:
        return None

    def result(self, value: object) -> None:
        return None


NULL = _Null()
Watch = Operation | _Null  # what a client's driver counts a call's observations into


def active() -> bool:
    """Whether anything would be recorded: the API is installed and the application set a
    tracer or meter provider. Asked at each call (a provider is set once, at start), so a
    client without one pays next to nothing (DESIGN 17)."""
    if not ENABLED:
        return False
    if _none_set():
        return False
    return not (
        isinstance(_trace.get_tracer_provider(), _UNSET)
        and isinstance(_metrics.get_meter_provider(), _UNSET)
    )


# The API's own getters look a provider up in the environment at every call (a KeyError
# raised and caught inside ``os.environ``, twice a call); the environment names one at start
# if ever. Where the API keeps its providers is private: if it moves, the getters decide.
_FROM_ENVIRONMENT = any(
    name in os.environ for name in ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
)
_MOVED = object()


def _none_set() -> bool:
    """Whether surely no provider is set: neither global holds one, none is named by the
    environment. False when unsure."""
    return (
        not _FROM_ENVIRONMENT
        and getattr(_trace, "_TRACER_PROVIDER", _MOVED) is None
        and getattr(_metrics_internal, "_METER_PROVIDER", _MOVED) is None
    )


def group(name: str, surface: str) -> AbstractContextManager[Any]:
    """The span ``name`` of an operation made of the public calls run inside the block (the
    CLI's ``generate``: a submit, a wait, a download), or nothing when nothing records."""
    return Operation(name, surface, grouping=True) if active() else NULL


@contextlib.contextmanager
def _line(line: int) -> Iterator[None]:
    current = _Current("imggw.batch.line", {"imggw.line": line})
    try:
        yield
    except BaseException as exc:
        current.end(exc)
        raise
    current.end()


def line_span(line: int) -> AbstractContextManager[Any]:
    """The span of one batch line, parent of its client calls (nothing when telemetry is
    off)."""
    return _line(line) if active() else NULL


def current() -> object:
    """The current context, to resume in another task (a line's download, say)."""
    return _context.get_current() if ENABLED else None


@contextlib.contextmanager
def _resumed(saved: Any) -> Iterator[None]:
    token = _context.attach(saved)
    try:
        yield
    finally:
        _context.detach(token)


def resumed(saved: object) -> AbstractContextManager[Any]:
    """Runs a block in a context saved by :func:`current` (nothing when telemetry is off)."""
    return NULL if not ENABLED or saved is None else _resumed(saved)
