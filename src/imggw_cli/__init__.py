"""``imggw``: the command-line tool of the imggw SDK.

Example::

    $ imggw generate --mock "a lighthouse at dusk" -o out/
"""

__all__ = ["main"]


def main() -> None:
    """The ``imggw`` entry point."""
    from ._app import run

    run()
