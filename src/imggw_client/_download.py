"""Verified, atomic saving of one result: bytes stream into a hidden temp file beside the
target while size and sha256 are computed; only a complete body, and a whole image, is renamed
into place. A file already there (``overwrite=False``) is compared instead: the same bytes are
the result saved already, other bytes a conflict (``FILE_EXISTS``)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import struct
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar

from ._core.exceptions import DownloadError, RequestValidationError
from ._core.models import DownloadedFile
from ._core.wire import Fetch, Fetched

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
# A result's link redirected to a loopback, private or link-local host of another origin: the
# redirect was not followed (DESIGN 22); another try meets the same redirect.
REDIRECT_REFUSED = "redirect_refused"
DEFAULT_MAX_BYTES = 128 * 1024 * 1024  # a 4K image is at most ~33 MB even as raw RGBA
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: length 0, type, CRC
_TAIL = 32
_STEM = re.compile(r"[A-Za-z0-9_-]{1,200}")
# A result held for read()/open() stays in memory up to this size, then moves to an anonymous
# temporary file: a 4K image (tens of MB) does not sit in memory for as long as it is open.
HELD_IN_MEMORY = 8 * 1024 * 1024


def is_whole(head: bytes, tail: bytes, size: int) -> bool:
    """Whether an image whose bytes show its format ends where that format says it ends: a
    body cut by a dropped connection (close-delimited, so no length to check) is caught here.
    Only for bodies without a declared length: one whose ``Content-Length`` was met is whole,
    whatever follows its end marker (a newline, padding). Bytes that show no known format
    cannot be told and count as whole."""
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


def _check_stem(stem: str) -> None:
    # The flows build stems from checked ids and prefixes; this holds the line for any other
    # caller: a name that is not one plain file name in dest_dir is never written.
    if not _STEM.fullmatch(stem):
        raise RequestValidationError(
            "stem", "must be letters, digits, '-' or '_' (a file name, not a path)"
        )


def _existing(dest_dir: Path, stem: str) -> Path | None:
    for path in dest_dir.glob(f"{stem}.*"):
        if not path.name.endswith(_PART_SUFFIX):
            return path
    return None


def _exists(path: Path) -> DownloadError:
    return DownloadError(f"{path} exists; pass overwrite=True to replace it", code=FILE_EXISTS)


class Sink:
    """Receives one result. ``write`` each chunk, then ``finish`` (verify and rename) or
    ``discard``; ``discard`` after ``finish`` does nothing, so it fits a ``finally``.

    A file of the result's name already there (and ``overwrite`` not asked for) is read beside
    the body instead of writing a temp file: a whole body with the same bytes is reported saved
    at that path, the file untouched (downloading twice is idempotent); other bytes are the
    ``FILE_EXISTS`` conflict, raised once the body is known to be a whole image (a proxy's page
    served in its place is its own error, retried as such).

    A fetch that names no folder (``read``, ``open``) is held instead: in memory, then an
    anonymous temporary file past :data:`HELD_IN_MEMORY`; verified the same way, then handed
    back at its start (``Fetched.body``), the caller's to close."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        _check_stem(fetch.stem)
        self._hash = hashlib.sha256()
        self._size = 0
        self._head = b""
        self._tail = b""
        self._done = False
        self._existing: Path | None = None
        self._theirs: BinaryIO | None = None  # the file already there, read as bytes come
        self._differs = False
        self._tmp: Path | None = None
        self._file: BinaryIO | None = None
        self._held: BinaryIO | None = None
        if fetch.dest_dir is None:
            # Deleted when closed, and never linked into a folder: nothing is left behind.
            self._held = tempfile.SpooledTemporaryFile(max_size=HELD_IN_MEMORY)  # type: ignore[assignment]  # noqa: SIM115
            self._file = self._held
            return
        try:
            fetch.dest_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownloadError(
                f"cannot create {fetch.dest_dir}: {exc.strerror}", code=WRITE_FAILED
            ) from exc
        self._existing = None if fetch.overwrite else _existing(fetch.dest_dir, fetch.stem)
        if self._existing is not None:
            try:
                self._theirs = open(self._existing, "rb")  # noqa: SIM115 - discard closes it
            except OSError:
                raise _exists(self._existing) from None  # unreadable: not shown to be ours
            return
        self._tmp = fetch.dest_dir / f".{fetch.stem}.{secrets.token_hex(4)}{_PART_SUFFIX}"
        try:
            # Mode 0666 less the umask, like any file the user makes (mkstemp would give 0600).
            fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise DownloadError(
                f"cannot write in {fetch.dest_dir}: {exc.strerror}", code=WRITE_FAILED
            ) from exc
        self._file = os.fdopen(fd, "wb")

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
        if self._theirs is not None:
            self._compare(chunk)
            return
        assert self._file is not None
        try:
            self._file.write(chunk)
        except OSError as exc:
            raise DownloadError(
                f"cannot write {self._tmp or 'a temporary file'}: {exc.strerror}",
                code=WRITE_FAILED,
            ) from exc

    def _compare(self, chunk: bytes) -> None:
        if self._differs or self._theirs is None:
            return
        try:
            self._differs = self._theirs.read(len(chunk)) != chunk
        except OSError:
            self._differs = True

    def finish(self, headers: Mapping[str, str]) -> Fetched:
        expected = _expected_size(headers)
        if expected is not None:
            # A declared length met is a whole body, whatever follows the image's end marker.
            if expected != self._size:
                return Fetched(200, incomplete=True)
        elif not is_whole(self._head, self._tail, self._size):
            return Fetched(200, incomplete=True)
        document = document_type(self._head, headers.get("content-type"))
        if document is not None:
            return Fetched(200, document=document)
        if self._existing is not None:
            return self._already_there(self._existing)
        if self._held is not None:
            try:
                self._held.seek(0)
            except OSError as exc:
                raise DownloadError(
                    f"cannot hold {self.fetch.stem}: {exc.strerror}", code=WRITE_FAILED
                ) from exc
            self._done = True
            return Fetched(200, body=self._held)
        assert self._file is not None
        assert self._tmp is not None
        assert self.fetch.dest_dir is not None
        ext = extension(self._head, headers.get("content-type"))
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            target = self.fetch.dest_dir / (self.fetch.stem + ext)
            placed = self._place(self._tmp, target)
        except OSError as exc:
            raise DownloadError(
                f"cannot save {self.fetch.stem}: {exc.strerror}", code=WRITE_FAILED
            ) from exc
        self._done = True
        return self._saved(placed)

    def _already_there(self, path: Path) -> Fetched:
        """The whole body was read beside ``path``: the same bytes are this result saved."""
        assert self._theirs is not None
        try:
            same = not self._differs and self._theirs.read(1) == b""
        except OSError:
            same = False
        if not same:
            raise _exists(path)
        self._done = True
        self._theirs.close()
        return self._saved(path)

    def _saved(self, path: Path) -> Fetched:
        return Fetched(
            200,
            DownloadedFile(
                path=path, url=self.fetch.url, sha256=self._hash.hexdigest(), size=self._size
            ),
        )

    def _place(self, tmp: Path, target: Path) -> Path:
        if self.fetch.overwrite:
            os.replace(tmp, target)
            return target
        try:
            # link() fails if the target exists: no window in which another writer is clobbered.
            os.link(tmp, target)
        except FileExistsError:
            return self._raced(tmp, target)
        except OSError:
            if target.exists():
                return self._raced(tmp, target)
            os.replace(tmp, target)  # a filesystem without hard links
        else:
            tmp.unlink()
        return target

    def _raced(self, tmp: Path, target: Path) -> Path:
        """``target`` appeared while the body came (another download of the same result, say):
        the same bytes are saved already; other bytes are a conflict."""
        if _digest(target) != (self._size, self._hash.hexdigest()):
            raise _exists(target)
        tmp.unlink()
        return target

    def discard(self) -> None:
        if self._done:
            return
        self._done = True
        if self._theirs is not None:
            with contextlib.suppress(OSError):
                self._theirs.close()
        # On a full disk, closing flushes what is buffered and fails again: that second
        # failure must neither replace the error being raised nor keep the temp file.
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.unlink()


def _digest(path: Path) -> tuple[int, str] | None:
    """Size and sha256 of a file, or None if it cannot be read."""
    digest, size = hashlib.sha256(), 0
    try:
        with open(path, "rb") as file:
            while block := file.read(1 << 20):
                digest.update(block)
                size += len(block)
    except OSError:
        return None
    return size, digest.hexdigest()


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


def check_dest_dir(dest_dir: object) -> Path:
    """A download's folder: a path (``str`` or ``os.PathLike``) the file system can name,
    refused before anything is fetched if it is anything else."""
    if not isinstance(dest_dir, (str, os.PathLike)):
        rule = f"must be a path (str or os.PathLike), not {type(dest_dir).__name__}"
        raise RequestValidationError("dest_dir", rule)
    try:
        os.fsencode(dest_dir)
    except UnicodeError:  # a lone surrogate: no file system can name it
        raise RequestValidationError("dest_dir", "names no path the file system can hold") from None
    return Path(dest_dir)


def check_concurrency(concurrency: object) -> int:
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise RequestValidationError(
            "concurrency", "must be an integer >= 1", code="invalid_concurrency"
        )
    return concurrency
