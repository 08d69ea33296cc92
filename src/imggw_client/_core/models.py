"""The public data models: what a user sends, and what the gateway's answers become."""

from __future__ import annotations

import weakref
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from . import rules
from .errors import RequestValidationError
from .rules import AspectRatio, Resolution
from .spec import Surface
from .text import KNOWN_KEYS, LONG_SECRET, blank, link_for_display

__all__ = [
    "DownloadedFile",
    "ImageRequest",
    "Submission",
    "Surface",
    "Task",
    "TaskError",
    "TaskStatus",
]


# What the repr of a task (or a saved file) whose links hold its client's key shows of them, by
# the object's id while it lives: kept for those alone, so that no other model pays for it.
_SHOWN: dict[int, tuple[str, ...]] = {}


def blank_when_shown(model: BaseModel, urls: list[str], secrets: tuple[str, ...]) -> None:
    """Has ``model``'s repr show ``urls`` (its links) with ``secrets`` (the key of the client
    that read them) of 8 characters or more blanked, for as long as it lives, when one of them
    holds one. Worked out where the key is at hand: by the time a task is shown its client may
    be closed, and its key no longer watched process-wide (``KNOWN_KEYS``)."""
    long = tuple(secret for secret in secrets if len(secret) >= LONG_SECRET)
    if any(secret in url for url in urls for secret in long):
        _SHOWN[id(model)] = tuple(blank(link_for_display(url), long) for url in urls)
        weakref.finalize(model, _SHOWN.pop, id(model), None)


def raise_violations(violations: list[rules.Violation]) -> None:
    """Raises the first violation as a RequestValidationError that lists them all."""
    if violations:
        first = violations[0]
        raise RequestValidationError(
            first.field,
            first.rule,
            code=first.code,
            errors=[(v.field, v.rule) for v in violations],
        )


class ImageRequest(BaseModel):
    """One text-to-image request, validated against every rule of the gateway contract.

    ``resolution`` is accepted in either case and stored lower case (``1k``, ``2k``, ``4k``);
    each surface's wire form is produced when the request is sent. An invalid request raises
    :class:`RequestValidationError` naming the field, before anything is sent.

    Example::

        req = ImageRequest("a red fox in snow", aspect_ratio="16:9", resolution="2K")
        assert req.resolution == "2k"
    """

    model_config = ConfigDict(frozen=True)

    prompt: str
    aspect_ratio: str = "auto"
    resolution: str = "1k"

    def __init__(
        self, prompt: str, aspect_ratio: AspectRatio = "auto", resolution: Resolution = "1k"
    ) -> None:
        raise_violations(rules.check_request(prompt, aspect_ratio, resolution))
        super().__init__(prompt=prompt, aspect_ratio=aspect_ratio, resolution=resolution.lower())

    @classmethod
    def unchecked(cls, prompt: str, aspect_ratio: str, resolution: str) -> ImageRequest:
        """Builds a request without validation (``submit(..., validate=False)``).

        Example::

            req = ImageRequest.unchecked("a cat", "7:5", "8k")   # the gateway will judge it
        """
        # The gateway judges the values; they must still be text to be sent at all.
        for field, value in (
            ("prompt", prompt),
            ("aspect_ratio", aspect_ratio),
            ("resolution", resolution),
        ):
            if not isinstance(value, str):
                raise RequestValidationError(field, "must be a string")
        return cls.model_construct(prompt=prompt, aspect_ratio=aspect_ratio, resolution=resolution)

    def __repr__(self) -> str:
        # Prompts can be long or private: the repr names only the size.
        return (
            f"ImageRequest(prompt=<{len(self.prompt)} chars>, "
            f"aspect_ratio={self.aspect_ratio!r}, resolution={self.resolution!r})"
        )

    __str__ = __repr__


def _stored_request(value: Any) -> Any:
    """A request read back from JSON (or a dict) as it was sent: not judged again, since a
    submit with ``validate=False`` sent one the rules refuse, and its record must still read."""
    if isinstance(value, dict):
        fields = ("prompt", "aspect_ratio", "resolution")
        return ImageRequest.unchecked(*(value.get(name) for name in fields))  # type: ignore[arg-type]
    return value


