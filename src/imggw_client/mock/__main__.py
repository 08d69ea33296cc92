"""``python -m imggw_client.mock``: serve the reference gateway on a real socket.

Every MockGateway setting is an option (``--duration-max 2``, ``--faults lost,503``,
``--submit-limit 20/10``, ``--link-ttl 3600``, ...). Serving needs uvicorn, which the ``mock``
extra installs (``pip install 'imggw[mock]'``); without it the command says so and exits 4.

Exit codes: 0 stopped by Ctrl-C; 1 could not serve (port in use); 2 bad option; 4 uvicorn
missing.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.exceptions import ConfigurationError
from ._config import options


def _list(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parser(prog: str = "python -m imggw_client.mock") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve the imggw reference gateway (both surfaces) over HTTP.",
        epilog=f"Example: {prog} --port 8080 --fault-rate 0.2 --submit-limit 20/10",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (0 picks a free one)")
    for name, default, meta in options():
        flag = "--" + name.replace("_", "-")
        text = meta["help"]
        if name == "api_keys":
            p.add_argument("--api-key", dest=name, action="append", help=text + " [test-key]")
        elif isinstance(default, bool):
            p.add_argument(flag, action="store_true", help=text)
        elif isinstance(default, tuple):
            listed = ",".join(default) or "none"
            choices = ", ".join(meta.get("choices", ()))
            p.add_argument(
                flag,
                type=_list,
                default=default,
                help=f"{text}, comma-separated: {choices} [{listed}]",
            )
        elif default is None:  # the help text says what no value means
            p.add_argument(flag, type=meta["type"], default=None, help=text)
        else:
            p.add_argument(flag, type=type(default), default=default, help=f"{text} [{default}]")
    return p


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The MockGateway keywords an argparse result names."""
    chosen = {name: getattr(args, name) for name, _, _ in options()}
    if not chosen["api_keys"]:
        del chosen["api_keys"]
    return chosen


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m imggw_client.mock") -> int:
    """Serves until interrupted (see serve_forever)."""
    try:
        args = parser(prog).parse_args(argv)
    except SystemExit as done:  # --help, or a usage error (already explained on stderr)
        return int(done.code or 0)
    return serve_forever(settings(args), host=args.host, port=args.port)


def serve_forever(chosen: Mapping[str, Any], *, host: str = "127.0.0.1", port: int = 8080) -> int:
    """Serves ``MockGateway(**chosen)`` until interrupted: its URL on stdout, a note and any
    error on stderr; the exit code. Also ``imggw mock serve``, which reads its own options."""
    from ._asgi import serve
    from ._gateway import MockGateway

    try:
        gateway = MockGateway(**chosen)
    except ConfigurationError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    try:
        import uvicorn  # noqa: F401  (imported again where it serves; here only to ask)
    except ImportError:
        print(
            "error: serving the reference gateway needs uvicorn: pip install 'imggw[mock]'",
            file=sys.stderr,
        )
        return 4
    keys = len(gateway.config.api_keys)
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(serve(gateway, host, port))
        except (RuntimeError, OSError) as exc:
            print(f"error: {exc} (is the port in use?)", file=sys.stderr)
            return 1
        # The keys are the caller's own; say how many, never which.
        print(
            f"imggw reference gateway on {url} ({keys} API key(s)); Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        print(url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
