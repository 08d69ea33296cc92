"""What a hurried caller does: a callback that raises or is no function, a client closed under
a call, one task id given where a list belongs. Every mistake that can be seen before a request
is refused before it (nothing sent, nothing billed); every call that ends after its submit was
answered names the task it paid for. Both clients, on respx."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import respx

from imggw_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    ClientClosedError,
    ConfigurationError,
    RequestValidationError,
    Submission,
    Task,
    _io_sync,
)

from ..conftest import BASE_URL, Driven, beta_done, beta_submitted, beta_task

pytestmark = pytest.mark.anyio

SUBMIT = "/beta/v1/images/generations"
QUERY = "/beta/v1/tasks/42"


class AppBug(Exception):
    """The caller's own error, raised in its callback."""


def raising(_: object) -> None:
    raise AppBug("the app's database is down")


def named_the_task(err: BaseException) -> bool:
    notes = getattr(err, "__notes__", [])
    return any("task 42" in note and "client.wait('42'" in note for note in notes)


@pytest.mark.parametrize("callback", ["on_submit", "on_update"])
async def test_a_callback_that_raises_after_the_submit_names_the_paid_task(
    client: Driven, respx_gateway: respx.MockRouter, callback: str
) -> None:
    respx_gateway.post(SUBMIT).mock(return_value=beta_submitted())
    respx_gateway.get(QUERY).mock(return_value=beta_task())
    with pytest.raises(AppBug) as info:
        await client.generate("a cat", **{callback: raising})
    assert named_the_task(info.value)  # the caller's own error, with the task it paid for
    assert respx_gateway.routes[0].call_count == 1  # one submit: never sent again


