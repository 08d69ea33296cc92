"""download() never builds a path from a Task it has not checked (DESIGN 18): a Task may come
from stored data, and its id names the result files. A crafted id or surface is refused before
anything is fetched or written, by both clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from imggw_client import RequestValidationError, Task
from imggw_client._core.wire import Fetch
from imggw_client._download import Sink

from ..conftest import CDN, PNG, Driven

pytestmark = pytest.mark.anyio

CRAFTED_IDS = [
    "./../../escaped",  # relative traversal: saved two folders above dest before the fix
    "../escaped",
    "/tmp/absolute-escaped",  # absolute: a raw NotImplementedError before the fix
    "12\x0034",  # NUL
    "1" * 65,  # longer than any id (and than many file systems allow)
    "1" * 5000,
    "12\u221534",  # DIVISION SLASH, a lookalike of "/"
    "12\u2044..\u204434",  # FRACTION SLASH
    "12\uff0f34",  # FULLWIDTH SOLIDUS
    "\uff11\uff12",  # fullwidth digits: not ASCII, never a name
    "\u0661\u0662",  # Arabic-Indic digits
    "12\\34",  # a Windows separator
    "",
    "0",
    "..",
]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


def crafted(task_id: str, surface: Any = "beta") -> Task:
    # As a caller would rebuild one from stored JSON: pydantic checks types, not the id.
    return Task.model_validate(
        {
            "id": task_id,
            "surface": surface,
            "status": "succeeded",
            "image_urls": [f"{CDN}/r/escaped.png"],
        }
    )


@pytest.mark.parametrize("task_id", CRAFTED_IDS)
async def test_a_crafted_task_id_is_refused_before_any_path_or_request(
    client: Driven, tmp_path: Path, task_id: str
) -> None:
    dest = tmp_path / "a" / "b" / "dest"
    dest.mkdir(parents=True)
    (tmp_path / "keep.txt").write_bytes(b"untouched")
    before = tree(tmp_path)
    with respx.mock(assert_all_called=False) as cdn:
        route = cdn.get(url__startswith=CDN).mock(return_value=httpx.Response(200, content=PNG))
        with pytest.raises(RequestValidationError) as caught:
            await client.download(crafted(task_id), dest)
    assert caught.value.field == "task.id"
    assert route.call_count == 0
    assert tree(tmp_path) == before
    assert not Path("/tmp/absolute-escaped.png").exists()
    assert not list(Path("/tmp").glob("absolute-escaped*"))


@pytest.mark.parametrize("surface", ["../x", "gamma", "", None, 7])
async def test_a_crafted_surface_is_refused_too(
    client: Driven, tmp_path: Path, surface: Any
) -> None:
    task = crafted("42").model_copy(update={"surface": surface})  # no validation on copy
    with respx.mock(assert_all_called=False) as cdn:
        route = cdn.get(url__startswith=CDN).mock(return_value=httpx.Response(200, content=PNG))
        with pytest.raises(RequestValidationError) as caught:
            await client.download(task, tmp_path / "dest")
    assert caught.value.field == "task.surface"
    assert route.call_count == 0
    assert list(tmp_path.iterdir()) == []


async def test_a_good_stored_task_still_downloads(client: Driven, tmp_path: Path) -> None:
    with respx.mock() as cdn:
        cdn.get(f"{CDN}/r/escaped.png").mock(return_value=httpx.Response(200, content=PNG))
        files = await client.download(crafted("9" * 64), tmp_path)
    assert [f.path for f in files] == [tmp_path / f"{'9' * 64}-0.png"]
    assert files[0].path.parent == tmp_path


@pytest.mark.parametrize("stem", ["../x", "/abs", "a/b", "x\x00", ".", "..", "", "é"])
def test_the_sink_itself_writes_only_plain_names(tmp_path: Path, stem: str) -> None:
    """A second line behind the flows: a Fetch from any caller names one file in dest_dir."""
    dest = tmp_path / "dest"
    with pytest.raises(RequestValidationError):
        Sink(Fetch(f"{CDN}/x.png", dest, stem, False, 5.0, 1 << 20))
    assert list(tmp_path.iterdir()) == []
