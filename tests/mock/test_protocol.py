"""The gateway's answers, case by case, through its pure core."""

from __future__ import annotations

import json
from typing import Any

import pytest

from imggw_client.mock import MockGateway

from ..core.test_rules import BLANK, NOT_BLANK
from .helpers import (
    ALPHA_SUBMIT,
    BETA_SUBMIT,
    KEY,
    alpha_body,
    beta_body,
    call,
    query,
    record,
    submit,
    task_id,
)

pytestmark = pytest.mark.gateway(
    api_keys=[KEY, "other-key"], seed=1, manual_clock=True, duration_min=10, duration_max=10
)


def error(response: Any) -> tuple[int, str, str]:
    body = json.loads(response.body)
    return response.status, body["error"]["code"], body["error"]["message"]


def test_beta_submit_and_query(gateway: MockGateway) -> None:
    answer = submit(gateway)
    assert answer.status == 200
    assert json.loads(answer.body) == {
        "code": 200,
        "data": [{"status": "submitted", "task_id": "1"}],
    }
    data = record(query(gateway, "1"))
    assert data["id"] == "1"
    assert data["status"] == "pending"
    assert data["progress"] == 0
    assert data["cost"] == 0.02
    assert data["credits_cost"] == 8.0


def test_alpha_submit_and_query(gateway: MockGateway) -> None:
    answer = submit(gateway, "alpha")
    body = json.loads(answer.body)
    assert (answer.status, body["code"], body["data"]["taskId"]) == (200, 200, "1")
    data = record(query(gateway, "1", "alpha"))
    assert (data["taskId"], data["state"], data["creditsConsumed"]) == ("1", "waiting", "8")


@pytest.mark.parametrize(
    ("headers_key", "why"),
    [(None, "missing"), ("wrong-key", "unknown"), ("test-key ", "padded is trimmed, so ok")],
)
def test_auth(gateway: MockGateway, headers_key: str | None, why: str) -> None:
    answer = call(gateway, "POST", BETA_SUBMIT, beta_body(), key=headers_key)
    if why.endswith("ok"):
        assert answer.status == 200
    else:
        assert error(answer)[:2] == (401, "unauthorized")
        assert gateway.stats()["tasks_created"] == 0


def test_auth_needs_the_bearer_scheme(gateway: MockGateway) -> None:
    from imggw_client.mock import MockRequest

    req = MockRequest("GET", "/beta/v1/tasks/1", {}, {"authorization": f"Basic {KEY}"})
    assert gateway.handle(req).status == 401


def test_the_key_is_never_in_stats(gateway: MockGateway) -> None:
    submit(gateway)
    assert KEY not in json.dumps(gateway.stats())


@pytest.mark.parametrize(
    ("override", "status", "code", "field"),
    [
        ({"extra": 1}, 422, "unknown_field", "extra"),
        ({"model": "imagegen-3"}, 422, "invalid_model", "model"),
        ({"n": 2}, 422, "invalid_n", "n"),
        ({"n": True}, 422, "invalid_n", "n"),
        ({"n": 1.0}, 422, "invalid_n", "n"),
        ({"prompt": ""}, 422, "invalid_prompt", "prompt"),
        ({"prompt": "   "}, 422, "invalid_prompt", "prompt"),
        ({"prompt": "x" * 20001}, 422, "invalid_prompt", "prompt"),
        ({"prompt": 5}, 422, "invalid_prompt", "prompt"),
        ({"size": "7:5"}, 422, "invalid_aspect_ratio", "size"),
        ({"resolution": "2K"}, 422, "invalid_resolution", "resolution"),
        ({"resolution": "8k"}, 422, "invalid_resolution", "resolution"),
        ({"size": "auto", "resolution": "2k"}, 422, "unsupported_combination", "resolution"),
        ({"size": "1:1", "resolution": "4k"}, 422, "unsupported_combination", "resolution"),
        ({"size": "9:21", "resolution": "2k"}, 422, "unsupported_combination", "resolution"),
    ],
)
def test_beta_validation(
    gateway: MockGateway, override: dict[str, Any], status: int, code: str, field: str
) -> None:
    answer = call(gateway, "POST", BETA_SUBMIT, beta_body(**override))
    got_status, got_code, message = error(answer)
    assert (got_status, got_code) == (status, code)
    assert message.startswith(field)
    assert "x" * 50 not in message  # the prompt is never echoed
    assert gateway.stats()["tasks_created"] == 0


