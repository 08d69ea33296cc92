"""``imggw gallery``: a batch folder's contact sheet, (re)written from its manifest."""

# No `from __future__ import annotations` here: Typer reads these annotations at run time.

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import _exit
from ._command import session
from ._globals import LOCAL, with_globals_of

app = typer.Typer()


@app.command(epilog=_exit.EPILOG)
@with_globals_of(*LOCAL)
def gallery(
    folder: Annotated[Path, typer.Argument(help="A batch's output folder (with manifest.jsonl).")],
    title: Annotated[
        Optional[str],  # noqa: UP045 - Typer wants this spelling on Python 3.10
        typer.Option("--title", help="The page's title [default: the folder's name]."),
    ] = None,
) -> None:
    """Write FOLDER/index.html, a contact sheet of the results, from FOLDER/manifest.jsonl;
    print its path. Open it in a browser: it needs no network.

    Example: imggw gallery out/ --title "Spring catalogue"
    """
    from imggw_client.batch import MANIFEST_NAME, iter_manifest, write_gallery

    with session() as out:
        manifest = folder / MANIFEST_NAME
        if not manifest.is_file():
            out.error(
                f"{manifest} not found: give a batch's output folder (imggw batch -o)",
                exit_code=_exit.USAGE,
            )
            raise typer.Exit(_exit.USAGE)
        try:
            page = write_gallery(folder, iter_manifest(manifest), title=title or folder.name)
        except ValueError as exc:
            out.error(f"{manifest}: {exc}", exit_code=_exit.USAGE)
            raise typer.Exit(_exit.USAGE) from None
        except OSError as exc:
            out.error(
                f"cannot write the gallery in {folder}: {exc.strerror or exc}",
                exit_code=_exit.AUTH_OR_CONFIG,
            )
            raise typer.Exit(_exit.AUTH_OR_CONFIG) from None
        out.data({"path": str(page)}, [str(page)])
