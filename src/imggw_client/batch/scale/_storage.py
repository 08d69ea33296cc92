"""A sharded run's output folder: a local path, or any fsspec URL (``file://``, ``memory://``,
``s3://``, ``gs://``, ...), behind one small interface.

Every file appears whole or not at all: locally through a temp file renamed into place; on an
object store through one PUT (an object is visible only once its upload completed). ``create``
writes a file only if none is there (``O_EXCL``-like: a hard link locally, ``If-None-Match: *``
on S3, ``mode="create"`` in fsspec), which is how concurrent shards agree on one run id.

Every method blocks (disk, network): callers on an event loop run them in a worker thread.
fsspec is imported only for a URL, so a local sharded run needs no extra package.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from ..._core.exceptions import RequestValidationError
from ..._files import READ_FLAGS, atomic_write, create_new, refuse_link, temp_name
from .._schema import storage_error

CHUNK = 1 << 20


def is_url(dest: str | os.PathLike[str]) -> bool:
    """Whether ``dest`` names a folder through fsspec rather than a local path."""
    text = os.fspath(dest)
    return "://" in text and not text.startswith("file://")


def local_path(dest: str | os.PathLike[str]) -> Path:
    """A local output folder's path; an empty name (an unset shell variable) is refused, not
    taken as the current folder."""
    text = os.fspath(dest)
    path = text[len("file://") :] if text.startswith("file://") else text
    if not path.strip():
        raise RequestValidationError("out_dir", "the output folder is empty: name a folder")
    return Path(path)


def destination_name(dest: str | os.PathLike[str]) -> str:
    """One spelling of an output folder, whoever names it and from where: a local folder as
    its absolute path (``out``, ``./out/`` and ``file:///abs/out`` alike), an fsspec URL
    without its trailing ``/``. What a run's identity is derived from.
    """
    if is_url(dest):
        return os.fspath(dest).rstrip("/")
    return str(local_path(dest).resolve())


class Storage:
    """The interface (and the local implementation): paths are relative to the folder, with
    ``/`` between parts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)

    @property
    def local(self) -> Path | None:
        """The folder itself when it is on this machine's disk (shards then work in place)."""
        return self.root

    def where(self, rel: str) -> str:
        return str(self.root / rel)

    def read(self, rel: str) -> bytes | None:
        path = self.root / rel
        try:
            refuse_link(path)
            fd = os.open(path, READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise storage_error(self.where(rel), exc, "read") from exc
        try:
            with os.fdopen(fd, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise storage_error(self.where(rel), exc, "read") from exc

    def write(self, rel: str, data: bytes) -> None:
        """Writes the file whole (temp file, fsync, rename); never through a symlink."""
        path = self.root / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(path) as handle:
                handle.write(data)
        except OSError as exc:
            raise storage_error(path, exc) from exc

    def create(self, rel: str, data: bytes) -> bool:
        """Writes the file whole if none is there; False if one is (it is left as it is)."""
        path = self.root / rel
        refuse_link(path)  # a link there is no file of the run's: refused, not read
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._temp(path, data)
        except OSError as exc:
            raise storage_error(path, exc) from exc
        try:
            os.link(tmp, path)  # fails if the target exists: the first writer wins, whole
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: exclusive create, then the bytes
            try:
                fd = create_new(path)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def put(self, local: Path, rel: str) -> None:
        """Moves a local file into place (whole); the local file is gone after."""
        path = self.root / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            refuse_link(path)
            try:
                os.replace(local, path)
            except OSError:  # another filesystem: copy beside the target, then rename
                with atomic_write(path) as handle, local.open("rb") as source:
                    shutil.copyfileobj(source, handle, CHUNK)
                local.unlink()
        except OSError as exc:
            raise storage_error(path, exc) from exc

    def get(self, rel: str, local: Path) -> bool:
        """Copies the file to ``local`` (whole); False if there is none."""
        path = self.root / rel
        try:
            refuse_link(path)
            fd = os.open(path, READ_FLAGS)
            with os.fdopen(fd, "rb") as source, atomic_write(local) as handle:
                shutil.copyfileobj(source, handle, CHUNK)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(self.where(rel), exc, "read") from exc
        return True

    def size(self, rel: str) -> int | None:
        try:
            return (self.root / rel).stat().st_size
        except OSError:
            return None

    def sha256(self, rel: str) -> str | None:
        try:
            with (self.root / rel).open("rb") as handle:
                return _digest(handle)
        except OSError:
            return None

    def listdir(self, rel: str) -> list[str]:
        """The names in a folder (none if it does not exist)."""
        try:
            return sorted(entry.name for entry in (self.root / rel).iterdir())
        except OSError:
            return []

    def is_whole(self, rel: str, size: int, sha256: str, *, hashes: bool) -> bool:
        """Whether the file is there with this size (and this sha256, with ``hashes``)."""
        if self.size(rel) != size:
            return False
        return not hashes or self.sha256(rel) == sha256

    @staticmethod
    def _temp(path: Path, data: bytes) -> Path:
        tmp = temp_name(path)
        with os.fdopen(create_new(tmp), "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp


class FsspecStorage(Storage):
    """A folder behind an fsspec filesystem. Listings are never taken from fsspec's cache:
    other processes write into the same folder."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        try:
            import fsspec.core
        except ImportError as exc:  # pragma: no cover - the dask/s3 extras bring it
            raise RequestValidationError(
                "out_dir", f"{url} needs fsspec: pip install 'imggw[dask]' (or imggw[s3])"
            ) from exc
        try:
            fs, path = fsspec.core.url_to_fs(url, **options)
        except (ImportError, ValueError) as exc:
            raise RequestValidationError("out_dir", f"cannot use {url}: {exc}") from exc
        self.fs = fs
        self.root_path = path.rstrip("/")
        self.url = url.rstrip("/")

    @property
    def local(self) -> Path | None:
        return None

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _path(self, rel: str) -> str:
        return f"{self.root_path}/{rel}"

    def read(self, rel: str) -> bytes | None:
        path = self._path(rel)
        try:
            self.fs.invalidate_cache(path)
            data: bytes = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        except Exception as exc:  # the backend's own errors too (credentials, say)
            raise storage_error(self.where(rel), exc, "read") from exc
        return data

    def write(self, rel: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(self._path(rel), data)  # one PUT on an object store
        except Exception as exc:
            raise storage_error(self.where(rel), exc) from exc

    def create(self, rel: str, data: bytes) -> bool:
        path = self._path(rel)
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError, ValueError):
            # A filesystem with no exclusive write: check, then write (a narrow race, which
            # only two first runs started in the same instant can meet).
            if self.read(rel) is not None:
                return False
            self.write(rel, data)
        except Exception as exc:
            if self.read(rel) not in (None, data):  # some stores answer a lost race so
                return False
            raise storage_error(self.where(rel), exc) from exc
        return True

    def put(self, local: Path, rel: str) -> None:
        try:
            self.fs.put_file(str(local), self._path(rel))
        except Exception as exc:
            raise storage_error(self.where(rel), exc) from exc
        local.unlink(missing_ok=True)

    def get(self, rel: str, local: Path) -> bool:
        tmp = temp_name(local)
        try:
            self.fs.invalidate_cache(self._path(rel))
            self.fs.get_file(self._path(rel), str(tmp))
            os.replace(tmp, local)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            return False
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            raise storage_error(self.where(rel), exc, "read") from exc
        return True

    def size(self, rel: str) -> int | None:
        path = self._path(rel)
        try:
            self.fs.invalidate_cache(path)
            return int(self.fs.info(path)["size"])
        except (FileNotFoundError, KeyError):
            return None
        except Exception as exc:  # unreadable is not missing: a rerun would compare with nothing
            raise storage_error(self.where(rel), exc, "read") from exc

    def sha256(self, rel: str) -> str | None:
        try:
            with self.fs.open(self._path(rel), "rb") as handle:
                return _digest(handle)
        except OSError:
            return None

    def listdir(self, rel: str) -> list[str]:
        path = self._path(rel).rstrip("/")
        try:
            self.fs.invalidate_cache(path)
            names = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except Exception as exc:
            raise storage_error(self.where(rel), exc, "read") from exc
        return sorted(str(name).rstrip("/").rsplit("/", 1)[-1] for name in names)


def _digest(handle: Any) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def open_storage(dest: str | os.PathLike[str], options: dict[str, Any] | None = None) -> Storage:
    """The output folder ``dest``: a local path (or ``file://``), else an fsspec URL opened with
    ``options`` (fsspec's storage options; credentials are better left to the environment of
    each machine, where the filesystem's own library finds them).

    Example::

        storage = open_storage("memory://run")
    """
    if is_url(dest):
        return FsspecStorage(os.fspath(dest), dict(options or {}))
    return Storage(local_path(dest))
