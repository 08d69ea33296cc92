"""The tests' gateways, one family named by what each gives (the fixtures are in tests/conftest.py).

- ``gateway``: the reference gateway in process (:class:`MockGateway`), no socket.
- ``gateway_url``: that gateway served on a loopback socket of its own (127.0.0.1); its URL.
- ``shared_gateway_url``: the same on the one loopback server the session shares (quicker).
- ``served_gateway``: both, ``(gateway, url)``.
- ``gateway_process``: the URL of ``imggw mock serve`` in a process of its own, same options.
- ``make_gateway(**options)``: more gateways, or one whose options a test decides as it runs.
- ``serve_gateway(gateway)``: serves any gateway on a loopback socket of its own until the test
  ends; ``shared_serve(gateway)`` on the one server the session shares (quicker to start).
- ``respx_gateway``: a respx router answering for the gateway at ``BASE_URL``, no socket.

The first four take MockGateway's own keywords (``api_keys``, ``seed``, ``duration_min``,
``latency``, ``faults``, ``fault_rate``, ``failure_rate``, ``submit_limit``, ``manual_clock``
...): a folder's ``gateway_options`` fixture, then a ``gateway`` mark on the module or test::

    pytestmark = pytest.mark.gateway(api_keys=[KEY], seed=3, **QUICK)

A gateway that answers crafted bytes or misbehaves on purpose stays beside its test.
"""

from __future__ import annotations

from typing import Any

# Tasks that finish in a few tens of ms.
QUICK: dict[str, Any] = {"duration_min": 0.02, "duration_max": 0.08}


def serve_options(options: dict[str, Any]) -> list[str]:
    """The ``imggw mock serve`` options that make the gateway ``MockGateway(**options)`` makes:
    ``seed=5`` is ``--seed 5``, ``api_keys=[K]`` is ``--api-key K``, ``faults=[a, b]`` is
    ``--faults a,b``."""
    words: list[str] = []
    for name, value in options.items():
        if name == "api_keys":
            for key in value:
                words += ["--api-key", key]
        elif isinstance(value, list | tuple):
            words += ["--" + name.replace("_", "-"), ",".join(value)]
        else:
            words += ["--" + name.replace("_", "-"), str(value)]
    return words