@pytest.mark.parametrize("missing", ["model", "prompt", "size", "resolution", "n"])
def test_beta_missing_fields(gateway: MockGateway, missing: str) -> None:
    body = beta_body()
    del body[missing]
    assert error(call(gateway, "POST", BETA_SUBMIT, body))[:2] == (422, "missing_field")


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({"resolution": "2k"}, "input.resolution: must be one of 1K, 2K, 4K"),  # A is upper case
        ({"aspect_ratio": "7:5"}, "input.aspect_ratio: must be one of auto"),
        ({"prompt": ""}, "input.prompt: must be 1 to 20000"),
        (
            {"aspect_ratio": "auto", "resolution": "4K"},
            "input.resolution: aspect ratio auto requires 1k",
        ),
        ({"seed": 3}, "input.seed: unknown field"),
    ],
)
def test_alpha_validation_same_rules(
    gateway: MockGateway, override: dict[str, Any], says: str
) -> None:
    answer = call(gateway, "POST", ALPHA_SUBMIT, alpha_body(**override))
    body = json.loads(answer.body)
    assert answer.status == 422
    assert body["code"] == 422
    assert body["data"] is None
    # A carries no string reason: the status and the message (naming field and rule) say it.
    assert body["msg"].startswith(says)
    assert gateway.stats()["tasks_created"] == 0


def test_alpha_shape_errors(gateway: MockGateway) -> None:
    assert call(gateway, "POST", ALPHA_SUBMIT, {"model": "imagegen-2-text-to-image"}).status == 422
    assert (
        call(
            gateway, "POST", ALPHA_SUBMIT, {"model": "imagegen-2-text-to-image", "input": "x"}
        ).status
        == 422
    )
    assert call(gateway, "POST", ALPHA_SUBMIT, {**alpha_body(), "callBackUrl": "x"}).status == 422


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1,2]", b'"text"', b"{", b"\xff\xfe"])
def test_invalid_json(gateway: MockGateway, raw: bytes) -> None:
    assert error(call(gateway, "POST", BETA_SUBMIT, raw=raw))[:2] == (400, "invalid_json")


def test_body_limit(gateway: MockGateway) -> None:
    big = json.dumps(beta_body(prompt="x" * 10, pad="y" * (256 * 1024))).encode()
    assert error(call(gateway, "POST", BETA_SUBMIT, raw=big))[:2] == (413, "body_too_large")
    assert call(gateway, "POST", ALPHA_SUBMIT, raw=big).status == 413


@pytest.mark.parametrize("idem", ["k" * 256, "tab\there", "ключ"])
def test_invalid_idempotency_key(gateway: MockGateway, idem: str) -> None:
    answer = call(gateway, "POST", BETA_SUBMIT, beta_body(), idem=idem)
    assert error(answer)[:2] == (400, "invalid_idempotency_key")


def test_unknown_and_foreign_tasks_look_the_same(gateway: MockGateway) -> None:
    tid = task_id(submit(gateway))
    unknown = query(gateway, "999")
    foreign = query(gateway, tid, key="other-key")
    assert unknown.status == foreign.status == 404
    assert unknown.body == foreign.body
    assert error(unknown)[1] == "task_not_found"
    other_surface = query(gateway, tid, "alpha")
    assert other_surface.status == 404  # tasks are per surface


def test_invalid_task_ids(gateway: MockGateway) -> None:
    assert error(query(gateway, "0"))[:2] == (400, "invalid_task_id")
    assert error(query(gateway, "01"))[:2] == (400, "invalid_task_id")
    assert call(gateway, "GET", "/alpha/api/v1/jobs/recordInfo").status == 400


def test_routes_and_methods(gateway: MockGateway) -> None:
    assert error(call(gateway, "GET", "/beta/v2/nothing"))[:2] == (404, "not_found")
    wrong = call(gateway, "GET", BETA_SUBMIT)
    assert error(wrong)[:2] == (405, "method_not_allowed")
    assert ("allow", "POST") in wrong.headers


def test_quirk_alpha_http200(gateway: MockGateway) -> None:
    quirky = MockGateway(quirks=["alpha_http200"])
    answer = call(quirky, "POST", ALPHA_SUBMIT, alpha_body(prompt=""))
    assert answer.status == 200
    assert json.loads(answer.body)["code"] == 422
    # B is unaffected
    assert call(quirky, "POST", BETA_SUBMIT, beta_body(prompt="")).status == 422


def test_quirk_beta_no_code() -> None:
    quirky = MockGateway(quirks=["beta_no_code"])
    body = json.loads(call(quirky, "POST", BETA_SUBMIT, beta_body(prompt="")).body)
    assert "code" not in body
    assert body["error"]["code"] == "invalid_prompt"


def test_quirks_extra_states_and_no_progress() -> None:
    quirky = MockGateway(
        quirks=["extra_states", "no_progress"], manual_clock=True, duration_min=10, duration_max=10
    )
    tid_b = task_id(submit(quirky))
    tid_a = task_id(submit(quirky, "alpha"))
    seen_b, seen_a = set(), set()
    for _ in range(12):
        rec_b, rec_a = record(query(quirky, tid_b)), record(query(quirky, tid_a, "alpha"))
        assert "progress" not in rec_b
        assert "progress" not in rec_a
        seen_b.add(rec_b["status"])
        seen_a.add(rec_a["state"])
        quirky.advance(1)
    assert seen_b == {"submitted", "in_progress", "completed"}
    assert seen_a == {"waiting", "queuing", "generating", "success"}


def test_idempotency_error_reasons_on_alpha_lead_the_message(gateway: MockGateway) -> None:
    submit(gateway, "alpha", idem="k1")
    answer = submit(gateway, "alpha", idem="k1", prompt="another")
    body = json.loads(answer.body)
    assert (answer.status, body["code"]) == (422, 422)
    assert body["msg"].startswith("idempotency_key_reused")


# ---------------------------------------------------------------------------- hostile bodies


@pytest.mark.parametrize("surface", ["alpha", "beta"])
@pytest.mark.parametrize(
    ("prompt", "accepted"), [(c, False) for c in BLANK] + [(c, True) for c in NOT_BLANK]
)
def test_blank_prompts_are_judged_as_ecma_262_judges_them(
    gateway: MockGateway, surface: str, prompt: str, accepted: bool
) -> None:
    answer = submit(gateway, surface, prompt=prompt)
    if accepted:
        assert answer.status == 200
    else:
        body = json.loads(answer.body)
        assert answer.status == 422
        if surface == "beta":
            assert body["error"]["code"] == "invalid_prompt"
        else:
            assert body["code"] == 422
            assert body["msg"].startswith("input.prompt:")
        assert "must contain a non-whitespace character" in json.dumps(body)
    assert gateway.stats()["tasks_created"] == int(accepted)


@pytest.mark.parametrize("surface", ["alpha", "beta"])
@pytest.mark.parametrize("escaped", [r"\ud800", r"a cat \udfff", r"\ude00\ud83d"])
def test_prompts_with_lone_surrogates_are_refused_and_not_billed(
    gateway: MockGateway, surface: str, escaped: str
) -> None:
    path, body = (ALPHA_SUBMIT, alpha_body()) if surface == "alpha" else (BETA_SUBMIT, beta_body())
    raw = json.dumps(body).replace('"a cat"', f'"{escaped}"').encode()
    answer = call(gateway, "POST", path, raw=raw)
    assert answer.status == 422
    assert "surrogate" in answer.body.decode()
    assert gateway.stats()["tasks_created"] == 0
    paired = json.dumps(body).replace('"a cat"', r'"a fox \ud83e\udd8a"').encode()
    assert call(gateway, "POST", path, raw=paired).status == 200  # a proper pair is one character


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"imagegen-2","prompt":"x","prompt":"y","size":"1:1","resolution":"1k","n":1}',
        b'{"model":"imagegen-2","prompt":"x","size":"1:1","resolution":"1k","n":1,"n":1}',
    ],
)
def test_repeated_keys_are_invalid_json(gateway: MockGateway, raw: bytes) -> None:
    assert error(call(gateway, "POST", BETA_SUBMIT, raw=raw))[:2] == (400, "invalid_json")
    assert gateway.stats()["tasks_created"] == 0


