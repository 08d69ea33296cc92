"""The bundled reference gateway: a faithful, stateful imggw server for tests and demos.

In-process (no sockets) or over a real socket on 127.0.0.1; with fault injection, provider
quirks, request limits per key (``submit_limit="20/10"``), signed result links that expire
(``link_ttl``), a manual clock, inspection at ``/_mock/stats`` and its OpenAPI document at
``/openapi.json``.

Example::

    from imggw_client.mock import MockGateway

    gateway = MockGateway(api_keys=["test-key"], seed=0, duration_min=0.1, duration_max=0.5,
                          fault_rate=0.3)
    with gateway.client() as client:
        task = client.generate("a lighthouse")
    assert gateway.stats()["tasks_created"] == 1

Also: ``python -m imggw_client.mock --port 8080`` (or :func:`main` from your own tool, and
:func:`serve_forever` from one that reads its options its own way) and the pytest fixtures of
``imggw_client.mock.pytest_plugin``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._config import DEFAULT_API_KEY, FAULT_KINDS, QUIRKS, MockConfig
from ._gateway import ManualClock, MockGateway, fingerprint
from ._messages import IN_PROCESS_URL, MockRequest, MockResponse

__all__ = [
    "DEFAULT_API_KEY",
    "FAULT_KINDS",
    "IN_PROCESS_URL",
    "QUIRKS",
    "ManualClock",
    "MockConfig",
    "MockGateway",
    "MockRequest",
    "MockResponse",
    "fingerprint",
    "main",
    "serve_forever",
]


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m imggw_client.mock") -> int:
    """Serves the reference gateway over HTTP until Ctrl-C, as ``python -m imggw_client.mock``
    does: the same options (``argv``; None reads the command line), the URL on stdout, notes and
    errors on stderr. Returns the exit code: 0 stopped by Ctrl-C, 1 could not serve (port in
    use), 2 bad option (``--help`` 0), 4 uvicorn missing. ``prog`` names the command in usage
    and ``--help``, for a tool that serves it under its own name (as ``imggw mock serve`` does).

    Example::

        # not run: serves until the process is stopped
        import sys
        from imggw_client.mock import main

        sys.exit(main(["--port", "8080", "--fault-rate", "0.2"], prog="mytool gateway"))
    """
    # Imported on call: the package importing its own __main__ would make runpy warn on every
    # ``python -m imggw_client.mock``.
    from .__main__ import main as serve

    return serve(argv, prog=prog)


def serve_forever(host: str = "127.0.0.1", port: int = 8080, **settings: Any) -> int:
    """Serves ``MockGateway(**settings)`` over HTTP on ``host:port`` until Ctrl-C, as
    :func:`main` does once it has read its options: for a tool that reads them its own way (as
    ``imggw mock serve`` does). The URL on stdout, notes and errors on stderr (never a key).
    Returns the exit code: 0 stopped by Ctrl-C, 1 could not serve (port in use), 2 a bad
    setting, 4 uvicorn missing.

    Example::

        # not run: serves until the process is stopped
        import sys
        from imggw_client.mock import serve_forever

        sys.exit(serve_forever(port=8080, fault_rate=0.2, api_keys=["k-one"]))
    """
    from .__main__ import serve_forever as serve

    return serve(settings, host=host, port=port)
