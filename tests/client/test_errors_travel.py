"""Errors travel, and their recipes keep their surface (DESIGN 18, issue 27 items 9 and 10).

Every exported error survives ``pickle`` with all its fields, so a worker process's error
reaches its parent whole (not as ``BrokenProcessPool``). ``client.wait(err)`` resumes a wait
that timed out, on the surface it asked (a per-call ``surface=`` included), and
``client.submit(err)`` resends an unknown outcome's identical request with the same key and
surface: the gateway replays it.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

import imggw_client
import imggw_client.batch
from imggw_client import (
    Client,
    ImageRequest,
    ImggwError,
    PollPolicy,
    RequestValidationError,
    RetryPolicy,
    Submission,
    Task,
    TaskError,
    TaskStatus,
    UnknownOutcomeError,
    WaitTimeoutError,
)
from imggw_client._core import spec
from imggw_client.batch import BadLine
from imggw_client.mock import MockGateway

KEY = "test-key"
FAST = PollPolicy(initial_interval=0.01, max_interval=0.02)
SUB = Submission(
    task_id="7",
    idempotency_key="k" * 32,
    surface="alpha",
    replayed=False,
    resolution="2k",
    submitted_at=datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc),
)
TASK = Task(
    id="7",
    surface="alpha",
    status=TaskStatus.RUNNING,
    progress=40,
    credits=4.0,
    raw={"code": 200, "data": {"taskId": "7"}},
)
FAILED = Task(
    id="8",
    surface="beta",
    status=TaskStatus.FAILED,
    error=TaskError(code="content_policy", message="refused"),
)
REQUEST = ImageRequest("a lighthouse", "3:2", "2k")


pytestmark = pytest.mark.gateway(api_keys=[KEY], manual_clock=True)  # tasks run only when told


def samples() -> dict[type[BaseException], ImggwError]:
    """One of each error a user can meet, every field set (not left at its default)."""
    sdk, batch = imggw_client, imggw_client.batch
    api = {"status_code": 418, "code": "teapot", "surface": "beta", "retry_after": 2.5}
    made: list[ImggwError] = [
        sdk.ImggwError("m", status_code=500, code="c", surface="alpha"),
        sdk.ConfigurationError("bad base URL", status_code=404, code="not_found", surface="beta"),
        sdk.ClientClosedError("closed", request_sent=True),
        sdk.RequestValidationError(
            "resolution",
            "4k needs 1:1",
            code="unsupported_combination",
            errors=[("resolution", "4k needs 1:1"), ("prompt", "x")],
        ),
        sdk.APIConnectionError("no route", request_sent=True, surface="alpha"),
        sdk.APITimeoutError("slow", request_sent=False, surface="beta"),
        *(
            cls("refused", **api)
            for cls in (  # type: ignore[arg-type]
                sdk.APIError,
                sdk.InvalidRequestError,
                sdk.AuthenticationError,
                sdk.InsufficientCreditsError,
                sdk.PermissionDeniedError,
                sdk.NotFoundError,
                sdk.ConflictError,
                sdk.IdempotencyConflictError,
                sdk.RateLimitError,
                sdk.ServerError,
            )
        ),
        sdk.UnknownOutcomeError(
            "unknown",
            idempotency_key="k" * 32,
            request=REQUEST,
            surface="alpha",
            status_code=503,
            code="service_unavailable",
        ),
        sdk.TaskFailedError(FAILED),
        sdk.WaitTimeoutError("7", TASK, timeout=60.0, surface="alpha", submission=SUB),
        sdk.ResultExpiredError("gone", status_code=410, code="result_expired", surface="beta"),
        sdk.DownloadError("disk full", code="write_failed", surface="alpha"),
        batch.BatchInputError(
            [BadLine(3, "not JSON"), BadLine(9, "no prompt")], 12, listing=Path("out/bad-lines.txt")
        ),
        batch.InputChangedError(
            [4, 5], 2, removed=[9], removed_count=1, surfaces=("alpha", "beta")
        ),
        batch.BatchLockedError("locked", code="locked"),
        batch.KeyChangedError("out", "a1" * 32, "b2" * 32),
        batch.StorageError("cannot write out/ledger.sqlite (disk full)", code="storage_failed"),
    ]
    return {type(err): err for err in made}


def exported_errors() -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in (imggw_client, imggw_client.batch):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                found.add(obj)
    return found


def test_every_exported_error_has_a_sample() -> None:
    exported = exported_errors()
    assert ImggwError in exported
    assert UnknownOutcomeError in exported
    assert exported - set(samples()) == set(), "add a sample of each new error above"


@pytest.mark.parametrize(
    "cls", sorted(samples(), key=lambda c: c.__name__), ids=lambda c: c.__name__
)
def test_every_error_survives_pickle_with_all_its_fields(cls: type[ImggwError]) -> None:
    err = samples()[cls]
    err.add_note("a note goes along")
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol))
        assert type(back) is cls
        assert vars(back) == vars(err)
        assert (back.args, str(back), repr(back)) == (err.args, str(err), repr(err))
        assert back.__notes__ == ["a note goes along"]


def test_the_fields_named_by_the_design_travel() -> None:
    timed_out = pickle.loads(pickle.dumps(samples()[WaitTimeoutError]))
    # Every field of the last task seen, but the gateway's record (which may echo the key).
    seen = TASK.model_copy(update={"raw": {}})
    assert (timed_out.task_id, timed_out.last_task, timed_out.surface) == ("7", seen, "alpha")
    assert timed_out.submission.model_dump() == SUB.model_dump()
    unknown = pickle.loads(pickle.dumps(samples()[UnknownOutcomeError]))
    assert (unknown.idempotency_key, unknown.request, unknown.surface) == (
        "k" * 32,
        REQUEST,
        "alpha",
    )
    assert (unknown.status_code, unknown.code) == (503, "service_unavailable")
    failed = pickle.loads(pickle.dumps(samples()[imggw_client.TaskFailedError]))
    assert failed.task == FAILED
    assert failed.code == "content_policy"
    limited = pickle.loads(pickle.dumps(samples()[imggw_client.RateLimitError]))
    assert limited.retry_after == 2.5


def test_a_submission_leaves_its_monotonic_time_behind() -> None:
    """Another process has another clock: there a wait goes by ``submitted_at``."""
    sub = SUB.model_copy()
    sub._accepted_at = 1234.5
    back = pickle.loads(pickle.dumps(sub))
    assert back._accepted_at is None
    assert back.model_dump() == sub.model_dump()


# ---------------------------------------------------------------------------- over a socket


def queries(gateway: MockGateway, surface: spec.Surface) -> int:
    return int(gateway.stats()["requests"].get(f"GET {spec.of(surface).query_path}", 0))


def generate_in_a_child(url: str) -> Task:
    """In a worker process: a generate on alpha from a beta client, whose wait times out."""
    with Client(api_key=KEY, base_url=url, poll=FAST) as client:
        return client.generate(
            "a lighthouse", aspect_ratio="1:1", resolution="2k", surface="alpha", wait_timeout=0.1
        )


@pytest.mark.slow
def test_a_child_process_wait_timeout_reaches_the_parent_whole(
    gateway: MockGateway, gateway_url: str
) -> None:
    context = multiprocessing.get_context("spawn")  # no fork of a process with server threads
    with (
        ProcessPoolExecutor(max_workers=1, mp_context=context) as pool,
        pytest.raises(WaitTimeoutError) as info,  # before: BrokenProcessPool, the task id lost
    ):
        pool.submit(generate_in_a_child, gateway_url).result(timeout=120)
    err = info.value
    assert err.task_id == "1"
    assert err.surface == "alpha"
    assert err.submission is not None
    assert (err.submission.task_id, err.submission.surface) == ("1", "alpha")
    assert err.submission.resolution == "2k"
    assert err.last_task is not None
    assert err.last_task.status is TaskStatus.PENDING
    gateway.advance(3600)
    with Client(api_key=KEY, base_url=gateway_url, poll=FAST) as client:  # beta by default
        task = client.wait(err, wait_timeout=30)
    assert (task.id, task.surface, task.status) == ("1", "alpha", TaskStatus.SUCCEEDED)
    assert gateway.stats()["tasks_created"] == 1


@pytest.mark.parametrize(
    "again", [lambda err: err, lambda err: err.submission], ids=["err", "err.submission"]
)
def test_waiting_again_asks_the_surface_of_the_call_that_timed_out(
    gateway: MockGateway, gateway_url: str, again: Callable[[WaitTimeoutError], object]
) -> None:
    with Client(api_key=KEY, base_url=gateway_url, poll=FAST) as client:
        assert client.surface == "beta"
        with pytest.raises(WaitTimeoutError) as info:
            client.generate("a lighthouse", surface="alpha", wait_timeout=0.05)
        gateway.advance(3600)
        task = client.wait(again(info.value), wait_timeout=30)  # type: ignore[arg-type]
    assert (task.id, task.surface, task.status) == ("1", "alpha", TaskStatus.SUCCEEDED)
    assert queries(gateway, "beta") == 0  # beta would answer 404, which invites a resubmit


def test_a_wait_on_a_task_id_times_out_with_its_surface(
    gateway: MockGateway, gateway_url: str
) -> None:
    with Client(api_key=KEY, base_url=gateway_url, poll=FAST) as client:
        sub = client.submit("a lighthouse", surface="alpha")
        with pytest.raises(WaitTimeoutError) as info:
            client.wait(sub.task_id, surface="alpha", wait_timeout=0.05)
        err = info.value
        assert (err.surface, err.submission) == ("alpha", None)  # a bare id: no key known
        gateway.advance(3600)
        assert client.wait(err, wait_timeout=30).surface == "alpha"
    assert queries(gateway, "beta") == 0


def test_an_unknown_outcome_is_resent_on_its_surface_and_replayed(
    gateway: MockGateway, gateway_url: str
) -> None:
    gateway.configure(fault_rate=1.0, faults=("lost",))  # made, then the answer is lost
    with Client(api_key=KEY, base_url=gateway_url, retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(UnknownOutcomeError) as info:
            client.submit("a lighthouse", aspect_ratio="3:2", resolution="2k", surface="alpha")
        err = pickle.loads(pickle.dumps(info.value))  # from another process, say
        assert gateway.stats()["tasks_created"] == 1
        gateway.configure(fault_rate=0.0)
        with pytest.raises(RequestValidationError):  # another surface would bill anew
            client.submit(err, surface="beta")
        with pytest.raises(RequestValidationError):  # no task to wait on yet
            client.wait(err)  # type: ignore[arg-type]
        sub = client.submit(err)
    assert (sub.surface, sub.idempotency_key, sub.replayed) == ("alpha", err.idempotency_key, True)
    assert sub.resolution == "2k"
    assert gateway.stats()["tasks_created"] == 1
    assert gateway.stats()["conflicts"] == 0
