"""Decoding replies of both surfaces: errors, tasks, lenient resultJson, garbage."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imggw_client import (
    APIError,
    AuthenticationError,
    IdempotencyConflictError,
    ImageRequest,
    ImggwError,
    InsufficientCreditsError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    TaskStatus,
)
from imggw_client._core import surfaces
from imggw_client._core.wire import Reply

NOW = 1_700_000_000.0


def reply(status: int, body: Any, **headers: str) -> Reply:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Reply(status, {k.replace("_", "-").lower(): v for k, v in headers.items()}, content)


def test_submit_bodies_in_each_wire_form() -> None:
    req = ImageRequest("a cat", "16:9", "2K")
    assert surfaces.submit_body("alpha", req) == {
        "model": "imagegen-2-text-to-image",
        "input": {"prompt": "a cat", "resolution": "2K", "aspect_ratio": "16:9"},
    }
    assert surfaces.submit_body("beta", req) == {
        "model": "imagegen-2",
        "prompt": "a cat",
        "size": "16:9",
        "resolution": "2k",
        "n": 1,
    }


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, InvalidRequestError),
        (401, AuthenticationError),
        (402, InsufficientCreditsError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (413, InvalidRequestError),
        (422, InvalidRequestError),
        (429, RateLimitError),
        (500, ServerError),
        (503, ServerError),
        (418, APIError),
    ],
)
def test_alpha_errors_are_read_from_the_body_code_even_on_http_200(
    status: int, cls: type[APIError]
) -> None:
    for http in (200, status):
        err = surfaces.read_error("alpha", reply(http, {"code": status, "msg": "no"}), NOW)
        assert type(err) is cls
        assert err.status_code == status
        assert err.message == "no"
        assert err.surface == "alpha"


def test_alpha_idempotency_reason_from_the_start_of_msg() -> None:
    body = {"code": 422, "msg": "idempotency_key_reused: different body", "data": None}
    err = surfaces.read_error("alpha", reply(200, body), NOW)
    assert isinstance(err, IdempotencyConflictError)
    assert err.code == "idempotency_key_reused"


def test_alpha_success_is_not_an_error() -> None:
    assert surfaces.read_error("alpha", reply(200, {"code": 200, "data": {}}), NOW) is None
    assert surfaces.read_error("alpha", reply(200, {"data": {}}), NOW) is None


@pytest.mark.parametrize("with_code", [True, False])
def test_beta_errors_with_or_without_top_level_code(with_code: bool) -> None:
    body: dict[str, Any] = {"error": {"code": "invalid_size", "message": "size is not allowed"}}
    if with_code:
        body["code"] = 422
    err = surfaces.read_error("beta", reply(422, body), NOW)
    assert isinstance(err, InvalidRequestError)
    assert (err.status_code, err.code, err.message) == (422, "invalid_size", "size is not allowed")


def test_beta_key_reused_on_409_is_a_conflict_not_a_retry() -> None:
    err = surfaces.read_error(
        "beta", reply(409, {"error": {"code": "idempotency_key_reused", "message": "m"}}), NOW
    )
    assert isinstance(err, IdempotencyConflictError)


def test_retry_after_is_carried() -> None:
    err = surfaces.read_error(
        "beta", reply(429, {"error": {"code": "rate_limited"}}, retry_after="3"), NOW
    )
    assert isinstance(err, RateLimitError)
    assert err.retry_after == 3.0


def test_messages_are_bounded_single_line_and_redacted() -> None:
    key = "sk-canary-abcdefgh"
    body = {"error": {"code": "x", "message": f"bad\nkey {key} " + "y" * 1000}}
    err = surfaces.read_error("beta", reply(400, body), NOW, secrets=(key,))
    assert err is not None
    assert key not in err.message
    assert "\n" not in err.message
    assert len(err.message) <= 300


def test_error_bodies_that_are_not_json_still_give_an_error() -> None:
    err = surfaces.read_error("beta", reply(502, b"<html>bad gateway</html>"), NOW)
    assert isinstance(err, ServerError)
    assert "html" not in err.message  # no raw upstream body


def test_alpha_task_record() -> None:
    body = {
        "code": 200,
        "msg": "ok",
        "data": {
            "taskId": "7",
            "state": "success",
            "progress": "100",
            "resultJson": json.dumps({"resultUrls": ["https://cdn/a.png", "https://cdn/b.png"]}),
            "creditsConsumed": "12.5",
        },
    }
    task = surfaces.read_task("alpha", reply(200, body), "7", NOW)
    assert task.status is TaskStatus.SUCCEEDED
    assert task.image_urls == ["https://cdn/a.png", "https://cdn/b.png"]
    assert (task.credits, task.cost, task.progress) == (12.5, None, 100)
    assert task.raw == body
    assert task.is_terminal


def test_beta_task_record_failed() -> None:
    body = {
        "code": 200,
        "data": {
            "id": "7",
            "status": "failed",
            "error": {"code": "content_policy", "message": "The prompt was refused."},
            "cost": 0,
            "credits_cost": 0,
        },
    }
    task = surfaces.read_task("beta", reply(200, body), "7", NOW)
    assert task.status is TaskStatus.FAILED
    assert task.error is not None
    assert (task.error.code, task.error.message) == ("content_policy", "The prompt was refused.")
    assert (task.cost, task.credits) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("surface", "state", "status"),
    [
        ("alpha", "waiting", TaskStatus.PENDING),
        ("alpha", "queuing", TaskStatus.PENDING),
        ("alpha", "generating", TaskStatus.RUNNING),
        ("alpha", "success", TaskStatus.SUCCEEDED),
        ("alpha", "fail", TaskStatus.FAILED),
        ("beta", "pending", TaskStatus.PENDING),
        ("beta", "submitted", TaskStatus.PENDING),
        ("beta", "processing", TaskStatus.RUNNING),
        ("beta", "in_progress", TaskStatus.RUNNING),
        ("beta", "completed", TaskStatus.SUCCEEDED),
        ("beta", "failed", TaskStatus.FAILED),
        ("beta", "cancelled", TaskStatus.FAILED),
        ("beta", "canceled", TaskStatus.FAILED),
        ("alpha", "cancelled", TaskStatus.FAILED),
        ("beta", "warming_up", TaskStatus.RUNNING),
        ("beta", None, TaskStatus.RUNNING),
        ("alpha", 17, TaskStatus.RUNNING),
    ],
)
def test_states(surface: str, state: object, status: TaskStatus) -> None:
    key = "state" if surface == "alpha" else "status"
    id_key = "taskId" if surface == "alpha" else "id"
    body = {"code": 200, "data": {id_key: "5", key: state}}
    task = surfaces.read_task(surface, reply(200, body), "5", NOW)  # type: ignore[arg-type]
    assert task.status is status


def test_cancelled_without_error_gets_the_pinned_error() -> None:
    body = {"code": 200, "data": {"id": "5", "status": "cancelled"}}
    task = surfaces.read_task("beta", reply(200, body), "5", NOW)
    assert task.error is not None
    assert (task.error.code, task.error.message) == ("cancelled", "The task was cancelled.")


@pytest.mark.parametrize(
    ("value", "urls"),
    [
        ('{"resultUrls": ["https://x/1.png"]}', ["https://x/1.png"]),
        ('{"urls": ["https://x/1.png"]}', ["https://x/1.png"]),
        (
            '{"images": [{"url": "https://x/1.png"}, {"url": ["https://x/2.png"]}]}',
            ["https://x/1.png", "https://x/2.png"],
        ),
        ('{"resultUrls": "https://x/1.png"}', ["https://x/1.png"]),
        (
            '{"resultUrls": ["https://x/1.png", "https://x/1.png", 3, null, "ftp://x"]}',
            ["https://x/1.png"],
        ),
        ("", []),
        ("not json", []),
        ("[1, 2]", []),
        ("null", []),
        (None, []),
        ({"resultUrls": ["https://x/1.png"]}, ["https://x/1.png"]),
        (17, []),
    ],
)
def test_result_json_is_parsed_leniently(value: object, urls: list[str]) -> None:
    assert surfaces.result_urls(value) == urls


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (50, 50),
        ("50", 50),
        (49.7, 49),
        (150, 100),
        (-3, 0),
        ("x", None),
        (None, None),
        (True, None),
        (float("nan"), None),
        ([], None),
    ],
)
def test_progress(value: object, expected: int | None) -> None:
    assert surfaces.progress(value) == expected


@pytest.mark.parametrize(
    "body",
    [
        {"code": 200},
        {"code": 200, "data": None},
        {"code": 200, "data": []},
        {"code": 200, "data": [{"task_id": "007"}]},
        {"code": 200, "data": [{"task_id": "1"}, {"task_id": "2"}]},
        [],
        "text",
    ],
)
def test_unreadable_submit_replies_are_retryable_server_errors(body: Any) -> None:
    with pytest.raises(ServerError) as info:
        surfaces.read_submit("beta", reply(200, body), "key", NOW)
    assert info.value.code == "malformed_response"


def test_a_record_for_another_task_is_malformed() -> None:
    with pytest.raises(ServerError):
        surfaces.read_task("beta", reply(200, {"code": 200, "data": {"id": "9"}}), "5", NOW)


def test_replayed_header_is_reported() -> None:
    body = {"code": 200, "data": [{"status": "submitted", "task_id": "3"}]}
    sub = surfaces.read_submit("beta", reply(200, body, idempotent_replayed="true"), "k", NOW)
    assert sub.replayed
    assert (sub.task_id, sub.idempotency_key, sub.surface) == ("3", "k", "beta")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
task_fields = st.fixed_dictionaries(
    {},
    optional={
        "id": st.sampled_from(["5", 5, None, "6"]),
        "taskId": st.sampled_from(["5", 5, None]),
        "state": json_values | st.sampled_from(["success", "fail", "waiting"]),
        "status": json_values | st.sampled_from(["completed", "failed", "processing"]),
        "progress": json_values,
        "resultJson": json_values | st.just('{"resultUrls": ["https://x"]}'),
        "result": json_values,
        "error": json_values,
        "failCode": json_values,
        "failMsg": json_values,
        "cost": json_values,
        "credits_cost": json_values,
        "creditsConsumed": json_values,
    },
)


@given(
    surface=st.sampled_from(["alpha", "beta"]),
    status=st.sampled_from([200, 200, 201, 400, 404, 429, 500]),
    code=json_values,
    data=task_fields | json_values,
)
@pytest.mark.slow
def test_garbage_never_crashes(surface: str, status: int, code: Any, data: Any) -> None:
    content = json.dumps({"code": code, "data": data}, allow_nan=True).encode()
    try:
        task = surfaces.read_task(surface, Reply(status, {}, content), "5", NOW)  # type: ignore[arg-type]
    except ImggwError:
        return
    assert task.id == "5"
    assert all(isinstance(u, str) for u in task.image_urls)


@given(st.binary(max_size=64))
def test_random_bytes_never_crash(content: bytes) -> None:
    for surface in ("alpha", "beta"):
        with contextlib.suppress(ImggwError):
            surfaces.read_task(surface, Reply(200, {}, content), "5", NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "secret", "carries", "shown"),
    [
        ("https://cdn.test/r/e.png", "e", False, "https://cdn.test/r/e.png"),  # chance
        ("https://cdn.test/r/1.png?key=e", "e", True, "https://cdn.test/r/1.png?key=[redacted]"),
        ("https://cdn.test/e/1.png", "e", True, "https://cdn.test/[redacted]/1.png"),
        ("https://cdn.test/r/1.png?k=a%2Fb", "a/b", True, "https://cdn.test/r/1.png?k=[redacted]"),
        (
            "https://cdn.test/x-sk-0123456789-y.png",
            "sk-0123456789",
            True,
            "https://cdn.test/x-[redacted]-y.png",
        ),
        ("https://cdn.test/r/1.png?key=ee", "e", False, "https://cdn.test/r/1.png?key=ee"),
    ],
)
def test_a_link_carries_a_key_only_as_a_whole_credential(
    url: str, secret: str, carries: bool, shown: str
) -> None:
    assert surfaces.carries_secret(url, (secret,)) is carries
    assert surfaces.redact_url(url, (secret,)) == shown


def test_links_with_the_key_are_kept_and_said_once_per_host(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(surfaces, "_key_hosts_told", set())
    links = {"resultUrls": ["https://cdn.test/a.png?key=e", "https://cdn.test/e.png"]}
    assert surfaces.result_urls(links, ("e",)) == links["resultUrls"]
    assert surfaces.result_urls(links, ("e",)) == links["resultUrls"]
    told = [r.getMessage() for r in caplog.records if "API key itself" in r.getMessage()]
    assert len(told) == 1
    assert "cdn.test" in told[0]
    assert "key=e" not in told[0]