class Submission(BaseModel):
    """What a submit returns: the task id, the idempotency key that created it, the surface.

    ``replayed`` is True when the gateway answered from its idempotency record (the task already
    existed and nothing new was billed). ``resolution`` is the one requested, and
    ``submitted_at`` (an aware UTC ``datetime``) when the gateway's answer created the task;
    None for a replayed task, whose start is not known. A wait on a submission polls by what
    the client learned of such tasks (:class:`PollPolicy`), also in another process: a
    submission saved as JSON and read back keeps both. ``request`` is the
    :class:`ImageRequest` it was made from (set by ``submit``, ``generate`` and
    ``unfinished``; None when not known), so that a task recovered after a restart maps back
    to what was asked; the task a wait on it returns carries it too. Its prompt is in the JSON
    (``model_dump_json(exclude={"request"})`` leaves it out), never in the repr.

    Example::

        sub = client.submit("a lighthouse")
        saved = sub.model_dump_json()
        task = client.wait(Submission.model_validate_json(saved))
        assert task.request == sub.request
    """

    model_config = ConfigDict(frozen=True)

    task_id: str
    idempotency_key: str
    surface: Surface
    replayed: bool = False
    resolution: str | None = None
    submitted_at: datetime | None = None
    request: ImageRequest | None = None
    # When the submit returned (monotonic seconds): a wait right after it need not ask at once.
    _accepted_at: float | None = PrivateAttr(default=None)

    _read_request = field_validator("request", mode="before")(_stored_request)

    def __getstate__(self) -> dict[Any, Any]:
        # A monotonic time means nothing in another process (a pickled error's submission, a
        # worker's result): there a wait goes by ``submitted_at``, as from JSON.
        state: dict[Any, Any] = super().__getstate__()
        private = state.get("__pydantic_private__")
        if private:
            state["__pydantic_private__"] = {**private, "_accepted_at": None}
        return state


class StrEnum(str, Enum):
    """A str Enum that prints and formats as its value on every Python, as 3.11's
    ``enum.StrEnum`` does (3.12 made a str Enum's ``format()`` its name): the base of every
    state users print.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class TaskStatus(StrEnum):
    """The normalised task status, the same on both surfaces.

    A status prints and formats as its value, as the string it also is.

    Example::

        if task.status is TaskStatus.SUCCEEDED: ...
        print(f"task {task.id}: {task.status}")     # task 42: succeeded
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class TaskError(BaseModel):
    """The public error of a failed task: a stable ``code`` and a safe ``message``.

    Example::

        if task.error: print(task.error.code)
    """

    model_config = ConfigDict(frozen=True)

    code: str
    message: str


class Task(BaseModel):
    """A task as last seen, normalised across surfaces.

    ``raw`` keeps the record exactly as received (left out of the repr; empty on the task an
    error carries, ``TaskFailedError.task`` or ``WaitTimeoutError.last_task``, as the record may
    echo the API key); every other field is decoded leniently and, for ``error``, made safe to
    show. ``expires_at`` (an aware UTC
    ``datetime``, or None when nothing tells) is the earliest moment one of the result links is
    known to stop working: from the record where the gateway states it, else from the links'
    own signed expiry.

    ``request`` and ``idempotency_key`` are what the task was made from, when the call that
    returned it knew them (a wait on a :class:`Submission`, ``generate``, ``as_completed`` on
    ``unfinished()``); None after a bare ``get(task_id)``.

    A task is hashable (a set of tasks, a dict keyed by task): by its surface, id, status and
    progress, so equal tasks hash alike.

    Example::

        task = client.get(sub.task_id)
        if task.is_terminal and task.status is TaskStatus.SUCCEEDED:
            print(task.image_urls)
        seen = {task}                                   # hashable, as frozen
    """

    model_config = ConfigDict(frozen=True)

    id: str
    surface: Surface
    status: TaskStatus
    progress: int | None = None
    image_urls: list[str] = Field(default_factory=list)
    cost: float | None = None
    credits: float | None = None
    error: TaskError | None = None
    expires_at: datetime | None = None
    raw: dict[str, Any] = Field(default_factory=dict, repr=False)
    request: ImageRequest | None = None
    idempotency_key: str | None = None

    _read_request = field_validator("request", mode="before")(_stored_request)

    @property
    def is_terminal(self) -> bool:
        """True once the task succeeded or failed: its record will not change again."""
        return self.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED)

    def __hash__(self) -> int:
        # Frozen, but its lists and dict cannot be hashed: the fields that tell one sighting of
        # a task from another. Equal tasks have these equal, so they hash alike.
        return hash((self.surface, self.id, self.status, self.progress))

    def __repr_args__(self) -> Any:
        # repr and str show links without query or userinfo, and with every live client's key
        # blanked: a gateway may put a key there (or in a path, or a host name).
        for name, value in super().__repr_args__():
            if name == "image_urls" and isinstance(value, list):
                shown = _SHOWN.get(id(self)) or map(link_for_display, value)
                value = [KNOWN_KEYS.blank(url) for url in shown]
            yield name, value


class DownloadedFile(BaseModel):
    """A result saved to disk, verified while streaming.

    Example::

        for f in client.download(task, "out/"):
            print(f.path, f.size, f.sha256)
    """

    model_config = ConfigDict(frozen=True)

    path: Path
    url: str
    sha256: str
    size: int

    def __repr_args__(self) -> Any:
        # As Task's: the link without its query, userinfo or key; ``url`` itself is unchanged.
        for name, value in super().__repr_args__():
            if name == "url":
                value = KNOWN_KEYS.blank(_SHOWN.get(id(self), (link_for_display(value),))[0])
            yield name, value
