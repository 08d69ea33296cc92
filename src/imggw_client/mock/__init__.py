"""The bundled reference gateway: a faithful, stateful imggw server for tests and demos.

In-process (no sockets) or over a real socket on 127.0.0.1; with fault injection, provider
quirks, request limits per key (``submit_limit="20/10"``), signed result links that expire
(``link_ttl``), a manual clock, inspection at ``/_mock/stats`` and its OpenAPI document at
``/openapi.json``.

Example::

    from imggw_client.mock import MockGateway

    gateway = MockGateway(api_keys=["test-key"], seed=0, duration_max=0.5, fault_rate=0.3)
    with gateway.client() as client:
        task = client.generate("a lighthouse")
    assert gateway.stats()["tasks_created"] == 1

Also: ``python -m imggw_client.mock --port 8080`` and the pytest fixtures of
``imggw_client.mock.pytest_plugin``.
"""

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
]
