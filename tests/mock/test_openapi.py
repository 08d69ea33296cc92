"""The OpenAPI document and the served gateway cannot drift apart: the document is valid
OpenAPI 3.1 (openapi-spec-validator), states the rules the gateway enforces, and a bounded
schemathesis run against the gateway over a real socket finds nothing with every check on."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import schemathesis
from openapi_spec_validator import validate
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from imggw_client._core import rules
from imggw_client.mock import FAULT_KINDS, MockGateway, MockResponse
from imggw_client.mock._openapi import openapi_document

from .helpers import KEY, alpha_body, beta_body, call, query, submit, task_id

AUTH = {"Authorization": f"Bearer {KEY}"}
DOC = openapi_document()
load_all_checks()
EVERY_CHECK = CHECKS.get_all()
CONFORMANCE = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def test_the_served_document_is_valid_openapi_3_1_and_covers_the_result_links(
    gateway: MockGateway,
) -> None:
    served = json.loads(call(gateway, "GET", "/openapi.json", key=None).body)
    assert served == DOC
    validate(served)  # raises OpenAPIValidationError with the path of the first problem
    results = served["paths"]["/results/{file}"]["get"]
    assert {p["name"] for p in results["parameters"]} == {"file", "Expires", "Signature"}
    assert {"200", "403", "404", "410"} <= set(results["responses"])


@pytest.mark.slow
def test_the_document_states_the_rules_the_gateway_enforces() -> None:
    header = DOC["paths"]["/beta/v1/images/generations"]["post"]["parameters"][0]
    assert header["name"] == "Idempotency-Key"
    key = header["schema"]
    for candidate in [
        "k",
        "a" * 255,
        "order-17/line 3",
        "~",
        "a" * 256,
        "",
        " lead",
        "trail ",
        "tab\there",
        "ключ",
        "\x7f",
    ]:
        by_schema = jsonschema.Draft202012Validator(key).is_valid(candidate)
        assert by_schema is (rules.check_idempotency_key(candidate) == []), candidate
    prompt = DOC["components"]["schemas"]["BetaSubmitRequest"]["properties"]["prompt"]
    pattern = re.compile(prompt["pattern"])
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if not 0xD800 <= code <= 0xDFFF:  # surrogates: refused by the rule, stated in words
            assert (pattern.search(char) is not None) is (rules.check_prompt(char) == []), code


def documented(path: str, method: str) -> dict[str, Any]:
    responses: dict[str, Any] = DOC["paths"][path][method]["responses"]
    return responses


ROUTES = [
    ("/alpha/api/v1/jobs/createTask", "post", lambda gw: submit(gw, "alpha", idem="k")),
    ("/beta/v1/images/generations", "post", lambda gw: submit(gw, "beta", idem="k")),
    ("/alpha/api/v1/jobs/recordInfo", "get", lambda gw: query(gw, "1", "alpha")),
    ("/beta/v1/tasks/{id}", "get", lambda gw: query(gw, "1")),
    ("/results/{file}", "get", lambda gw: call(gw, "GET", "/results/x.png", key=None)),
]


def assert_documented(path: str, method: str, answer: MockResponse) -> None:
    responses = documented(path, method)
    assert str(answer.status) in responses, (path, answer.status)
    declared = {name.lower() for name in responses[str(answer.status)].get("headers", {})}
    for name, _ in answer.headers:
        if name in ("retry-after", "idempotent-replayed"):
            assert name in declared, (path, answer.status, name)


@pytest.mark.parametrize(("path", "method", "send"), ROUTES)
def test_every_status_and_header_the_gateway_sends_is_documented(
    path: str, method: str, send: Any, make_gateway: Callable[..., MockGateway]
) -> None:
    """Faults, limits, conflicts: whatever a route can answer, its document says."""
    gateways = [make_gateway(fault_rate=1.0, faults=[kind]) for kind in FAULT_KINDS]
    gateways.append(make_gateway(submit_limit="1/60", query_limit="1/60"))
    gateways.append(make_gateway(api_keys=["someone-else"]))  # 401
    seen = set()
    for gw in gateways:
        for _ in range(3):
            answer = send(gw)
            if not answer.drop:
                assert_documented(path, method, answer)
                seen.add(answer.status)
    assert {429, 500, 502, 503, 504} <= seen


def test_conflicts_and_replays_are_documented_with_their_headers(
    make_gateway: Callable[..., MockGateway],
) -> None:
    conflict = make_gateway(fault_rate=1.0, faults=["latency"], latency=5)
    first = submit(conflict, idem="k")
    assert_documented("/beta/v1/images/generations", "post", first)
    conflict.configure(fault_rate=0)
    in_flight = submit(conflict, idem="k")
    assert in_flight.status == 409
    assert_documented("/beta/v1/images/generations", "post", in_flight)
    replayed = make_gateway()
    submit(replayed, idem="k")
    again = submit(replayed, idem="k")
    assert ("idempotent-replayed", "true") in again.headers
    assert_documented("/beta/v1/images/generations", "post", again)


@pytest.mark.gateway(manual_clock=True, duration_min=1, duration_max=1, retention=10, link_ttl=5)
def test_result_statuses_are_documented(gateway: MockGateway) -> None:
    tid = task_id(submit(gateway))
    assert call(gateway, "GET", "/results/x.png", key=None).status == 403
    gateway.advance(1)
    data = json.loads(query(gateway, tid).body)["data"]
    url = data["result"]["images"][0]["url"][0].removeprefix("http://imggw.mock")
    statuses = [call(gateway, "GET", url, key=None).status]
    gateway.advance(6)
    statuses.append(call(gateway, "GET", url, key=None).status)
    gateway.advance(10)
    statuses.append(call(gateway, "GET", url, key=None).status)
    gateway.reset()
    statuses.append(call(gateway, "GET", url, key=None).status)
    assert statuses == [200, 403, 410, 404]
    for status in statuses:
        assert str(status) in documented("/results/{file}", "get")


# ---------------------------------------------------------------------------- schemathesis
#
# The key goes through schemathesis' own auth for the document's `bearer` scheme, so that its
# auth probes (no key, a wrong key) and negated headers really go out without it. Figures (2
# cores, empty example database): 342 cases over the five operations, every check on each, in
# about 8 s; the run with faults and limits, 75 cases in about 6 s.


def schemathesis_schema(max_examples: int, phases: list[str] | None = None) -> Any:
    settings: dict[str, Any] = {
        "auth": {"openapi": {"bearer": {"bearer": KEY}}},
        "generation": {"max-examples": max_examples},
    }
    if phases:
        settings["phases"] = {
            name: {"enabled": name in phases}
            for name in ("examples", "coverage", "fuzzing", "stateful")
        }
    return schemathesis.openapi.from_dict(DOC, config=SchemathesisConfig.from_dict(settings))


SCHEMA = schemathesis_schema(25)
FAULTY_SCHEMA = schemathesis_schema(15, phases=["examples", "fuzzing"])


# Here and in `faulty`, a gateway of its own: the family's are per test, and a sweep's
# cases share one gateway (with bound_keys).
@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    gateway = MockGateway(seed=0, duration_min=0, duration_max=0)
    with gateway.serve() as url:
        yield url


@pytest.fixture(scope="module")
def bound_keys() -> set[str]:
    """Idempotency-Keys an earlier case bound to its request (an accepted submit)."""
    return set()


@pytest.mark.slow  # a schemathesis sweep
@SCHEMA.parametrize()
def test_the_gateway_keeps_every_promise_of_its_document(
    case: Any, served: str, bound_keys: set[str]
) -> None:
    key = (case.headers or {}).get("Idempotency-Key")
    # The one stateful rejection: a key that an earlier case bound to its request, sent again
    # with another body (or on the other surface), is rightly refused with 422
    # idempotency_key_reused. Schemathesis judges each case alone and would call that "a
    # schema-valid request rejected", so positive_data_acceptance is left out for exactly those
    # cases, and stays on for every other.
    excluded = [positive_data_acceptance] if key in bound_keys else []
    response = case.call_and_validate(base_url=served, checks=EVERY_CHECK, excluded_checks=excluded)
    if case.method == "POST" and key is not None and response.status_code == 200:
        bound_keys.add(key)


@pytest.fixture(scope="module")
def faulty() -> Iterator[str]:
    """Faults and limits on: 429 and 5xx answers must match the document too."""
    gateway = MockGateway(
        seed=1,
        duration_min=0,
        duration_max=0,
        fault_rate=0.5,
        faults=["429", "500", "502", "503", "504", "latency"],
        latency=0.01,
        retry_after=0,
        submit_limit="5/60",
        query_limit="5/60",
    )
    with gateway.serve() as url:
        yield url


@pytest.mark.slow  # a schemathesis sweep
@FAULTY_SCHEMA.parametrize()
def test_faults_and_limits_answer_as_documented(case: Any, faulty: str) -> None:
    # Only the conformance checks: a 5xx that a fault injects on purpose is no server error.
    case.call_and_validate(base_url=faulty, checks=CONFORMANCE)


def test_nothing_the_fuzz_sends_makes_a_5xx_over_the_socket(served: str) -> None:
    bodies = [
        b"[" * 100_000 + b"]" * 100_000,
        b"[" * 100_000,
        json.dumps(beta_body()).replace('"a cat"', '"x", "prompt": "y"').encode(),
        json.dumps(alpha_body()).replace('"a cat"', r'"\ud800"').encode(),
    ]
    with httpx.Client(base_url=served, headers=AUTH) as http:
        for path in ("/beta/v1/images/generations", "/alpha/api/v1/jobs/createTask"):
            for body in bodies:
                answer = http.post(path, content=body, headers={"Content-Type": "application/json"})
                assert 400 <= answer.status_code < 500, (path, body[:40], answer.text)
                assert answer.headers["content-type"] == "application/json"
