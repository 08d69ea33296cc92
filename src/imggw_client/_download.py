"""Verified, atomic saving of one result: bytes stream into a hidden temp file beside the
target while size and sha256 are computed; only a complete body is renamed into place."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from ._core.wire import Fetch, Fetched
from ._exceptions import DownloadError, RequestValidationError
from ._models import DownloadedFile

T = TypeVar("T")

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", ".png"),
    (b"\xff\xd8\xff", ".jpg"),
    (b"GIF87a", ".gif"),
    (b"GIF89a", ".gif"),
)
_CONTENT_TYPES = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/webp": ".webp",
    "image/gif": ".gif",
}
_PART_SUFFIX = ".part"


def extension(head: bytes, content_type: str | None) -> str:
    """The file extension, from the bytes first (servers mislabel), then the Content-Type."""
    for magic, ext in _MAGIC:
        if head.startswith(magic):
            return ext
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return ".webp"
    media = (content_type or "").split(";")[0].strip().lower()
    return _CONTENT_TYPES.get(media, ".bin")


def _existing(dest_dir: Path, stem: str) -> Path | None:
    for path in dest_dir.glob(f"{stem}.*"):
        if not path.name.endswith(_PART_SUFFIX):
            return path
    return None


class Sink:
    """Receives one result. ``write`` each chunk, then ``finish`` (verify and rename) or
    ``discard``; ``discard`` after ``finish`` does nothing, so it fits a ``finally``."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        try:
            fetch.dest_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownloadError(f"cannot create {fetch.dest_dir}: {exc.strerror}") from exc
        existing = None if fetch.overwrite else _existing(fetch.dest_dir, fetch.stem)
        if existing is not None:
            raise DownloadError(f"{existing} exists; pass overwrite=True to replace it")
        try:
            fd, name = tempfile.mkstemp(
                dir=fetch.dest_dir, prefix=f".{fetch.stem}.", suffix=_PART_SUFFIX
            )
        except OSError as exc:
            raise DownloadError(f"cannot write in {fetch.dest_dir}: {exc.strerror}") from exc
        self._tmp = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._size = 0
        self._head = b""
        self._done = False

    def write(self, chunk: bytes) -> None:
        if len(self._head) < 16:
            self._head += chunk[: 16 - len(self._head)]
        self._hash.update(chunk)
        self._size += len(chunk)
        try:
            self._file.write(chunk)
        except OSError as exc:
            raise DownloadError(f"cannot write {self._tmp}: {exc.strerror}") from exc

    def finish(self, headers: Mapping[str, str]) -> Fetched:
        expected = _expected_size(headers)
        if expected is not None and expected != self._size:
            return Fetched(200, incomplete=True)
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            target = self.fetch.dest_dir / (
                self.fetch.stem + extension(self._head, headers.get("content-type"))
            )
            self._place(target)
        except OSError as exc:
            raise DownloadError(f"cannot save {self.fetch.stem}: {exc.strerror}") from exc
        self._done = True
        return Fetched(
            200,
            DownloadedFile(
                path=target, url=self.fetch.url, sha256=self._hash.hexdigest(), size=self._size
            ),
        )

    def _place(self, target: Path) -> None:
        if self.fetch.overwrite:
            os.replace(self._tmp, target)
            return
        try:
            # link() fails if the target exists: no window in which another writer is clobbered.
            os.link(self._tmp, target)
        except FileExistsError:
            raise DownloadError(f"{target} exists; pass overwrite=True to replace it") from None
        except OSError:
            if target.exists():
                raise DownloadError(f"{target} exists; pass overwrite=True to replace it") from None
            os.replace(self._tmp, target)  # a filesystem without hard links
        else:
            self._tmp.unlink()

    def discard(self) -> None:
        if self._done:
            return
        self._done = True
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


def _expected_size(headers: Mapping[str, str]) -> int | None:
    if headers.get("content-encoding", "identity").lower() not in ("", "identity"):
        return None  # the length counts encoded bytes; httpx hands us decoded ones
    value = headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


def first_error(results: Sequence[T | BaseException]) -> list[T]:
    """The results in order, or raises the first error (files already saved stay saved)."""
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)  # type: ignore[arg-type]


def check_concurrency(concurrency: object) -> int:
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise RequestValidationError(
            "concurrency", "must be an integer >= 1", code="invalid_concurrency"
        )
    return concurrency
