"""Verified, atomic saving of one result: bytes stream into a hidden temp file beside the
target while size and sha256 are computed; only a complete body, and a whole image, is renamed
into place."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import struct
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
WRITE_FAILED = "write_failed"  # the disk, not the link: retrying the download will not help
FILE_EXISTS = "file_exists"  # a file of that name is there and overwrite was not asked for
DEFAULT_MAX_BYTES = 128 * 1024 * 1024  # a 4K image is at most ~33 MB even as raw RGBA
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: length 0, type, CRC
_TAIL = 32


def is_whole(head: bytes, tail: bytes, size: int) -> bool:
    """Whether an image whose bytes show its format ends where that format says it ends: a
    body cut by a dropped connection (close-delimited, so no length to check) is caught here.
    Bytes that show no known format cannot be told and count as whole."""
    ext = sniff(head)
    if ext == ".png":
        return tail.endswith(_PNG_END)
    if ext == ".jpg":
        return b"\xff\xd9" in tail[-4:]  # the EOI marker, allowing a little padding
    if ext == ".gif":
        return tail.endswith(b"\x3b")
    if ext == ".webp":  # RIFF: the length after the first 8 bytes is the file's
        return len(head) >= 8 and struct.unpack("<I", head[4:8])[0] + 8 == size
    return True


def sniff(head: bytes) -> str | None:
    """The image format the first bytes show, as an extension; None if they show none."""
    for magic, ext in _MAGIC:
        if head.startswith(magic):
            return ext
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return ".webp"
    return None


def extension(head: bytes, content_type: str | None) -> str:
    """The file extension, from the bytes first (servers mislabel), then the Content-Type."""
    media = (content_type or "").split(";")[0].strip().lower()
    return sniff(head) or _CONTENT_TYPES.get(media, ".bin")


_DOCUMENT_TYPES = ("text/", "application/json", "application/xml", "application/problem")
_DOCUMENT_STARTS = (b"<", b"{", b"[")


def document_type(head: bytes, content_type: str | None) -> str | None:
    """What a body that is plainly not an image is (a proxy's error page, a JSON or XML error
    served with 200), or None. Bytes of a known image format are an image whatever the label;
    unknown bytes labelled neither as a document nor as text still count as an image."""
    if sniff(head) is not None:
        return None
    media = (content_type or "").split(";")[0].strip().lower()
    if media.startswith(_DOCUMENT_TYPES) or media.endswith(("+json", "+xml")):
        return media
    unlabelled = not media or media == "application/octet-stream"
    if unlabelled and head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(_DOCUMENT_STARTS):
        return "markup or JSON"
    return None


def _existing(dest_dir: Path, stem: str) -> Path | None:
    for path in dest_dir.glob(f"{stem}.*"):
        if not path.name.endswith(_PART_SUFFIX):
            return path
    return None


def _exists(path: Path) -> DownloadError:
    return DownloadError(f"{path} exists; pass overwrite=True to replace it", code=FILE_EXISTS)


class Sink:
    """Receives one result. ``write`` each chunk, then ``finish`` (verify and rename) or
    ``discard``; ``discard`` after ``finish`` does nothing, so it fits a ``finally``."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        try:
            fetch.dest_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownloadError(
                f"cannot create {fetch.dest_dir}: {exc.strerror}", code=WRITE_FAILED
            ) from exc
        existing = None if fetch.overwrite else _existing(fetch.dest_dir, fetch.stem)
        if existing is not None:
            raise _exists(existing)
        self._tmp = fetch.dest_dir / f".{fetch.stem}.{secrets.token_hex(4)}{_PART_SUFFIX}"
        try:
            # Mode 0666 less the umask, like any file the user makes (mkstemp would give 0600).
            fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise DownloadError(
                f"cannot write in {fetch.dest_dir}: {exc.strerror}", code=WRITE_FAILED
            ) from exc
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._size = 0
        self._head = b""
        self._tail = b""
        self._done = False

    @property
    def too_large(self) -> bool:
        return self._size > self.fetch.max_bytes

    def write(self, chunk: bytes) -> None:
        """Adds a chunk; past ``max_bytes`` nothing more is written (see ``too_large``)."""
        if len(self._head) < 16:
            self._head += chunk[: 16 - len(self._head)]
        self._tail = (self._tail + chunk)[-_TAIL:]
        self._hash.update(chunk)
        self._size += len(chunk)
        if self.too_large:
            return
        try:
            self._file.write(chunk)
        except OSError as exc:
            raise DownloadError(
                f"cannot write {self._tmp}: {exc.strerror}", code=WRITE_FAILED
            ) from exc

    def finish(self, headers: Mapping[str, str]) -> Fetched:
        expected = _expected_size(headers)
        if expected is not None and expected != self._size:
            return Fetched(200, incomplete=True)
        if not is_whole(self._head, self._tail, self._size):
            return Fetched(200, incomplete=True)
        document = document_type(self._head, headers.get("content-type"))
        if document is not None:
            return Fetched(200, document=document)
        ext = extension(self._head, headers.get("content-type"))
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            target = self.fetch.dest_dir / (self.fetch.stem + ext)
            self._place(target)
        except OSError as exc:
            raise DownloadError(
                f"cannot save {self.fetch.stem}: {exc.strerror}", code=WRITE_FAILED
            ) from exc
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
            raise _exists(target) from None
        except OSError:
            if target.exists():
                raise _exists(target) from None
            os.replace(self._tmp, target)  # a filesystem without hard links
        else:
            self._tmp.unlink()

    def discard(self) -> None:
        if self._done:
            return
        self._done = True
        # On a full disk, closing flushes what is buffered and fails again: that second
        # failure must neither replace the error being raised nor keep the temp file.
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
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
