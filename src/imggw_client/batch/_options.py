"""The options of a batch run, checked once and passed whole: one object from the entry point
(``run_batch``, ``collect_tasks``, ``run_shard``, ``run_sharded``, the CLI) down to the run
(``_execute``).

``RunOptions`` types the keywords the entry points take (``run_batch(..., concurrency=16)``);
:class:`BatchOptions` is what they become. Both list the same names (a test holds them
together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, TypedDict

from .._core.config import check_surface
from .._core.exceptions import RequestValidationError
from ._input import FORMATS
from ._naming import DEFAULT_NAME, NameTemplate

__all__ = ["LINE_TIMEOUT", "BatchOptions", "Caps", "RunOptions"]

LINE_TIMEOUT = 1800.0  # seconds a run waits on one line's task before leaving it for the next


@dataclass(frozen=True)
class Caps:
    """The limits of a run: spend caps (None: none) and the most failed lines."""

    max_credits: float | None = None
    max_cost: float | None = None
    max_failures: int | None = None

    @property
    def spend(self) -> bool:
        return self.max_credits is not None or self.max_cost is not None


class RunOptions(TypedDict, total=False):
    """The keywords of a run (see :class:`BatchOptions` for each one's meaning)."""

    concurrency: int
    timeout: float | None
    surface: str | None
    skip_bad_lines: bool
    allow_changes: bool
    wait: bool
    verify: bool
    gallery: bool
    format: str | None
    new_run: bool
    max_credits: float | None
    max_cost: float | None
    max_failures: int | None
    line_timeout: float | None
    name: str


@dataclass(frozen=True, kw_only=True)
class BatchOptions:
    """How a batch runs.

    - ``concurrency``: submits (and downloads) at once.
    - ``timeout``: seconds the run may take (None: no limit); what is left unfinished is
      resumed by the next run on the same folder.
    - ``surface``: the surface lines run on (default: the client's).
    - ``skip_bad_lines``: report bad input lines and go on (default: refuse the input).
    - ``allow_changes``: run lines new or changed since the folder's run began, as new
      (billed) requests (default: refuse the input).
    - ``wait``: wait for unfinished tasks (``False``: ask each once and report those still
      running, as ``collect_tasks(..., wait=False)`` and ``download --from`` without ``--wait``).
    - ``verify``: check every saved file's sha256 on resume (default: its size).
    - ``gallery``: write ``index.html`` as lines finish and at the end.
    - ``format``: ``"jsonl"``, ``"csv"`` (a header row naming the columns, then a record a
      row) or ``"text"`` (a prompt a line): how a file is read whatever its name says.
    - ``new_run``: a random run id for a folder with no run (new keys, new tasks).
    - ``max_credits``, ``max_cost``: what the folder's run may be charged in all, across reruns
      (and shards: see ``run_shard``); a run that reaches a cap stops submitting, finishes what
      it sent, and ends with ``stopped_by`` (exit 6). ``max_failures``: stop submitting once
      this many lines failed in this run.
    - ``line_timeout``: seconds this run waits on one line's task (default 1800; None: no
      limit). A task still running then is left ``running``, with its key, for the next run;
      the run ends (exit 3) once every other line is final, so that no run (and no lock on
      its folder) lasts forever. Retries of a line's submit or download stop as soon, too.
    - ``name``: the result files' names, a template of the plain fields ``{task_id}``,
      ``{index}``, ``{line}`` (the input line's number) and ``{id}`` (the line's ``id``), with
      no format spec or conversion; default ``{task_id}-{index}``. Made safe for any
      filesystem, at most 255 bytes; lines whose files would share a name are refused before
      anything is sent; a name the folder cannot take once the result is paid for leaves the
      file its default name (the manifest row's ``warning`` says so). The extension comes from
      the content.

    Example::

        options = BatchOptions(concurrency=16, timeout=3600, name="{line}-{id}")
        run_batch("prompts.jsonl", "out/", **options.as_keywords())
    """

    concurrency: int = 8
    timeout: float | None = None
    surface: str | None = None
    skip_bad_lines: bool = False
    allow_changes: bool = False
    wait: bool = True
    verify: bool = False
    gallery: bool = True
    format: str | None = None
    new_run: bool = False
    max_credits: float | None = None
    max_cost: float | None = None
    max_failures: int | None = None
    line_timeout: float | None = LINE_TIMEOUT
    name: str = DEFAULT_NAME

    def __post_init__(self) -> None:
        concurrency = self.concurrency
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise RequestValidationError(
                "concurrency", "must be an integer >= 1", code="invalid_concurrency"
            )
        timeout = self.timeout
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise RequestValidationError(
                "timeout",
                "must be a finite number of seconds >= 0, or None for no limit",
                code="invalid_option",
            )
        if self.surface is not None:
            check_surface(self.surface)
        if self.format is not None and self.format not in FORMATS:
            raise RequestValidationError(
                "format", f"must be one of {', '.join(FORMATS)}, or None", code="invalid_option"
            )
        if self.line_timeout is not None and not _positive(self.line_timeout):
            raise RequestValidationError(
                "line_timeout",
                "must be a finite number of seconds > 0, or None for no limit",
                code="invalid_option",
            )
        for name in ("max_credits", "max_cost"):
            cap = getattr(self, name)
            if cap is not None and not _positive(cap):
                raise RequestValidationError(
                    name, "must be a number > 0, or None for no cap", code="invalid_option"
                )
        failures = self.max_failures
        if failures is not None and (
            isinstance(failures, bool) or not isinstance(failures, int) or failures < 1
        ):
            raise RequestValidationError(
                "max_failures",
                "must be an integer >= 1, or None for no limit",
                code="invalid_option",
            )
        NameTemplate.parse(self.name)
        for name in ("skip_bad_lines", "allow_changes", "wait", "verify", "gallery", "new_run"):
            if not isinstance(getattr(self, name), bool):
                raise RequestValidationError(name, "must be True or False", code="invalid_option")

    @classmethod
    def of(cls, options: RunOptions | dict[str, Any]) -> BatchOptions:
        """The options the keywords name; an unknown keyword is one clear error.

        Example::

            BatchOptions.of({"concurrency": 4})
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            names = ", ".join(sorted(known))
            raise RequestValidationError(
                unknown[0],
                f"is not an option of a batch run (they are: {names})",
                code="invalid_option",
            )
        return cls(**options)

    @property
    def caps(self) -> Caps:
        """The run's guards (spend caps, failures)."""
        return Caps(self.max_credits, self.max_cost, self.max_failures)

    @property
    def template(self) -> NameTemplate:
        """The result files' name template, checked."""
        return NameTemplate.parse(self.name)

    @property
    def seconds(self) -> float:
        """The run's time budget: ``timeout``, or no end."""
        return math.inf if self.timeout is None else float(self.timeout)

    def as_keywords(self) -> dict[str, Any]:
        """The options as the entry points' keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _positive(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
