"""What an application meets without asking (DESIGN 21): a quiet logger (``NullHandler``) that
``IMGGW_LOG`` turns on, never with the key; tasks that hash; statuses that print as their
values; and a client dropped unclosed that closes its own connections."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from imggw_client import AsyncClient, Client, Task, TaskStatus
from imggw_client.batch import LineState

from ..conftest import CANARY_KEY

# ---------------------------------------------------------------------------- logging


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("IMGGW_LOG", "IMGGW_API_KEY")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
        env={**environ, **env},
        timeout=60,
    )


# A generate against the in-process gateway, half of whose answers are 503s (retries, said at
# INFO; the seed makes it the same run every time), then a line that would carry the key if
# anything logged it.
PROGRAM = f"""
    import logging
    from imggw_client import PollPolicy, RetryPolicy
    from imggw_client.mock import MockGateway

    gateway = MockGateway(api_keys=[{CANARY_KEY!r}], duration_min=0, duration_max=0,
                          faults=["503"], fault_rate=0.5, seed=1)
    with gateway.client(poll=PollPolicy(initial_interval=0.01, max_interval=0.02),
                        retry=RetryPolicy(max_attempts=20, initial_backoff=0.01,
                                          max_backoff=0.02)) as client:
        task = client.generate("a fox")
    logging.getLogger("imggw_client").warning("a careless line: %s", {CANARY_KEY!r})
    print(task.status)
"""


def test_an_application_without_logging_hears_nothing_from_the_sdk() -> None:
    done = run_python("""
        import logging, imggw_client
        assert any(type(h) is logging.NullHandler
                   for h in logging.getLogger("imggw_client").handlers)
        logging.getLogger("imggw_client").warning("a warning nobody asked to see")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # logging's last resort would have printed it


@pytest.mark.parametrize("level", ["debug", "INFO"])
def test_imggw_log_writes_the_sdks_records_to_stderr_never_the_key(level: str) -> None:
    done = run_python(PROGRAM, IMGGW_LOG=level)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "succeeded"
    lines = done.stderr.splitlines()
    assert lines, "IMGGW_LOG asked for records on stderr"
    assert all(line.startswith("[") and " imggw_client" in line for line in lines), lines
    assert any(" INFO imggw_client] retrying " in line for line in lines)
    requests = [line for line in lines if " DEBUG " in line and "POST /beta/" in line]
    assert bool(requests) is (level == "debug")  # each request at DEBUG only
    assert any("a careless line: [redacted]" in line for line in lines)
    assert CANARY_KEY not in done.stderr


def test_without_imggw_log_the_same_program_writes_nothing() -> None:
    done = run_python(PROGRAM)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "succeeded", "")


def test_an_unknown_imggw_log_level_changes_nothing() -> None:
    done = run_python(PROGRAM, IMGGW_LOG="verbose")
    assert (done.returncode, done.stderr) == (0, "")


# ---------------------------------------------------------------------------- values


def test_tasks_hash_and_equal_tasks_hash_alike() -> None:
    def task(status: TaskStatus = TaskStatus.SUCCEEDED, **more: Any) -> Task:
        return Task(
            id="42",
            surface="beta",
            status=status,
            image_urls=["http://x/1.png"],
            raw={"id": "42"},
            **more,
        )

    assert hash(task()) == hash(task())
    assert {task(), task()} == {task()}
    assert len({task(), task(TaskStatus.RUNNING), task(progress=50)}) == 3
    by_task = {task(): "saved"}
    assert by_task[task()] == "saved"


@pytest.mark.parametrize("status", list(TaskStatus))
def test_a_task_status_prints_and_formats_as_its_value(status: TaskStatus) -> None:
    assert f"{status}" == str(status) == status.value
    assert f"{status:>12}" == f"{status.value:>12}"
    assert "%s" % status == status.value  # noqa: UP031 - the old way too
    assert status == status.value  # still the string it was


@pytest.mark.parametrize("state", list(LineState))
def test_a_batch_line_state_formats_as_its_value(state: LineState) -> None:
    assert f"{state}" == str(state) == state.value
    assert f"{state:<12}|" == f"{state.value:<12}|"


# ---------------------------------------------------------------------------- dropped clients


def resource_warnings(act: Callable[[], None]) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        act()
        gc.collect()
    return [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]


def test_a_client_dropped_unclosed_closes_its_connections(
    shared_gateway_url: str,
) -> None:
    def drop() -> None:
        client = Client(api_key="test-key", base_url=shared_gateway_url)
        sub = client.submit("a fox")  # a pooled keep-alive connection
        copy = client.with_options(timeout=5)
        del client
        gc.collect()
        assert copy.get(sub.task_id).id == sub.task_id  # the copy's pool is still open
        del copy

    assert resource_warnings(drop) == []


def test_a_client_closed_by_hand_then_dropped_is_fine_too(
    shared_gateway_url: str,
) -> None:
    def drop() -> None:
        client = Client(api_key="test-key", base_url=shared_gateway_url)
        client.submit("a fox")
        client.close()
        del client

    assert resource_warnings(drop) == []


def test_an_async_client_dropped_unclosed_in_its_loop_closes_its_connections(
    shared_gateway_url: str,
) -> None:
    async def main() -> None:
        client = AsyncClient(api_key="test-key", base_url=shared_gateway_url)
        await client.submit("a fox")
        http = client._http
        del client
        gc.collect()
        for _ in range(20):  # the close runs as a task of this loop
            if http.is_closed:
                break
            await asyncio.sleep(0)
        assert http.is_closed

    assert resource_warnings(lambda: asyncio.run(main())) == []


def test_a_callers_own_http_client_is_never_closed_by_a_dropped_client(
    shared_gateway_url: str,
) -> None:
    import httpx

    with httpx.Client() as http:
        client = Client(api_key="test-key", base_url=shared_gateway_url, http_client=http)
        client.submit("a fox")
        del client
        gc.collect()
        assert not http.is_closed
