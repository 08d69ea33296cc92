"""The reference gateway as an ASGI app with one finished task, for bench/gateway.py."""

from __future__ import annotations

from imggw_client.mock import MockGateway, MockRequest

GATEWAY = MockGateway(api_keys=["bench-key"], duration_min=0, duration_max=0)
GATEWAY.handle(
    MockRequest(
        "POST",
        "/beta/v1/images/generations",
        {},
        {"authorization": "Bearer bench-key"},
        b'{"model":"imagegen-2","prompt":"x","size":"1:1","resolution":"1k","n":1}',
    )
)
app = GATEWAY.asgi()
