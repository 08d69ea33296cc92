"""Options that every command takes, before or after its name (``imggw --json status 1`` and
``imggw status 1 --json``): declared once, added to each command's signature."""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])


class SurfaceChoice(str, Enum):
    alpha = "alpha"
    beta = "beta"


@dataclass
class Globals:
    base_url: str | None = None
    surface: str | None = None
    json: bool = False
    quiet: bool = False
    verbose: bool = False
    mock: bool = False

    @property
    def chosen_surface(self) -> str:
        return self.surface or "beta"


def _keyword(
    name: str, annotation: Any, default: Any = inspect.Parameter.empty
) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)  # fmt: skip


_CONTEXT = _keyword("g_ctx", typer.Context)
_OPTIONS = [
    _keyword(
        "g_base_url",
        Annotated[
            str | None,
            typer.Option(
                "--base-url", envvar="IMGGW_BASE_URL", help="Gateway base URL [env: IMGGW_BASE_URL]"
            ),
        ],
        None,
    ),
    _keyword(
        "g_surface",
        Annotated[
            SurfaceChoice | None, typer.Option("--surface", help="Wire surface [default: beta]")
        ],
        None,
    ),
    _keyword(
        "g_json",
        Annotated[bool, typer.Option("--json", help="One JSON object per result on stdout")],
        False,
    ),
    _keyword(
        "g_quiet",
        Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr")],
        False,
    ),
    _keyword(
        "g_verbose",
        Annotated[
            bool, typer.Option("--verbose", "-v", help="Debug logs and tracebacks on stderr")
        ],
        False,
    ),
    _keyword(
        "g_mock",
        Annotated[
            bool,
            typer.Option("--mock", help="Use an in-process reference gateway: no key, no network"),
        ],
        False,
    ),
]
_current: contextvars.ContextVar[Globals] = contextvars.ContextVar("imggw_globals")


def with_globals(command: F) -> F:
    """Adds the global options to ``command``; their values are then ``current()``."""
    signature = inspect.signature(command)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        root = kwargs.pop(_CONTEXT.name).find_root()
        if not isinstance(root.obj, Globals):
            root.obj = Globals()
        chosen: Globals = root.obj
        for param in _OPTIONS:
            value = kwargs.pop(param.name)
            if value not in (None, False):  # given here: wins over the same option given before
                setattr(chosen, param.name.removeprefix("g_"), getattr(value, "value", value))
        _current.set(chosen)
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), _CONTEXT, *_OPTIONS]
    )
    wrapper.__annotations__ = {
        **command.__annotations__,
        **{p.name: p.annotation for p in (_CONTEXT, *_OPTIONS)},
    }
    return wrapper  # type: ignore[return-value]


def current() -> Globals:
    """The global options of the command being run."""
    return _current.get()
