"""download through both clients: verified atomic files, no credentials, expiry, bounds."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import respx

from imggw_client import (
    FILE_EXISTS,
    AsyncClient,
    Client,
    DownloadError,
    ResultExpiredError,
    ServerError,
    Task,
    TaskError,
    TaskFailedError,
    TaskStatus,
)

from ..conftest import BASE_URL, CANARY_KEY, CDN, PNG, Driven, FakeTime, beta_done, make_client

pytestmark = pytest.mark.anyio

JPEG = b"\xff\xd8\xff\xe0" + b"j" * 500 + b"\xff\xd9"  # SOI ... EOI


def done(*urls: str, task_id: str = "42") -> Task:
    return Task(id=task_id, surface="beta", status=TaskStatus.SUCCEEDED, image_urls=list(urls))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


async def test_saves_every_result_verified_and_named_by_task_and_index(
    client: Driven, tmp_path: Path
) -> None:
    with respx.mock(assert_all_called=True) as cdn:
        first = cdn.get(f"{CDN}/a/first.png").mock(return_value=httpx.Response(200, content=PNG))
        second = cdn.get(f"{CDN}/b/second").mock(return_value=httpx.Response(200, content=JPEG))
        files = await client.download(
            done(f"{CDN}/a/first.png", f"{CDN}/b/second"), tmp_path / "out"
        )
    assert [f.path.name for f in files] == ["42-0.png", "42-1.jpg"]
    assert files[0].path.read_bytes() == PNG
    assert files[0].sha256 == hashlib.sha256(PNG).hexdigest()
    assert (files[0].size, files[1].size) == (len(PNG), len(JPEG))
    assert files[1].url == f"{CDN}/b/second"
    for route in (first, second):
        headers = route.calls.last.request.headers
        assert "authorization" not in headers
        assert CANARY_KEY not in str(headers)
    assert leftovers(tmp_path / "out") == []


async def test_no_credentials_after_a_redirect_either(client: Driven, tmp_path: Path) -> None:
    with respx.mock() as cdn:
        hop = cdn.get(f"{CDN}/r/1").mock(
            return_value=httpx.Response(302, headers={"Location": "http://other.test/final.png"})
        )
        final = cdn.get("http://other.test/final.png").mock(
            return_value=httpx.Response(200, content=PNG)
        )
        files = await client.download(done(f"{CDN}/r/1"), tmp_path)
    assert files[0].path.read_bytes() == PNG
    for route in (hop, final):
        assert "authorization" not in route.calls.last.request.headers


async def test_redirect_to_the_gateway_host_carries_no_key(client: Driven, tmp_path: Path) -> None:
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/r/1").mock(
            return_value=httpx.Response(302, headers={"Location": f"{BASE_URL}/files/1.png"})
        )
        gateway = cdn.get(f"{BASE_URL}/files/1.png").mock(
            return_value=httpx.Response(200, content=PNG)
        )
        await client.download(done(f"{CDN}/r/1"), tmp_path)
    assert "authorization" not in gateway.calls.last.request.headers


@pytest.mark.parametrize("status", [403, 404, 410])
async def test_a_dead_link_that_stays_dead_ends_after_one_more_query(
    client: Driven, tmp_path: Path, status: int
) -> None:
    with respx.mock() as cdn:
        route = cdn.get(f"{CDN}/x.png").mock(return_value=httpx.Response(status))
        query = cdn.get(f"{BASE_URL}/beta/v1/tasks/42").mock(
            return_value=beta_done(urls=[f"{CDN}/x.png"])
        )
        with pytest.raises(ResultExpiredError) as info:
            await client.download(done(f"{CDN}/x.png"), tmp_path)
    assert route.call_count == 1  # the dead link is not retried ...
    assert query.call_count == 1  # ... the task is asked once for a fresh one: the same: done
    assert info.value.status_code == status
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("status", [403, 404, 410])
async def test_a_dead_link_is_replaced_by_the_fresh_one_the_gateway_signs(
    client: Driven, tmp_path: Path, status: int
) -> None:
    with respx.mock() as cdn:
        dead = cdn.get(f"{CDN}/x.png?Expires=1").mock(return_value=httpx.Response(status))
        fresh = cdn.get(f"{CDN}/x.png?Expires=2").mock(
            return_value=httpx.Response(200, content=PNG)
        )
        query = cdn.get(f"{BASE_URL}/beta/v1/tasks/42").mock(
            return_value=beta_done(urls=[f"{CDN}/x.png?Expires=2"])
        )
        files = await client.download(done(f"{CDN}/x.png?Expires=1"), tmp_path)
    assert (dead.call_count, query.call_count, fresh.call_count) == (1, 1, 1)
    assert files[0].path.read_bytes() == PNG
    assert files[0].url == f"{CDN}/x.png?Expires=2"
    assert "authorization" in query.calls.last.request.headers  # the query is the gateway's
    assert "authorization" not in fresh.calls.last.request.headers


async def test_a_link_past_its_expiry_is_not_even_tried(client: Driven, tmp_path: Path) -> None:
    from datetime import datetime, timezone

    stale = done(f"{CDN}/x.png?old").model_copy(
        update={"expires_at": datetime(2020, 1, 1, tzinfo=timezone.utc)}
    )
    with respx.mock(assert_all_called=False) as cdn:
        old = cdn.get(f"{CDN}/x.png?old").mock(return_value=httpx.Response(200, content=PNG))
        new = cdn.get(f"{CDN}/x.png?new").mock(return_value=httpx.Response(200, content=PNG))
        query = cdn.get(f"{BASE_URL}/beta/v1/tasks/42").mock(
            return_value=beta_done(urls=[f"{CDN}/x.png?new"])
        )
        files = await client.download(stale, tmp_path)
    assert (old.call_count, query.call_count, new.call_count) == (0, 1, 1)
    assert files[0].url == f"{CDN}/x.png?new"


async def test_a_task_gone_from_the_gateway_means_its_results_expired(
    client: Driven, tmp_path: Path
) -> None:
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/x.png").mock(return_value=httpx.Response(410))
        cdn.get(f"{BASE_URL}/beta/v1/tasks/42").mock(
            return_value=httpx.Response(
                404,
                json={"code": 404, "error": {"code": "task_not_found", "message": "No such task."}},
            )
        )
        with pytest.raises(ResultExpiredError) as info:
            await client.download(done(f"{CDN}/x.png"), tmp_path)
    assert info.value.status_code == 410


async def test_a_query_for_fresh_links_that_fails_for_a_while_is_not_an_expiry(
    client: Driven, tmp_path: Path
) -> None:
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/x.png").mock(return_value=httpx.Response(410))
        query = cdn.get(f"{BASE_URL}/beta/v1/tasks/42").mock(return_value=httpx.Response(503))
        with pytest.raises(ServerError):  # worth retrying later: the result may be there
            await client.download(done(f"{CDN}/x.png"), tmp_path)
    assert query.call_count > 1  # the query had the client's retries
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("answer", [503, 404])
async def test_a_link_past_its_stated_expiry_is_tried_when_no_fresh_one_can_be_had(
    client: Driven, tmp_path: Path, answer: int
) -> None:
    from datetime import datetime, timezone

    stale = done(f"{CDN}/x.png?old").model_copy(
        update={"expires_at": datetime(2020, 1, 1, tzinfo=timezone.utc)}
    )
    body = {"code": answer, "error": {"code": "x", "message": "no"}}
    with respx.mock() as cdn:
        old = cdn.get(f"{CDN}/x.png?old").mock(return_value=httpx.Response(200, content=PNG))
        query = cdn.get(f"{BASE_URL}/beta/v1/tasks/42").mock(
            return_value=httpx.Response(answer, json=body)
        )
        files = await client.download(stale, tmp_path)  # the stated expiry was wrong
    assert query.call_count >= 1
    assert old.call_count == 1
    assert files[0].path.read_bytes() == PNG


async def test_a_prefix_starts_every_name_and_cannot_leave_the_folder(
    client: Driven, tmp_path: Path
) -> None:
    from imggw_client import RequestValidationError

    with respx.mock() as cdn:
        route = cdn.get(f"{CDN}/x.png").mock(return_value=httpx.Response(200, content=PNG))
        for bad in ("../up", "a/b", ".hidden", "x" * 65, "é", 7):
            with pytest.raises(RequestValidationError, match="prefix"):
                await client.download(done(f"{CDN}/x.png"), tmp_path, prefix=bad)  # type: ignore[arg-type]
        assert route.call_count == 0
        files = await client.download(done(f"{CDN}/x.png"), tmp_path, prefix="alpha-")
    assert [f.path.name for f in files] == ["alpha-42-0.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alpha-42-0.png"]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"<html><body>Access denied</body></html>", "text/html; charset=utf-8"),
        (b'{"error": "quota"}', "application/json"),
        (b"  <?xml version='1.0'?><Error/>", None),
        (b"\x00\x01binary-but-labelled", "text/plain"),
    ],
)
async def test_a_document_served_in_place_of_an_image_is_retried_then_refused(
    client: Driven, tmp_path: Path, body: bytes, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    with respx.mock() as cdn:
        route = cdn.get(f"{CDN}/x.png").mock(
            return_value=httpx.Response(200, content=body, headers=headers)
        )
        with pytest.raises(DownloadError) as info:
            await client.download(done(f"{CDN}/x.png"), tmp_path)
    assert info.value.code == "not_an_image"
    assert "served a document" in info.value.message
    assert route.call_count == 4  # the client's retries: a proxy's page may not last
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("body", "content_type", "name"),
    [
        (PNG, "text/html", "42-0.png"),
        (PNG, "application/octet-stream", "42-0.png"),
        (b"\x00\x00\x00\x1cftypavif", "image/avif", "42-0.bin"),
        (b"\x00\x00\x00\x1cftypavif", None, "42-0.bin"),
    ],
)
async def test_image_bytes_or_an_image_label_are_saved(
    client: Driven, tmp_path: Path, body: bytes, content_type: str | None, name: str
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/x.png").mock(
            return_value=httpx.Response(200, content=body, headers=headers)
        )
        files = await client.download(done(f"{CDN}/x.png"), tmp_path)
    assert [f.path.name for f in files] == [name]
    assert files[0].path.read_bytes() == body


async def test_refuses_to_overwrite_a_different_file(client: Driven, tmp_path: Path) -> None:
    """The result is read to compare it with the file there (the same bytes would be this
    result saved already): other bytes are a conflict, and the file is left as it was."""
    (tmp_path / "42-0.png").write_bytes(b"mine")
    with respx.mock() as cdn:
        route = cdn.get(f"{CDN}/x.png").mock(return_value=httpx.Response(200, content=PNG))
        with pytest.raises(DownloadError, match="overwrite=True") as info:
            await client.download(done(f"{CDN}/x.png"), tmp_path)
        assert info.value.code == FILE_EXISTS
        assert route.call_count == 1  # once, never retried: the disk, not the link
        assert (tmp_path / "42-0.png").read_bytes() == b"mine"
        assert leftovers(tmp_path) == []
        files = await client.download(done(f"{CDN}/x.png"), tmp_path, overwrite=True)
    assert files[0].path.read_bytes() == PNG
    assert leftovers(tmp_path) == []


async def test_a_truncated_body_is_retried_then_saved_whole(client: Driven, tmp_path: Path) -> None:
    short = httpx.Response(200, content=PNG[:100], headers={"Content-Length": str(len(PNG))})
    with respx.mock() as cdn:
        route = cdn.get(f"{CDN}/x.png").mock(
            side_effect=[
                short,
                httpx.ReadError("reset"),
                httpx.Response(503),
                httpx.Response(200, content=PNG),
            ]
        )
        files = await client.download(done(f"{CDN}/x.png"), tmp_path)
    assert route.call_count == 4
    assert files[0].size == len(PNG)
    assert files[0].path.read_bytes() == PNG
    assert leftovers(tmp_path) == []


async def test_persistent_truncation_ends_in_download_error_and_leaves_nothing(
    client: Driven, tmp_path: Path
) -> None:
    short = httpx.Response(200, content=PNG[:100], headers={"Content-Length": str(len(PNG))})
    with respx.mock() as cdn:
        route = cdn.get(f"{CDN}/x.png").mock(return_value=short)
        with pytest.raises(DownloadError):
            await client.download(done(f"{CDN}/x.png"), tmp_path)
    assert route.call_count == 4
    assert list(tmp_path.iterdir()) == []


async def test_file_names_never_come_from_the_url(client: Driven, tmp_path: Path) -> None:
    evil = f"{CDN}/..%2F..%2Fetc%2Fpasswd/../../evil.sh"
    with respx.mock() as cdn:
        cdn.get(url__regex=r".*").mock(return_value=httpx.Response(200, content=b"#!/bin/sh"))
        files = await client.download(done(evil), tmp_path / "out")
    assert files[0].path == tmp_path / "out" / "42-0.bin"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["42-0.bin", "out"]


async def test_content_type_names_the_extension_when_the_bytes_do_not(
    client: Driven, tmp_path: Path
) -> None:
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/x").mock(
            return_value=httpx.Response(
                200, content=b"....WEBPish", headers={"Content-Type": "image/webp"}
            )
        )
        files = await client.download(done(f"{CDN}/x"), tmp_path)
    assert files[0].path.name == "42-0.webp"


async def test_only_succeeded_tasks_with_urls_can_be_downloaded(
    client: Driven, tmp_path: Path
) -> None:
    running = Task(id="42", surface="beta", status=TaskStatus.RUNNING)
    failed = Task(
        id="42", surface="beta", status=TaskStatus.FAILED, error=TaskError(code="x", message="y")
    )
    with pytest.raises(DownloadError, match="not succeeded"):
        await client.download(running, tmp_path)
    with pytest.raises(TaskFailedError):
        await client.download(failed, tmp_path)
    with pytest.raises(DownloadError, match="without result URLs"):
        await client.download(done(), tmp_path)


async def test_one_failure_does_not_lose_the_others(client: Driven, tmp_path: Path) -> None:
    urls = [f"{CDN}/{i}.png" for i in range(4)]
    with respx.mock() as cdn:
        for i, url in enumerate(urls):
            cdn.get(url).mock(return_value=httpx.Response(410 if i == 1 else 200, content=PNG))
        cdn.get(f"{BASE_URL}/beta/v1/tasks/42").mock(return_value=beta_done(urls=urls))
        with pytest.raises(ResultExpiredError):
            await client.download(done(*urls), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["42-0.png", "42-2.png", "42-3.png"]


async def test_a_task_id_instead_of_a_task_is_a_clear_error(client: Driven, tmp_path: Path) -> None:
    from imggw_client import RequestValidationError

    with pytest.raises(RequestValidationError) as info:
        await client.download("42", tmp_path)  # type: ignore[arg-type]
    assert info.value.field == "task"
    assert "get(task_id)" in info.value.rule


@pytest.mark.parametrize("concurrency", [0, -1, 1.5, True])
async def test_bad_concurrency(client: Driven, tmp_path: Path, concurrency: Any) -> None:
    from imggw_client import RequestValidationError

    with pytest.raises(RequestValidationError):
        await client.download(done(f"{CDN}/x.png"), tmp_path, concurrency=concurrency)


class InFlight:
    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_async_downloads_run_at_once_within_the_bound(
    fake_time: FakeTime, tmp_path: Path, concurrency: int
) -> None:
    gauge = InFlight()
    full = anyio.Event()  # as many downloads in flight as the bound allows

    async def handler(request: httpx.Request) -> httpx.Response:
        gauge.enter()
        if gauge.now >= concurrency:
            full.set()
        with anyio.move_on_after(5):  # held until then: the bound, not the timing, decides
            await full.wait()
        gauge.leave()
        return httpx.Response(200, content=PNG)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with AsyncClient(api_key=CANARY_KEY, base_url=BASE_URL, http_client=http) as client:
        files = await client.download(
            done(*[f"{CDN}/{i}.png" for i in range(8)]), tmp_path, concurrency=concurrency
        )
    await http.aclose()
    assert len(files) == 8
    assert [f.path.name for f in files] == [f"42-{i}.png" for i in range(8)]
    assert gauge.peak == concurrency


async def test_sync_downloads_are_bounded_too(tmp_path: Path) -> None:
    gauge = InFlight()
    full = threading.Event()  # as many downloads in flight as the bound allows

    def handler(request: httpx.Request) -> httpx.Response:
        gauge.enter()
        if gauge.now >= 2:
            full.set()
        full.wait(timeout=5)  # held until then: the bound, not the timing, decides
        gauge.leave()
        return httpx.Response(200, content=PNG)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    with Client(api_key=CANARY_KEY, base_url=BASE_URL, http_client=http) as client:
        files = client.download(
            done(*[f"{CDN}/{i}.png" for i in range(6)]), tmp_path, concurrency=2
        )
    assert len(files) == 6
    assert gauge.peak == 2
    assert not http.is_closed  # a caller's client stays open
    http.close()


async def test_download_accepts_a_str_folder(
    kind: str, fake_time: FakeTime, tmp_path: Path
) -> None:
    client = make_client(kind, fake_time)
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/x.png").mock(return_value=httpx.Response(200, content=PNG))
        files = await client.download(done(f"{CDN}/x.png"), str(tmp_path))
    assert files[0].path == tmp_path / "42-0.png"
    await client.close()
