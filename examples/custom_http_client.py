"""Bring your own httpx client: proxies, custom timeouts, limits, headers, event hooks.

The SDK adds its own headers to each request and never alters or closes your client.
Needs IMGGW_API_KEY and IMGGW_BASE_URL.
Run: python examples/custom_http_client.py "a red fox"
"""

from __future__ import annotations

import sys

import httpx

from imggw_client import Client


def log_request(request: httpx.Request) -> None:
    # The Authorization header is deliberately not printed.
    print(f"-> {request.method} {request.url.path}", file=sys.stderr)


def main(prompt: str) -> None:
    http = httpx.Client(
        timeout=httpx.Timeout(20.0, connect=5.0),
        limits=httpx.Limits(max_connections=10),
        headers={"X-Team": "illustrations"},
        event_hooks={"request": [log_request]},
        # proxy="http://proxy.internal:3128",   # a proxy, if your network needs one
    )
    with http, Client(http_client=http, timeout=20.0) as client:
        sub = client.submit(prompt)
        task = client.wait(sub)
        print(task.id, task.status.value, task.image_urls)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "a red fox")
