"""``imggw mock serve``: the bundled reference gateway, served as ``python -m
imggw_client.mock`` serves it (every gateway option, its own ``--help``)."""

import typer

app = typer.Typer(help="The bundled reference gateway.", no_args_is_help=True)


@app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                      "help_option_names": []},
    add_help_option=False,
)  # fmt: skip
def serve(ctx: typer.Context) -> None:
    """Serve the reference gateway over HTTP (every gateway option; see --help)."""
    from imggw_client.mock import main

    raise typer.Exit(main(ctx.args, prog="imggw mock serve"))
