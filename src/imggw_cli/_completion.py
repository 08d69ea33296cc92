"""``imggw completion bash|zsh|fish``: the shell's completion script for imggw, printed.

The script asks ``imggw`` itself for completions (``_IMGGW_COMPLETE``), so they follow the
installed version; ``run`` sets Typer's completion up only when a shell asks."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from enum import Enum
from typing import Annotated

import typer

from . import _exit

app = typer.Typer()

COMPLETE_VAR = "_IMGGW_COMPLETE"


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

    print(get_completion_script(prog_name="imggw", complete_var=COMPLETE_VAR, shell=shell.value))
