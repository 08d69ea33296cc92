"""Property tests: the SDK and the gateway agree on every request, and a schema-driven fuzz of
the gateway's own OpenAPI document finds no 5xx and no answer outside its schemas."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imggw_client import ImageRequest, RequestValidationError
from imggw_client._core import rules
from imggw_client.mock import MockGateway, MockRequest

from .helpers import KEY
from .schema_strategies import from_schema

# One for the module: its document is read at import, and @given examples share it.
GATEWAY = MockGateway(seed=0)
DOC = json.loads(GATEWAY.handle(MockRequest("GET", "/openapi.json")).body)
SCHEMAS = DOC["components"]["schemas"]


def resolved(name: str) -> dict[str, Any]:
    """A component schema with its $refs inlined (hypothesis-jsonschema wants them local)."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(SCHEMAS[node["$ref"].rsplit("/", 1)[1]])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(SCHEMAS[name])  # type: ignore[no-any-return]


def post(path: str, body: bytes, idem: str | None = None) -> Any:
    headers = {"authorization": f"Bearer {KEY}"}
    if idem:
        headers["idempotency-key"] = idem
    return GATEWAY.handle(MockRequest("POST", path, {}, headers, body))


# Characters where ECMA-262 and Python disagree about whitespace, and lone surrogates (which
# JSON escapes can carry but no encoder can send on; a high one never directly precedes a low
# one here, or the escapes would make a proper pair on the wire).
tricky = st.sampled_from(
    [
        "\x1c",
        "\x1f",
        "\x85",
        "\ufeff",
        "\u180e",
        "\u2028",
        "\u3000",
        "\u200b",
        "\ud800",
        "x\udfff",
        " ",
        "x",
    ]
)
prompts = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\t\n", "a cat"]),
    st.sampled_from([20000, 20001]).map(lambda n: "x" * n),
    st.lists(tricky, min_size=1, max_size=4).map("".join),
)
ratios = st.sampled_from([*rules.ASPECT_RATIOS, "7:5", "AUTO", "", "16:9 "])
resolutions = st.sampled_from(["1k", "2k", "4k", "1K", "2K", "4K", "8k", ""])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=prompts, ratio=ratios, resolution=resolutions, surface=st.sampled_from(["alpha", "beta"])
)
@pytest.mark.slow
def test_image_request_and_gateway_accept_and_reject_the_same_requests(
    prompt: str, ratio: str, resolution: str, surface: str
) -> None:
    try:
        ImageRequest(prompt, ratio, resolution)
        sdk_accepts = True
    except RequestValidationError:
        sdk_accepts = False
    # The SDK sends each surface's wire form of the resolution.
    wire_res = resolution.upper() if surface == "alpha" else resolution.lower()
    if surface == "alpha":
        body = {
            "model": "imagegen-2-text-to-image",
            "input": {"prompt": prompt, "resolution": wire_res, "aspect_ratio": ratio},
        }
        path = "/alpha/api/v1/jobs/createTask"
    else:
        body = {
            "model": "imagegen-2",
            "prompt": prompt,
            "size": ratio,
            "resolution": wire_res,
            "n": 1,
        }
        path = "/beta/v1/images/generations"
    answer = post(path, json.dumps(body).encode())
    assert (answer.status == 200) is sdk_accepts, (answer.status, answer.body[:200])
    assert answer.status in (200, 422)


@pytest.mark.parametrize(
    ("path", "request_schema", "response_schema"),
    [
        ("/beta/v1/images/generations", "BetaSubmitRequest", "BetaSubmitResponse"),
        ("/alpha/api/v1/jobs/createTask", "AlphaSubmitRequest", "AlphaSubmitResponse"),
    ],
)
@pytest.mark.slow
def test_every_body_the_schema_allows_is_accepted(
    path: str, request_schema: str, response_schema: str
) -> None:
    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(from_schema(resolved(request_schema)))
    def check(body: dict[str, Any]) -> None:
        answer = post(path, json.dumps(body).encode())
        assert answer.status == 200, answer.body
        jsonschema.validate(json.loads(answer.body), resolved(response_schema))

    check()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=6)
    ),
    max_leaves=20,
)


