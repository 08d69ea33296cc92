"""``imggw``: the command-line tool of the imggw SDK (``imggw --help`` lists its commands)."""

__all__ = ["main"]


def main() -> None:
    """The ``imggw`` entry point."""
    from ._app import run

    run()