async def test_a_client_closed_while_generate_waits_names_the_paid_task(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post(SUBMIT).mock(return_value=beta_submitted())
    inner = client.inner

    def closing(request: Any) -> Any:  # a shutdown hook closes the client mid-wait
        if isinstance(inner, Client):
            inner.close()
        return beta_task()

    async def aclosing(request: Any) -> Any:
        assert isinstance(inner, AsyncClient)
        await inner.close()
        return beta_task()

    respx_gateway.get(QUERY).mock(side_effect=closing if isinstance(inner, Client) else aclosing)
    with pytest.raises(ClientClosedError) as info:
        await client.generate("a cat")
    assert named_the_task(info.value)


async def test_a_key_revoked_while_generate_waits_names_the_paid_task(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    respx_gateway.post(SUBMIT).mock(return_value=beta_submitted())
    refused = {"code": 401, "error": {"code": "unauthorized", "message": "key revoked"}}
    respx_gateway.get(QUERY).respond(401, json=refused)
    with pytest.raises(AuthenticationError) as info:
        await client.generate("a cat")
    assert named_the_task(info.value)


@pytest.mark.parametrize(
    ("callback", "value"),
    [("on_submit", "print"), ("on_update", 1), ("on_submit", None.__class__)],
)
async def test_a_callback_that_is_no_function_is_refused_before_the_submit(
    client: Driven, respx_gateway: respx.MockRouter, callback: str, value: object
) -> None:
    route = respx_gateway.post(SUBMIT).mock(return_value=beta_submitted())
    if value is None.__class__:
        value = object()
    with pytest.raises(RequestValidationError) as info:
        await client.generate("a cat", **{callback: value})
    assert info.value.field == callback
    assert route.call_count == 0


async def test_an_async_callback_given_to_a_client_is_refused_before_the_submit(
    respx_gateway: respx.MockRouter,
) -> None:
    async def keep(submission: Submission) -> None:
        raise AssertionError("never awaited by a Client, so never run")

    class Keeper:
        async def __call__(self, submission: Submission) -> None:
            raise AssertionError("never awaited")

    route = respx_gateway.post(SUBMIT).mock(return_value=beta_submitted())
    respx_gateway.get(QUERY).mock(return_value=beta_done())
    with Client(api_key="sk-test-key", base_url=BASE_URL) as client:
        for callback in (keep, Keeper()):
            with pytest.raises(RequestValidationError, match="async def") as info:
                client.generate("a cat", on_submit=callback)
            assert info.value.field == "on_submit"
        # A plain function that hands back a coroutine: its submit was sent, so the error
        # names the task; the coroutine is closed, never left unawaited.
        with pytest.raises(RequestValidationError, match="awaitable") as late:
            client.generate("a cat", on_submit=lambda sub: keep(sub))
    assert named_the_task(late.value)
    assert route.call_count == 1


@pytest.mark.parametrize("items", ["42", b"42", {"id": "42"}, 42, None])
async def test_as_completed_refuses_one_item_where_a_list_belongs(
    client: Driven, respx_gateway: respx.MockRouter, items: object
) -> None:
    route = respx_gateway.get(url__regex=r"/beta/v1/tasks/.*").mock(
        side_effect=lambda request: beta_done(request.url.path.rsplit("/", 1)[1])
    )
    with pytest.raises(RequestValidationError) as info:
        async for _ in _each(client, items):
            pass
    assert info.value.field == "items"
    assert route.call_count == 0  # "42" never became the waits of tasks "4" and "2"


async def test_as_completed_refuses_a_lone_task_and_items_of_another_kind(
    client: Driven, respx_gateway: respx.MockRouter
) -> None:
    task = Task(id="42", surface="beta", status="running")
    for items in (task, [{"id": "42"}], [42]):
        with pytest.raises(RequestValidationError) as info:
            async for _ in _each(client, items):
                pass
        assert info.value.field == "items"


async def _each(client: Driven, items: object) -> Any:
    """``as_completed(items)``'s tasks, from either client."""
    inner = client.inner
    if isinstance(inner, Client):
        for task in inner.as_completed(items):  # type: ignore[arg-type]
            yield task
    else:
        async for task in inner.as_completed(items):  # type: ignore[arg-type]
            yield task


async def test_a_closed_client_says_so_for_downloads_and_journaled_submits(
    kind: str, respx_gateway: respx.MockRouter, tmp_path: Any
) -> None:
    cls = Client if kind == "sync" else AsyncClient
    inner = cls(api_key="sk-test-key", base_url=BASE_URL, journal=tmp_path / "j.sqlite")
    client = Driven(inner)
    done = Task(
        id="42", surface="beta", status="succeeded", image_urls=["http://cdn.test/42-0.png"]
    )
    await client.close()
    with pytest.raises(ClientClosedError):
        await client.submit("a cat")
    with pytest.raises(ClientClosedError):
        await client.download(done, tmp_path)
    with pytest.raises(ClientClosedError):
        await client.generate("a cat")
    with pytest.raises(ClientClosedError):
        await client.unfinished()
    assert not respx_gateway.calls


def test_ctrl_c_reaches_a_client_caller_without_waiting_for_the_calls_in_flight() -> None:
    """A Client's concurrent calls run in threads: Ctrl-C (KeyboardInterrupt in the caller's
    thread, here from the first call) is raised at once, while a call in flight still runs."""
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def call(item: int) -> int:
        if item == 0:
            started.wait(30)  # Ctrl-C comes once the other call is in flight
            raise KeyboardInterrupt
        started.set()
        release.wait(30)  # a call in flight: the caller must not wait for it
        finished.set()
        return item

    with pytest.raises(KeyboardInterrupt):
        _io_sync.map_concurrently(call, [0, 1], limit=2)
    assert not finished.is_set()  # raised while the other call was still in flight
    release.set()
    assert finished.wait(30)  # which then ends on its own


@pytest.mark.parametrize("dest_dir", [None, 1, b"out", ["out"], "out\ud800"])
async def test_a_download_folder_that_is_no_path_is_refused_before_any_fetch(
    client: Driven, respx_gateway: respx.MockRouter, dest_dir: object
) -> None:
    done = Task(
        id="42", surface="beta", status="succeeded", image_urls=["http://cdn.test/42-0.png"]
    )
    cdn = respx.get("http://cdn.test/42-0.png").respond(200, content=b"x")
    with pytest.raises(RequestValidationError) as info:
        await client.download(done, dest_dir)
    assert info.value.field == "dest_dir"
    assert cdn.call_count == 0


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_a_journal_path_no_file_system_can_hold_is_a_configuration_error(
    cls: type[Client] | type[AsyncClient], tmp_path: Any
) -> None:
    with pytest.raises(ConfigurationError) as info:
        cls(api_key="sk-test-key", base_url=BASE_URL, journal=f"{tmp_path}/j\ud800.sqlite")
    assert info.value.code == "journal_unusable"


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_a_folder_given_as_a_clients_journal_is_named_as_a_folder(
    cls: type[Client] | type[AsyncClient], tmp_path: Any
) -> None:
    # Before, an AsyncClient called an empty folder "a batch folder's ledger", and a Client
    # named a ledger.sqlite no one had made.
    with pytest.raises(ConfigurationError) as info:
        cls(api_key="sk-test-key", base_url=BASE_URL, journal=tmp_path)
    assert info.value.code == "journal_unusable"
    assert str(info.value) == (
        f"the journal {tmp_path} is a folder: name a file, such as "
        f"{tmp_path / 'journal.sqlite'}; a client needs a journal of its own"
    )
    assert list(tmp_path.iterdir()) == []  # nothing made in it


async def test_redact_takes_what_a_log_line_is_built_from(client: Driven) -> None:
    key = client.inner._settings.api_key
    err = AuthenticationError(f"the key {key} is revoked", status_code=401)
    assert client.inner.redact(err) == "the key [redacted] is revoked"
    assert client.inner.redact(None) == "None"
    assert client.inner.redact(f"x{key}x") == "x[redacted]x"