def _repeat_a_key(body: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """The body with one of its keys written twice (the second time with the same value)."""
    return st.sampled_from(sorted(body)).map(
        lambda k: json.dumps(body)[:-1].encode() + b", " + json.dumps({k: body[k]})[1:].encode()
    )


unsound_json = st.one_of(
    # Nesting far too deep to parse, under the 256 KiB limit: bare, unclosed, or in a field.
    st.integers(50_000, 120_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(50_000, 120_000).map(lambda n: b"[" * n),
    st.integers(50_000, 100_000).map(lambda n: b'{"prompt": ' + b"[" * n + b"]" * n + b"}"),
    # A repeated key: what a proxy checked must be what is billed.
    from_schema(resolved("BetaSubmitRequest")).flatmap(_repeat_a_key),
    from_schema(resolved("AlphaSubmitRequest")).flatmap(
        lambda b: _repeat_a_key(b["input"]).map(
            lambda inner: b'{"model": "imagegen-2-text-to-image", "input": ' + inner + b"}"
        )
    ),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(["/beta/v1/images/generations", "/alpha/api/v1/jobs/createTask"]),
    body=unsound_json,
)
def test_unsound_json_is_always_400_invalid_json(path: str, body: bytes) -> None:
    assert len(body) < rules.BODY_MAX_BYTES
    answer = post(path, body, "one-key")
    parsed = json.loads(answer.body)
    assert answer.status == 400
    if path.startswith("/beta"):
        assert parsed["error"]["code"] == "invalid_json"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(["/beta/v1/images/generations", "/alpha/api/v1/jobs/createTask"]),
    body=st.one_of(
        json_values.map(lambda v: json.dumps(v).encode()),
        from_schema(resolved("BetaSubmitRequest")).flatmap(
            lambda b: st.dictionaries(st.text(max_size=8), json_values, max_size=3).map(
                lambda extra: json.dumps({**b, **extra}).encode()
            )
        ),
        st.binary(max_size=64),
        st.just(b"[").flatmap(lambda _: unsound_json),
    ),
    idem=st.one_of(st.none(), st.text(max_size=300)),
)
@pytest.mark.slow
def test_fuzzed_submits_never_cause_a_5xx_and_errors_match_their_schema(
    path: str, body: bytes, idem: str | None
) -> None:
    try:
        answer = post(path, body, idem)
    except UnicodeEncodeError:  # pragma: no cover - headers are latin-1 on the wire anyway
        return
    assert answer.status < 500
    parsed = json.loads(answer.body)
    if answer.status != 200:
        name = "AlphaError" if path.startswith("/alpha") else "BetaError"
        jsonschema.validate(parsed, resolved(name))


@settings(max_examples=300, deadline=None)
@given(task_id=st.text(max_size=20), surface=st.sampled_from(["alpha", "beta"]))
def test_fuzzed_queries_never_cause_a_5xx(task_id: str, surface: str) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    if surface == "alpha":
        request = MockRequest("GET", "/alpha/api/v1/jobs/recordInfo", {"taskId": task_id}, headers)
    else:
        request = MockRequest("GET", f"/beta/v1/tasks/{task_id}", {}, headers)
    answer = GATEWAY.handle(request)
    assert answer.status in (200, 400, 404)


@pytest.mark.gateway(manual_clock=True, duration_min=4, duration_max=4)
def test_records_match_their_schemas(gateway: MockGateway) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    body = json.dumps(
        {"model": "imagegen-2", "prompt": "x", "size": "1:1", "resolution": "1k", "n": 1}
    )
    gateway.handle(MockRequest("POST", "/beta/v1/images/generations", {}, headers, body.encode()))
    alpha = {
        "model": "imagegen-2-text-to-image",
        "input": {"prompt": "x #fail", "resolution": "1K", "aspect_ratio": "1:1"},
    }
    gateway.handle(
        MockRequest(
            "POST", "/alpha/api/v1/jobs/createTask", {}, headers, json.dumps(alpha).encode()
        )
    )
    for _ in range(6):
        beta = gateway.handle(MockRequest("GET", "/beta/v1/tasks/1", {}, headers))
        jsonschema.validate(json.loads(beta.body), resolved("BetaTaskRecord"))
        a = gateway.handle(
            MockRequest("GET", "/alpha/api/v1/jobs/recordInfo", {"taskId": "2"}, headers)
        )
        jsonschema.validate(json.loads(a.body), resolved("AlphaTaskRecord"))
        gateway.advance(1)
