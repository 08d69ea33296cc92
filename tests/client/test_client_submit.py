"""Submit and get through both clients: exact requests, idempotency keys, retries, errors."""

from __future__ import annotations

import email.utils

import httpx
import pytest
import respx

from imggw_client import (
    APIConnectionError,
    AuthenticationError,
    ConfigurationError,
    IdempotencyConflictError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    RequestValidationError,
    ServerError,
    UnknownOutcomeError,
)

from ..conftest import (
    BASE_URL,
    CANARY_KEY,
    Driven,
    FakeTime,
    alpha_error,
    alpha_submitted,
    alpha_task,
    beta_error,
    beta_submitted,
    beta_task,
    body_of,
    make_client,
)

pytestmark = pytest.mark.anyio

BETA_SUBMIT = "/beta/v1/images/generations"
ALPHA_SUBMIT = "/alpha/api/v1/jobs/createTask"


async def test_beta_submit_sends_exactly_the_spec_request(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(return_value=beta_submitted("42"))
    sub = await client.submit("a red fox", aspect_ratio="16:9", resolution="2K")
    assert route.call_count == 1
    request = route.calls.last.request
    assert request.method == "POST"
    assert request.url == "http://gateway.test/beta/v1/images/generations"
    assert request.headers["authorization"] == f"Bearer {CANARY_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"].startswith("imggw-python/")
    key = request.headers["idempotency-key"]
    assert len(key) == 32
    assert body_of(request) == {
        "model": "imagegen-2",
        "prompt": "a red fox",
        "size": "16:9",
        "resolution": "2k",
        "n": 1,
    }
    assert (sub.task_id, sub.idempotency_key, sub.surface, sub.replayed) == (
        "42",
        key,
        "beta",
        False,
    )


async def test_alpha_submit_sends_exactly_the_spec_request(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(ALPHA_SUBMIT).mock(return_value=alpha_submitted("43"))
    sub = await client.submit("a red fox", aspect_ratio="1:1", resolution="2k", surface="alpha")
    request = route.calls.last.request
    assert request.headers["authorization"] == f"Bearer {CANARY_KEY}"
    assert "idempotency-key" in request.headers
    assert body_of(request) == {
        "model": "imagegen-2-text-to-image",
        "input": {"prompt": "a red fox", "resolution": "2K", "aspect_ratio": "1:1"},
    }
    assert (sub.task_id, sub.surface) == ("43", "alpha")


async def test_each_logical_submit_gets_its_own_key(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(return_value=beta_submitted())
    await client.submit("one")
    await client.submit("one")
    keys = [c.request.headers["idempotency-key"] for c in route.calls]
    assert len(set(keys)) == 2


async def test_callers_key_is_sent_as_given(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(return_value=beta_submitted())
    sub = await client.submit("x", idempotency_key="order-17/line-3")
    assert route.calls.last.request.headers["idempotency-key"] == "order-17/line-3"
    assert sub.idempotency_key == "order-17/line-3"


@pytest.mark.parametrize("key", ["", "a" * 256, "bad\nkey", "ключ", " padded "])
async def test_bad_callers_key_is_refused_before_sending(
    client: Driven, respx_gateway: respx.MockRouter, key: str
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(return_value=beta_submitted())
    with pytest.raises(RequestValidationError) as info:
        await client.submit("x", idempotency_key=key)
    assert info.value.field == "idempotency_key"
    assert route.call_count == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": " \t"}, "prompt"),
        ({"prompt": "x" * 20001}, "prompt"),
        ({"prompt": "x", "aspect_ratio": "7:5"}, "aspect_ratio"),
        ({"prompt": "x", "resolution": "8k"}, "resolution"),
        ({"prompt": "x", "aspect_ratio": "auto", "resolution": "2k"}, "resolution"),
        ({"prompt": "x", "aspect_ratio": "1:1", "resolution": "4k"}, "resolution"),
        ({"prompt": "x", "aspect_ratio": "9:21", "resolution": "2k"}, "resolution"),
    ],
)
async def test_invalid_requests_send_nothing(
    client: Driven, respx_gateway: respx.MockRouter, kwargs: dict[str, str], field: str
) -> None:
    respx_gateway.route().mock(return_value=beta_submitted())
    with pytest.raises(RequestValidationError) as info:
        await client.submit(**kwargs)
    assert info.value.field == field
    assert len(respx_gateway.calls) == 0


async def test_validate_false_sends_what_it_is_given(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(return_value=beta_error(422, "invalid_size"))
    with pytest.raises(InvalidRequestError) as info:
        await client.submit("x", aspect_ratio="7:5", resolution="8K", validate=False)
    assert body_of(route.calls.last.request)["size"] == "7:5"
    assert body_of(route.calls.last.request)["resolution"] == "8k"
    assert info.value.code == "invalid_size"
    assert route.call_count == 1  # 422 is not retried


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"aspect_ratio": 16}, "aspect_ratio"),
        ({"resolution": None}, "resolution"),
        ({"prompt": b"bytes"}, "prompt"),
    ],
)
async def test_validate_false_still_needs_text(
    client: Driven, respx_gateway: respx.MockRouter, kwargs: dict[str, object], field: str
) -> None:
    arguments: dict[str, object] = {"prompt": "a cat", **kwargs}
    with pytest.raises(RequestValidationError) as info:
        await client.submit(arguments.pop("prompt"), validate=False, **arguments)
    assert info.value.field == field
    assert len(respx_gateway.calls) == 0


