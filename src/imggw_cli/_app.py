"""The ``imggw`` app: the root options, and the commands, a module per noun, wired together.

Each command is a thin shell over the SDK: options in, SDK call, output out. Heavy modules
(httpx, pydantic, rich, the SDK's clients) are imported inside the commands, so that
``imggw --help`` and ``imggw --version`` start as fast as a bare Typer app.
"""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from . import _batch, _completion, _download, _exit, _gallery, _journal, _mock, _tasks
from ._globals import with_globals

# What pydantic puts before the message of a check that raised ValueError. Typer checks values
# through pydantic, so a bad choice reads "Value error, 'gamma' is not one of ...".
PYDANTIC_PREFIX = "Value error, "


@contextmanager
def _plain_bad_values() -> Iterator[None]:
    """A bad value's message as the check wrote it, without pydantic's prefix."""
    try:
        yield
    except typer.BadParameter as exc:
        exc.message = exc.message.removeprefix(PYDANTIC_PREFIX)
        raise


class _Root(TyperGroup):
    """The root command: every bad value, its own options' (an environment variable's too) or
    a command's, is reported without pydantic's prefix."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _plain_bad_values():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _plain_bad_values():
            return super().invoke(ctx)


app = typer.Typer(
    cls=_Root,
    name="imggw",
    help="Generate images through an imggw gateway: submit, wait, download, safely.",
    epilog=_exit.EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# In the order --help lists them. A Typer added without a name gives its commands to the root.
app.add_typer(_tasks.app)  # generate, submit, status, poll, wait
app.add_typer(_download.app)  # download
app.add_typer(_journal.app, name="tasks")  # tasks, tasks collect
app.add_typer(_batch.app, name="batch")  # batch FILE, batch merge, batch status
app.add_typer(_gallery.app)  # gallery
app.add_typer(_mock.app, name="mock")  # mock serve
app.add_typer(_completion.app)  # completion


def _version(value: bool) -> None:
    if value:
        import imggw_client

        print(f"imggw {imggw_client.__version__}")
        raise typer.Exit()


@app.callback()
@with_globals
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Generate images through an imggw gateway: submit, wait, download, safely.

    The API key is read from IMGGW_API_KEY only. Global options may come before or after
    the command name.
    """


def run() -> None:
    """The entry point: Typer in standalone mode (usage errors exit 2); commands set their own
    exit codes, Ctrl-C included. With --log-format json, Click's own messages (a usage error)
    and a crash's traceback are JSON objects too (see _output.say)."""
    import os
    import sys

    from . import _output

    if os.environ.get(_completion.COMPLETE_VAR):  # a shell asks for completions
        from typer._completion_classes import completion_init

        completion_init()
        _completion.use_bash_line()  # a word bash broke at a colon (-a 16:9) is completed whole
    _output.start(sys.argv[1:])
    if not _output.is_json():
        app(prog_name="imggw")
        return
    sys.exit(_run_json())


def _run_json() -> int:
    """The app out of standalone mode, so that what Click would print is ours to write: its
    exit code."""
    import traceback

    from . import _output

    try:
        code = app(prog_name="imggw", standalone_mode=False)
    except typer.Abort:  # Click's "Aborted!": end of input at one of its prompts
        _output.say("Aborted!", level="error", event="aborted", exit_code=1)
        return 1
    except typer.TyperException as exc:  # Click's usage errors (and its other errors)
        code = int(getattr(exc, "exit_code", 1))
        ctx = getattr(exc, "ctx", None)
        usage = ctx.get_usage() if ctx is not None else None
        if type(exc).__name__ == "NoArgsIsHelpError":  # no command given: the help, as text
            _output.say(exc.format_message(), level="error", event="help", exit_code=code)
        else:
            _output.say(
                f"Error: {exc.format_message()}",
                level="error",
                event="usage_error" if code == _exit.USAGE else "error",
                exit_code=code,
                usage=usage,
            )
        return code
    except Exception as exc:  # a bug: its traceback inside the object, never lines of its own
        _output.say(
            f"{type(exc).__name__}: {exc}",
            level="error",
            event="crash",
            exit_code=1,
            traceback="".join(traceback.format_exception(exc)),
        )
        return 1
    return code if isinstance(code, int) else 0