def test_repeated_keys_inside_alpha_input_are_invalid_json(gateway: MockGateway) -> None:
    raw = (
        b'{"model":"imagegen-2-text-to-image","input":{"prompt":"x","prompt":"y",'
        b'"resolution":"1K","aspect_ratio":"1:1"}}'
    )
    body = json.loads(call(gateway, "POST", ALPHA_SUBMIT, raw=raw).body)
    assert (body["code"], body["data"]) == (400, None)
    assert gateway.stats()["tasks_created"] == 0


@pytest.mark.parametrize("path", [ALPHA_SUBMIT, BETA_SUBMIT])
@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,  # 200 KB, under the 256 KiB limit
        b"[" * 100_000,
        b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"a": ' * 30_000 + b"1" + b"}" * 30_000,
    ],
)
def test_deeply_nested_bodies_are_400_never_500(
    gateway: MockGateway, path: str, raw: bytes
) -> None:
    assert len(raw) < 256 * 1024
    answer = call(gateway, "POST", path, raw=raw, idem="nested")
    assert answer.status == 400
    assert json.loads(answer.body)["code"] == 400


def test_canonical_never_raises() -> None:
    from imggw_client.mock import _serving as serving

    for raw in (b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000, b"\xff", b'{"a":1,"a":2}'):
        assert isinstance(serving.canonical(raw), bytes)
    assert serving.canonical(b'{"b": 1, "a": [2]}') == b'{"a":[2],"b":1}'


def test_invented_methods_share_one_stats_bucket(gateway: MockGateway) -> None:
    for i in range(50):
        call(gateway, f"BREW{i}", "/beta/v1/tasks/1")
        call(gateway, f"X-{i}", f"/nowhere/{i}")
    call(gateway, "DELETE", "/beta/v1/tasks/1")
    assert gateway.stats()["requests"] == {
        "OTHER /beta/v1/tasks/{id}": 50,
        "OTHER (unknown)": 50,
        "DELETE /beta/v1/tasks/{id}": 1,
    }