@pytest.mark.parametrize(
    "fault",
    [
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("slow connect"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("dropped"),
        httpx.ReadError("reset"),
        httpx.Response(408),
        beta_error(409, "idempotency_in_progress", retry_after="1"),
        beta_error(429, "rate_limited", retry_after="2"),
        beta_error(500, "internal"),
        beta_error(502, "bad_gateway"),
        beta_error(503, "idempotency_unavailable"),
        beta_error(504, "timeout"),
        httpx.Response(200, content=b'{"code": 200, "data": [{"task_'),
        httpx.Response(200, content=b"<html>"),
    ],
    ids=lambda f: (
        type(f).__name__ if isinstance(f, Exception) else str(getattr(f, "status_code", f))
    ),
)
async def test_retryable_submit_faults_are_retried_with_the_same_key_and_body(
    client: Driven, respx_gateway: respx.MockRouter, fault: object
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(side_effect=[fault, fault, beta_submitted("77")])
    sub = await client.submit("a cat")
    assert sub.task_id == "77"
    assert route.call_count == 3
    keys = {c.request.headers["idempotency-key"] for c in route.calls}
    bodies = {c.request.content for c in route.calls}
    assert len(keys) == 1
    assert len(bodies) == 1
    assert sub.idempotency_key in keys
    assert len(client.fake.slept) == 2


@pytest.mark.parametrize(
    ("fault", "cls"),
    [
        (beta_error(400, "bad_request"), InvalidRequestError),
        (beta_error(401, "unauthorized"), AuthenticationError),
        (beta_error(422, "idempotency_key_reused"), IdempotencyConflictError),
        (beta_error(409, "idempotency_key_reused"), IdempotencyConflictError),
    ],
)
async def test_non_retryable_submit_errors_are_raised_after_one_attempt(
    client: Driven, respx_gateway: respx.MockRouter, fault: httpx.Response, cls: type
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(return_value=fault)
    with pytest.raises(cls) as info:
        await client.submit("a cat")
    assert route.call_count == 1
    assert info.value.status_code == fault.status_code
    assert info.value.surface == "beta"
    assert info.value.message == "refused"


@pytest.mark.parametrize("surface", ["alpha", "beta"])
async def test_a_submit_answered_404_is_a_wrong_base_url_not_a_missing_task(
    client: Driven, respx_gateway: respx.MockRouter, surface: str
) -> None:
    # A submit names no task: only its route can be missing, which is the base URL's fault.
    fault = beta_error(404, "not_found") if surface == "beta" else alpha_error(404, "no route")
    route = respx_gateway.post(BETA_SUBMIT if surface == "beta" else ALPHA_SUBMIT).mock(
        return_value=fault
    )
    with pytest.raises(ConfigurationError) as info:
        await client.submit("a cat", surface=surface)
    assert route.call_count == 1
    assert info.value.status_code == 404
    assert info.value.code == "not_found"
    assert f"no submit route at {BASE_URL}" in info.value.message
    assert not isinstance(info.value, NotFoundError)


async def test_alpha_error_on_http_200_is_detected(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(ALPHA_SUBMIT).mock(return_value=alpha_error(401, "bad key"))
    with pytest.raises(AuthenticationError) as info:
        await client.submit("a cat", surface="alpha")
    assert route.call_count == 1
    assert (info.value.status_code, info.value.surface) == (401, "alpha")


async def test_alpha_key_reused_from_msg(client: Driven, respx_gateway: respx.MockRouter) -> None:
    respx_gateway.post(ALPHA_SUBMIT).mock(
        return_value=alpha_error(422, "idempotency_key_reused: differs")
    )
    with pytest.raises(IdempotencyConflictError) as info:
        await client.submit("a cat", surface="alpha")
    assert info.value.code == "idempotency_key_reused"


async def test_alpha_retryable_body_code_on_http_200(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(ALPHA_SUBMIT).mock(
        side_effect=[alpha_error(500), alpha_submitted("5")]
    )
    assert (await client.submit("a cat", surface="alpha")).task_id == "5"
    assert route.call_count == 2


async def test_exhausted_unknown_submit_raises_unknown_outcome_with_key_and_request(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(side_effect=httpx.ReadTimeout("slow"))
    with pytest.raises(UnknownOutcomeError) as info:
        await client.submit("a cat", aspect_ratio="3:2", resolution="2k")
    err = info.value
    assert route.call_count == 4  # max_attempts=4 in the test client
    assert err.idempotency_key == route.calls.last.request.headers["idempotency-key"]
    assert (err.request.prompt, err.request.aspect_ratio, err.request.resolution) == (
        "a cat",
        "3:2",
        "2k",
    )
    assert err.surface == "beta"
    assert "a cat" not in str(err)
    assert isinstance(err.__cause__, Exception)

    # Resuming with the key is the safe retry: same key, same body.
    respx_gateway.post(BETA_SUBMIT).mock(return_value=beta_submitted("8"))
    sub = await client.submit(
        err.request.prompt,
        aspect_ratio=err.request.aspect_ratio,
        resolution=err.request.resolution,
        idempotency_key=err.idempotency_key,
    )
    assert sub.task_id == "8"
    assert route.calls.last.request.headers["idempotency-key"] == err.idempotency_key


async def test_a_submit_that_never_left_is_a_connection_error_not_unknown(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post(BETA_SUBMIT).mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(APIConnectionError) as info:
        await client.submit("a cat")
    assert info.value.request_sent is False


async def test_one_unknown_attempt_makes_the_whole_submit_unknown(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post(BETA_SUBMIT).mock(
        side_effect=[
            httpx.ReadTimeout("x"),
            httpx.ConnectError("y"),
            httpx.ConnectError("y"),
            httpx.ConnectError("y"),
        ]
    )
    with pytest.raises(UnknownOutcomeError):
        await client.submit("a cat")


async def test_indeterminate_reason_stops_at_once_keeping_the_key(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(
        return_value=beta_error(500, "idempotency_result_indeterminate")
    )
    with pytest.raises(UnknownOutcomeError) as info:
        await client.submit("a cat")
    assert route.call_count == 1
    assert info.value.code == "idempotency_result_indeterminate"


async def test_retry_after_seconds_is_honoured(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post(BETA_SUBMIT).mock(
        side_effect=[beta_error(429, "rate_limited", retry_after="7"), beta_submitted()]
    )
    await client.submit("a cat")
    assert len(client.fake.slept) == 1
    assert 7.0 <= client.fake.slept[0] <= 7.7


async def test_retry_after_http_date_is_honoured(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    # The date is read against the client's wall clock, stopped here: the delay it finds does
    # not shrink by however long the test took between writing the date and reading it.
    now = 1_700_000_000.0
    client.inner._flows.wall = lambda: now
    when = email.utils.formatdate(now + 20, usegmt=True)
    respx_gateway.post(BETA_SUBMIT).mock(
        side_effect=[beta_error(503, "overloaded", retry_after=when), beta_submitted()]
    )
    await client.submit("a cat")
    assert 18.0 <= client.fake.slept[0] <= 22.5


async def test_retry_after_beyond_the_cap_ends_in_rate_limit_error(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.post(BETA_SUBMIT).mock(
        return_value=beta_error(429, "rate_limited", retry_after="3600")
    )
    with pytest.raises(RateLimitError) as info:
        await client.submit("a cat")
    assert route.call_count == 1
    assert info.value.retry_after == 3600.0
    assert client.fake.slept == []


async def test_backoff_between_attempts_is_jittered_and_capped(
    kind: str, fake_time: FakeTime, respx_gateway: respx.MockRouter
) -> None:
    from imggw_client import RetryPolicy

    driven = make_client(
        kind, fake_time, retry=RetryPolicy(max_attempts=8, initial_backoff=1.0, max_backoff=4.0)
    )
    respx_gateway.get("/beta/v1/tasks/42").mock(
        side_effect=[httpx.Response(500)] * 7 + [beta_task("42")]
    )
    await driven.get("42")
    caps = [1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert len(fake_time.slept) == 7
    assert all(0 <= s <= cap for s, cap in zip(fake_time.slept, caps, strict=True))
    await driven.close()


async def test_get_sends_the_spec_queries(client: Driven, respx_gateway: respx.MockRouter) -> None:
    beta = respx_gateway.get("/beta/v1/tasks/42").mock(
        return_value=beta_task("42", "processing", progress=40)
    )
    alpha = respx_gateway.get("/alpha/api/v1/jobs/recordInfo").mock(
        return_value=alpha_task("42", "waiting")
    )
    task_b = await client.get("42")
    task_a = await client.get("42", surface="alpha")
    assert beta.calls.last.request.headers["authorization"] == f"Bearer {CANARY_KEY}"
    assert alpha.calls.last.request.url.params["taskId"] == "42"
    assert alpha.calls.last.request.content == b""
    assert (task_b.status.value, task_b.progress, task_b.surface) == ("running", 40, "beta")
    assert (task_a.status.value, task_a.surface) == ("pending", "alpha")


@pytest.mark.parametrize("task_id", ["0", "01", "../42", "42/../../x", "", "abc"])
async def test_bad_task_ids_are_refused_before_sending(
    client: Driven, respx_gateway: respx.MockRouter, task_id: str
) -> None:
    with pytest.raises(RequestValidationError) as info:
        await client.get(task_id)
    assert info.value.field == "task_id"
    assert len(respx_gateway.calls) == 0


async def test_get_retries_run_out_into_the_last_error(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    route = respx_gateway.get("/beta/v1/tasks/42").mock(return_value=beta_error(502, "bad_gateway"))
    with pytest.raises(ServerError):
        await client.get("42")
    assert route.call_count == 4
