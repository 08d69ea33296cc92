"""Calling the gateway's pure core directly."""

from __future__ import annotations

import json
import struct
from typing import Any

from imggw_client.mock import MockGateway, MockResponse

KEY = "test-key"
BETA_SUBMIT = "/beta/v1/images/generations"
ALPHA_SUBMIT = "/alpha/api/v1/jobs/createTask"


def beta_body(**override: Any) -> dict[str, Any]:
    return {
        "model": "imagegen-2",
        "prompt": "a cat",
        "size": "16:9",
        "resolution": "2k",
        "n": 1,
        **override,
    }


def alpha_body(**override: Any) -> dict[str, Any]:
    fields = {"prompt": "a cat", "resolution": "2K", "aspect_ratio": "16:9", **override}
    return {"model": "imagegen-2-text-to-image", "input": fields}


def call(
    gw: MockGateway,
    method: str,
    path: str,
    body: Any = None,
    *,
    key: str | None = KEY,
    idem: str | None = None,
    query: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> MockResponse:
    headers = {}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    if idem is not None:
        headers["idempotency-key"] = idem
    content = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    from imggw_client.mock import MockRequest

    return gw.handle(MockRequest(method, path, query or {}, headers, content))


def submit(
    gw: MockGateway, surface: str = "beta", idem: str | None = None, **kw: Any
) -> MockResponse:
    if surface == "alpha":
        return call(gw, "POST", ALPHA_SUBMIT, alpha_body(**kw), idem=idem)
    return call(gw, "POST", BETA_SUBMIT, beta_body(**kw), idem=idem)


def task_id(response: MockResponse) -> str:
    data = json.loads(response.body)["data"]
    return str(data["taskId"] if isinstance(data, dict) else data[0]["task_id"])


def query(gw: MockGateway, tid: str, surface: str = "beta", key: str = KEY) -> MockResponse:
    if surface == "alpha":
        return call(gw, "GET", "/alpha/api/v1/jobs/recordInfo", query={"taskId": tid}, key=key)
    return call(gw, "GET", f"/beta/v1/tasks/{tid}", key=key)


def record(response: MockResponse) -> dict[str, Any]:
    data = json.loads(response.body)["data"]
    assert isinstance(data, dict)
    return data


def png_size(content: bytes) -> tuple[int, int]:
    assert content.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", content[16:24])
    return width, height
