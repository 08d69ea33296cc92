"""A run's identity, kept in its output folder: what makes a re-run of a line, anywhere, send the
same idempotency key, and what tells a changed input from the one the run was made for.

- ``run.json``: the run id (random, made by the first run on the folder, before anything is
  sent) and the input's fingerprint.
- ``lines.fp``: one 16-byte entry per input line, in order: its line number and a digest of its
  identity and request. A rerun compares its input with it, entry by entry, in one streaming
  pass, so it can name the lines that changed even when every ledger was deleted.

Each line's key is a pure function of (run id, line identity, request fingerprint): a worker
death, a lost disk, a deleted ledger or a restarted driver all send the same key again, and the
gateway replays the task instead of billing a second one.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .._exceptions import ImggwError, RequestValidationError

RUN_NAME = "run.json"
LINES_NAME = "lines.fp"
FORMAT = 1
_ENTRY = struct.Struct(">I12s")  # line number, digest


@dataclass(frozen=True)
class RunIdentity:
    """The run id and the fingerprint of the input it was made for."""

    run_id: str
    input_fingerprint: str


class InputChangedError(ImggwError):
    """The input differs from the one this output folder's run was made for; nothing was sent.

    Changed lines would be new requests, billed anew: they run only with ``allow_changes=True``
    (``--allow-changes``). ``lines`` holds the first changed line numbers, ``count`` them all.

    Example::

        except InputChangedError as err:
            print(err.lines[:10], err.count)
    """

    def __init__(self, lines: list[int], count: int) -> None:
        shown = ", ".join(str(n) for n in lines[:10]) + (" ..." if count > 10 else "")
        super().__init__(
            f"the input changed since this folder's run began ({count} line(s): {shown}); "
            "nothing was sent. Changed lines would be new requests, billed anew: pass "
            "--allow-changes (allow_changes=True) to run them",
            code="input_changed",
        )
        self.lines = lines
        self.count = count


def idempotency_key(run_id: str, identity: str, fingerprint: str) -> str:
    """The key of one line: the same on every re-run of it, anywhere."""
    digest = hashlib.sha256(f"{run_id}\0{identity}\0{fingerprint}".encode()).hexdigest()
    return f"imggw-{digest[:40]}"


def line_digest(identity: str, fingerprint: str) -> bytes:
    return hashlib.blake2b(f"{identity}\0{fingerprint}".encode(), digest_size=12).digest()


def load(folder: Path) -> RunIdentity | None:
    """The folder's run identity, or None if no run began there."""
    try:
        data = json.loads((folder / RUN_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RequestValidationError(
            "out_dir", f"{folder / RUN_NAME} is unreadable ({exc}); it is not a run's folder"
        ) from exc
    if not isinstance(data, dict) or data.get("format", 0) > FORMAT:
        raise RequestValidationError(
            "out_dir", f"{folder / RUN_NAME} was written by a newer imggw: upgrade to resume it"
        )
    return RunIdentity(str(data["run_id"]), str(data.get("input_fingerprint", "")))


def create(folder: Path, input_fingerprint: str) -> RunIdentity:
    """A new run id for the folder, written (and synced) before anything is sent."""
    identity = RunIdentity(secrets.token_hex(16), input_fingerprint)
    save(folder, identity)
    return identity


def save(folder: Path, identity: RunIdentity) -> None:
    record = {
        "format": FORMAT,
        "run_id": identity.run_id,
        "input_fingerprint": identity.input_fingerprint,
        "updated_at": time.time(),
    }
    _write_atomic(folder / RUN_NAME, json.dumps(record, indent=1).encode() + b"\n")


class LineDigests:
    """Writes the new ``lines.fp`` while comparing it, entry by entry, with the old one.

    ``old`` is the record to compare with (default: the folder's own); ``within`` keeps only
    its entries for those line numbers (a shard compares its range with a whole run's record).
    """

    def __init__(
        self, folder: Path, *, old: Path | None = None, within: range | None = None
    ) -> None:
        self.folder = folder
        old = folder / LINES_NAME if old is None else old
        self._old = _read_entries(old, within)
        self._had_old = old.exists()
        self._pending: tuple[int, bytes] | None = next(self._old, None)
        self._tmp = folder / f".{LINES_NAME}.{secrets.token_hex(4)}.part"
        self._out: BinaryIO = self._tmp.open("wb")
        self._fingerprint = hashlib.sha256()
        self.changed: list[int] = []  # the first changed line numbers
        self.changed_count = 0

    def add(self, line: int, digest: bytes) -> None:
        entry = _ENTRY.pack(line, digest)
        self._out.write(entry)
        self._fingerprint.update(entry)
        # Merge by line number: old entries before this line were removed; one at this line
        # with another digest was edited; none at all means the line was added.
        while self._pending is not None and self._pending[0] < line:
            self._change(self._pending[0])
            self._pending = next(self._old, None)
        if self._pending is not None and self._pending[0] == line:
            if self._pending[1] != digest:
                self._change(line)
            self._pending = next(self._old, None)
        elif self._had_old:
            self._change(line)

    def _change(self, line: int) -> None:
        self.changed_count += 1
        if len(self.changed) < 1000:
            self.changed.append(line)

    def finish(self) -> str:
        """Ends the comparison (old lines past the new input's end were removed); returns the
        new input's fingerprint. The new entries are kept aside until :meth:`commit`."""
        while self._pending is not None:
            self._change(self._pending[0])
            self._pending = next(self._old, None)
        self._out.close()
        return self._fingerprint.hexdigest()

    def new_entries(self) -> bytes:
        """The new record's bytes (after :meth:`finish`)."""
        return self._tmp.read_bytes()

    def commit(self) -> None:
        """Makes the new entries the folder's record of its input."""
        with self._tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(self._tmp, self.folder / LINES_NAME)

    def discard(self) -> None:
        if not self._out.closed:
            self._out.close()
        self._tmp.unlink(missing_ok=True)


def _read_entries(path: Path, within: range | None = None) -> Iterator[tuple[int, bytes]]:
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        while chunk := handle.read(_ENTRY.size * 4096):
            for offset in range(0, len(chunk) - _ENTRY.size + 1, _ENTRY.size):
                line, digest = _ENTRY.unpack_from(chunk, offset)
                if within is None or line in within:
                    yield line, digest
                elif line >= within.stop:
                    return


def entry_lines(path: Path) -> Iterator[int]:
    """The line numbers a ``lines.fp`` records, in order: every good line of the input."""
    for line, _ in _read_entries(path):
        yield line


def record_bytes(identity: RunIdentity) -> bytes:
    """``run.json``'s content for ``identity``."""
    record = {
        "format": FORMAT,
        "run_id": identity.run_id,
        "input_fingerprint": identity.input_fingerprint,
        "updated_at": time.time(),
    }
    return json.dumps(record, indent=1).encode() + b"\n"


def parse_record(data: bytes, where: str) -> RunIdentity:
    """The identity in a ``run.json``'s content (``where`` names it in errors)."""
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise RequestValidationError(
            "out_dir", f"{where} is unreadable ({exc}); it is not a run's folder"
        ) from exc
    if not isinstance(parsed, dict) or parsed.get("format", 0) > FORMAT or "run_id" not in parsed:
        raise RequestValidationError(
            "out_dir", f"{where} was written by a newer imggw: upgrade to resume it"
        )
    return RunIdentity(str(parsed["run_id"]), str(parsed.get("input_fingerprint", "")))


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
