"""``imggw completion bash|zsh|fish``: the shell's completion script for imggw, printed.

The script asks ``imggw`` itself for completions (``_IMGGW_COMPLETE``), so they follow the
installed version; ``run`` sets Typer's completion up only when a shell asks.

bash breaks words at every character of ``COMP_WORDBREAKS`` (``:`` and ``=`` among them), so
``-a 16:`` reaches a completion function as the words ``16`` and ``:`` and an empty current
word. The bash script here also hands over the line up to the cursor: the command splits it as
a shell does, completes the whole word (``16:``), and answers with what goes after the word
bash is completing (``9`` and ``10`` of ``16:9``, ``16:10``). A script printed by an earlier
version (words only) still completes everything without a colon.
"""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

import os
from enum import Enum
from typing import Annotated

import typer

from . import _exit

app = typer.Typer()

COMPLETE_VAR = "_IMGGW_COMPLETE"
LINE_VAR = "_IMGGW_COMPLETE_LINE"  # the command line up to the cursor (bash)
BREAKS_VAR = "_IMGGW_COMPLETE_BREAKS"  # bash's COMP_WORDBREAKS
# What bash breaks words at unless told otherwise; whitespace and quotes are the shell's own.
DEFAULT_BREAKS = "\"'><=;|&(:"

BASH_SCRIPT = """\
%(complete_func)s() {
    local IFS=$'\\n'
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" \\
                   COMP_CWORD=$COMP_CWORD \\
                   %(line_var)s="${COMP_LINE:0:COMP_POINT}" \\
                   %(breaks_var)s="$COMP_WORDBREAKS" \\
                   %(autocomplete_var)s=complete_bash $1 ) )
    return 0
}

complete -o default -F %(complete_func)s %(prog_name)s
"""


class ShellChoice(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command(epilog=_exit.EPILOG)
def completion(
    shell: Annotated[ShellChoice, typer.Argument(help="The shell: bash, zsh or fish.")],
) -> None:
    """Print the shell's completion script for imggw (commands, options, choices).

    Example: imggw completion bash > ~/.local/share/bash-completion/completions/imggw;
    imggw completion zsh > "${fpath[1]}/_imggw"; imggw completion fish >
    ~/.config/fish/completions/imggw.fish
    """
    from typer._completion_shared import get_completion_script

    if shell is ShellChoice.bash:
        print(bash_script("imggw"), end="")
        return
    print(get_completion_script(prog_name="imggw", complete_var=COMPLETE_VAR, shell=shell.value))


def bash_script(prog_name: str) -> str:
    """The bash completion script of ``prog_name`` (see the module's docstring)."""
    name = "_" + "".join(c if c.isalnum() else "_" for c in prog_name) + "_completion"
    return BASH_SCRIPT % {
        "complete_func": name,
        "line_var": LINE_VAR,
        "breaks_var": BREAKS_VAR,
        "autocomplete_var": COMPLETE_VAR,
        "prog_name": prog_name,
    }


def use_bash_line() -> None:
    """Puts this module's bash completion in the place of Typer's (``run`` calls it when a
    shell asks for completions, after Typer set its own up)."""
    from typer._click.shell_completion import add_completion_class, split_arg_string
    from typer._completion_classes import BashComplete

    class BashLine(BashComplete):
        """Completes the word under bash's cursor whole, whatever bash broke it at."""

        def source(self) -> str:
            return bash_script(self.prog_name)

        def get_completion_args(self) -> tuple[list[str], str]:
            line = os.environ.get(LINE_VAR) or None  # a real line holds the command's name
            if line is None:  # a script from an earlier version: the words bash made
                args: tuple[list[str], str] = super().get_completion_args()
                return args
            words = split_arg_string(line)
            if line and not line[-1].isspace() and words:
                return words[1:-1], words[-1]
            return words[1:], ""

        def complete(self) -> str:
            args, incomplete = self.get_completion_args()
            values = [item.value for item in self.get_completions(args, incomplete)]
            cut = ""
            if os.environ.get(LINE_VAR):
                cut = bash_cut(incomplete, os.environ.get(BREAKS_VAR, DEFAULT_BREAKS))
            # bash replaces only the part after the last break: the answer is that part
            return "\n".join(v[len(cut) :] for v in values if v.startswith(cut))

    add_completion_class(BashLine, "bash")


def bash_cut(incomplete: str, breaks: str) -> str:
    """The start of the word being completed that bash keeps (it broke the word there): up to
    and including its last break character. An option's ``--name=`` is Click's to split, and
    its completions start after it (where bash broke the word too).
    """
    if incomplete.startswith("-") and "=" in incomplete:
        incomplete = incomplete.partition("=")[2]
    chars = set(breaks) - set(" \t\n\"'")
    last = max((incomplete.rfind(c) for c in chars), default=-1)
    return incomplete[: last + 1]
