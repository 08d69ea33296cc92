"""Options that every command takes, before or after its name (``imggw --json status 1`` and
``imggw status 1 --json``): declared once, added to each command's signature.

Both the root and the command declare each option, so a value may arrive twice: which one wins
is decided by where it came from (Click's parameter source), never by the order the two
callbacks run in. A value typed on the command line beats one from the environment wherever it
was typed, and one typed after the command name beats one typed before it.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from . import _output

if TYPE_CHECKING:
    from imggw_client import RateLimit

F = TypeVar("F", bound=Callable[..., Any])


class SurfaceChoice(str, Enum):
    alpha = "alpha"
    beta = "beta"


DEFAULT_SURFACE = SurfaceChoice.beta.value


@dataclass
class Globals:
    base_url: str | None = None
    surface: str | None = None
    json: bool = False
    quiet: bool = False
    verbose: bool = False
    mock: bool = False
    rate: float | None = None
    query_rate: float | None = None
    rate_store: str | None = None
    log_format: str = "text"
    no_journal: bool = False
    # Where each value came from (see _STRENGTH), so that a weaker source never replaces it.
    sources: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def chosen_surface(self) -> str:
        return self.surface or DEFAULT_SURFACE

    def typed(self, name: str) -> bool:
        """Whether option ``name`` was typed on the command line (not taken from the
        environment, nor a default)."""
        return self.sources.get(name, 0) >= _STRENGTH["COMMANDLINE"]

    @property
    def rate_limit(self) -> RateLimit | None:
        """The request budget of --rate / --query-rate / --rate-store, or None when none of
        them was given."""
        if self.rate is None and self.query_rate is None and self.rate_store is None:
            return None
        from imggw_client import RateLimit

        return RateLimit(
            submits_per_second=self.rate, queries_per_second=self.query_rate, store=self.rate_store
        )


# Click's ParameterSource, by name: Typer vendors its own Click, so the enum is not importable
# from one stable place. Typed on the command line > environment > a default.
_STRENGTH = {"COMMANDLINE": 3, "PROMPT": 3, "ENVIRONMENT": 2, "DEFAULT_MAP": 1, "DEFAULT": 0}


def _keyword(
    name: str, annotation: Any, default: Any = inspect.Parameter.empty
) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def _rate_option(flag: str, help_text: str) -> Any:
    # Taken as text and checked by _per_second, so that every bad value gets the same one line
    # (Click's own "not a valid float" comes with a usage block).
    return Annotated[str | None, typer.Option(flag, metavar="N", help=help_text)]


_CONTEXT = _keyword("g_ctx", typer.Context)
_OPTIONS = [
    _keyword(
        "g_base_url",
        Annotated[
            str | None, typer.Option("--base-url", envvar="IMGGW_BASE_URL", help="Gateway base URL")
        ],
        None,
    ),
    _keyword(
        "g_surface",
        Annotated[
            SurfaceChoice | None,
            # Either case (as -r 2K), typed or from IMGGW_SURFACE: both pass this one check.
            typer.Option(
                "--surface",
                envvar="IMGGW_SURFACE",
                case_sensitive=False,
                help="Wire surface [default: beta]",
            ),
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
    _keyword(
        "g_rate", _rate_option("--rate", "At most N submits per second [default: no cap]"), None
    ),
    _keyword(
        "g_query_rate",
        _rate_option("--query-rate", "At most N task queries per second [default: no cap]"),
        None,
    ),
    _keyword(
        "g_rate_store",
        Annotated[
            str | None,
            typer.Option(
                "--rate-store",
                envvar="IMGGW_RATE_STORE",
                metavar="URL",
                help="Share the request budget with every process on this key through a Redis "
                "store (redis://HOST:PORT/DB; needs imggw[redis])",
            ),
        ],
        None,
    ),
    _keyword(
        "g_no_journal",
        Annotated[
            bool,
            typer.Option(
                "--no-journal",
                help="Keep no record of submitted tasks (default: a journal in the XDG state "
                "folder, or IMGGW_JOURNAL; IMGGW_JOURNAL=off too)",
            ),
        ],
        False,
    ),
    _keyword(
        "g_log_format",
        Annotated[
            str,
            # Text, checked here (Click's choice check comes with a usage block); the
            # environment variable is named in the help text itself.
            typer.Option(
                _output.FLAG,
                envvar=_output.ENV,
                show_envvar=False,
                metavar="text|json",
                help="Stderr as text, or one JSON object per line (env IMGGW_LOG_FORMAT)",
            ),
        ],
        _output.TEXT,
    ),
]
_current: contextvars.ContextVar[Globals] = contextvars.ContextVar("imggw_globals")


def _per_second(flag: str, text: str) -> float:
    """A request rate from the command line: what RateLimit accepts (a finite number, at
    least one request an hour), else exit 2 with one line saying so."""
    from imggw_client import ConfigurationError, RateLimit

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    try:  # RateLimit's own check (finite, at least one an hour), not a copy of it
        RateLimit(submits_per_second=value)
    except ConfigurationError:
        from imggw_client.text import printable

        _usage(
            f"{flag} must be a number of requests per second, at least 1/3600 (one an hour) "
            f"(got {printable(text, 40)!r})"
        )
    return value


def _store(text: str) -> str | None:
    """A rate store URL from the command line or IMGGW_RATE_STORE (empty: none), checked as
    RateLimit checks it, else exit 2 with one line (never the URL's password)."""
    from imggw_client import ConfigurationError, RateLimit

    if not text:
        return None
    try:
        RateLimit(store=text)
    except ConfigurationError as exc:
        _usage(f"--rate-store {exc.message.removeprefix('RateLimit.store ')}")
    return text


def _usage(message: str) -> NoReturn:
    """A bad global option: one line on stderr (in the chosen log format), exit 2."""
    _output.say(f"error: {message}", level="error", event="usage_error", exit_code=2)
    raise typer.Exit(2)


def _log_format(value: str, source: str) -> str:
    """--log-format's value, else exit 2 with one line naming where the bad value came from,
    in the format the rest of the command line or the environment chose."""
    chosen = _output.parse(value)
    if chosen is None:
        from imggw_client.text import printable

        where = _output.ENV if source == "ENVIRONMENT" else _output.FLAG
        _usage(f"{where} must be text or json (got {printable(value, 40)!r})")
    return chosen


_PARSE: dict[str, Callable[[Any], Any]] = {
    "g_surface": lambda value: value.value,
    "g_rate": functools.partial(_per_second, "--rate"),
    "g_query_rate": functools.partial(_per_second, "--query-rate"),
    "g_rate_store": _store,
}


def with_globals(command: F) -> F:
    """Adds the global options to ``command``; their values are then ``current()``."""
    return _with(command, _OPTIONS)


# What a command that sends nothing uses: the output's form and the logs.
LOCAL = ("json", "quiet", "verbose", "log_format")


def with_globals_of(*names: str) -> Callable[[F], F]:
    """Adds only the global options ``names`` (without ``g_``) to a command, so that its
    ``--help`` lists only what it uses (one typed before the command name is still taken).
    """
    chosen = [p for p in _OPTIONS if p.name.removeprefix("g_") in names]
    unknown = set(names) - {p.name.removeprefix("g_") for p in chosen}
    assert not unknown, unknown
    return functools.partial(_with, options=chosen)


def _with(command: F, options: list[inspect.Parameter]) -> F:
    signature = inspect.signature(command)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.pop(_CONTEXT.name)
        root = ctx.find_root()
        if not isinstance(root.obj, Globals):
            root.obj = Globals()
            _output.begin()
        chosen: Globals = root.obj
        # The root's callback runs first, then the command's: a value here replaces the one
        # from before the command name unless it came from a weaker source. --log-format is
        # taken first, so that a bad value of another option is reported in its format.
        for param in sorted(options, key=lambda p: p.name != "g_log_format"):
            value = kwargs.pop(param.name)
            source = ctx.get_parameter_source(param.name)
            origin = source.name if source else "DEFAULT"
            strength = _STRENGTH.get(origin, 0)
            name = param.name.removeprefix("g_")
            if strength < chosen.sources.get(name, 0):
                continue
            if param.name == "g_log_format":
                if strength:  # typed, or from the environment; a default leaves begin()'s
                    _output.use(_log_format(value, origin))
                value = _output.JSON if _output.is_json() else _output.TEXT
            elif value is not None and param.name in _PARSE:
                value = _PARSE[param.name](value)
            setattr(chosen, name, value)
            chosen.sources[name] = strength
        _current.set(chosen)
        if wants_context:  # Click hands its context to one parameter: ours, shared here
            kwargs["ctx"] = ctx
        return command(*args, **kwargs)

    wants_context = "ctx" in signature.parameters
    own = [p for name, p in signature.parameters.items() if name != "ctx"]
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*own, _CONTEXT, *options]
    )
    wrapper.__annotations__ = {
        **{k: v for k, v in command.__annotations__.items() if k != "ctx"},
        **{p.name: p.annotation for p in (_CONTEXT, *options)},
    }
    return wrapper  # type: ignore[return-value]


def current() -> Globals:
    """The global options of the command being run."""
    return _current.get()
