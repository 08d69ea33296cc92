"""A run's identity, kept in its output folder: what makes a re-run of a line, anywhere, send the
same idempotency key, and what tells a changed input from the one the run was made for.

- ``run.json``: the run id (made by the first run on the folder, before anything is sent), the
  input's digest, surface, name template and input path. A new folder's run id is derived from
  the folder, the gateway and the API key (:func:`derive_run_id`), so a folder deleted and made
  again gives the run its old id back, and its lines their old keys: the gateway replays their
  tasks for as long as it remembers keys. ``new_run`` asks for a random one instead.
- ``lines.fp``: one 16-byte entry per input line, in order: its line number and digests of its
  identity and its request. A rerun compares its input with it, line by line, keyed by
  identity, so it can name the lines that changed even when every ledger was deleted.

Each line's key is a pure function of (run id, line identity, request digest): a worker
death, a lost disk, a deleted ledger or a restarted driver all send the same key again, and the
gateway replays the task instead of billing a second one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import struct
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from .._core import rules
from .._core.exceptions import ConfigurationError, ImggwError, RequestValidationError
from .._core.text import json_loads
from .._files import StorageError, create_new, refuse_link, temp_name
from .._journal.schema import RUN_NAME
from .scale._storage import Storage

LINES_NAME = "lines.fp"
FORMAT = 1
_ENTRY = struct.Struct(">I12s")  # line number, digest (line_digest)
_ID = 8  # the bytes of a digest that name the line


@dataclass(frozen=True)
class RunIdentity:
    """The run id, its input's digest, the surface it runs on, the slow fingerprint of its API
    key, its results' name template and its input's absolute path (each None if not kept)."""

    run_id: str
    input_digest: str
    surface: str | None = None
    key_fingerprint: str | None = None
    name: str | None = None
    input_path: str | None = None


RUN_ID_CHARS = 32


def derive_run_id(destination: str, base_url: str, key_fingerprint: str) -> str:
    """The run id of a new run: the same for the same output folder (``destination``, as
    ``_storage.destination_name`` spells it), gateway and API key, on any machine, so that a
    folder deleted and made again sends its lines' old keys. Keyed by the key's fingerprint
    (a slow hash of the key): the key cannot be worked out from the id, nor the id made
    without the key."""
    message = f"imggw run\0{destination}\0{base_url}".encode()
    digest = hmac.new(bytes.fromhex(key_fingerprint), message, hashlib.sha256).hexdigest()
    return digest[:RUN_ID_CHARS]


def random_run_id() -> str:
    """The run id of a run asked to be new (``new_run=True``): nothing else derives it."""
    return secrets.token_hex(RUN_ID_CHARS // 2)


def _numbers(lines: list[int], count: int) -> str:
    return ", ".join(str(n) for n in lines[:10]) + (" ..." if count > 10 else "")


class InputChangedError(ImggwError):
    """The input differs from the one this output folder's run was made for; nothing was sent.

    Changed lines would be new requests, billed anew: they run only with ``allow_changes=True``
    (``--allow-changes``). ``lines`` holds the first new or changed line numbers, ``count``
    them all; ``removed`` the first lines the run's input had and this one has not (numbered as
    they were), ``removed_count`` them all. A run on another surface than the folder's is a
    change of every line: ``surface_was`` is then the folder's surface, ``surface`` this run's.

    Example::

        run_batch("prompts.jsonl", "out/")
        Path("prompts.jsonl").write_text('{"prompt": "a grey fox in snow"}\\n')
        try:
            run_batch("prompts.jsonl", "out/")
        except InputChangedError as err:
            print(err.lines[:10], err.count, err.removed[:10], err.surface_was)
    """

    def __init__(
        self,
        lines: list[int],
        count: int,
        *,
        removed: list[int] | None = None,
        removed_count: int = 0,
        surfaces: tuple[str, str] | None = None,
    ) -> None:
        removed = removed or []
        if surfaces is not None:
            was, now = surfaces
            message = (
                f"this folder's run was made on surface {was}, and this run is on {now}: every "
                f"line would be a new request on {now}, billed anew; nothing was sent. Run with "
                f"--surface {was} to go on with it, use another folder for {now}, or pass "
                "--allow-changes (allow_changes=True) to submit the lines again on "
                f"{now}"
            )
            code = "surface_changed"
        else:
            parts = []
            if count:
                parts.append(f"{count} line(s) new or changed: {_numbers(lines, count)}")
            if removed_count:
                parts.append(
                    f"{removed_count} line(s) removed, as the run's input numbered them: "
                    f"{_numbers(removed, removed_count)}"
                )
            message = (
                f"the input changed since this folder's run began ({'; '.join(parts)}); "
                "nothing was sent. New and changed lines would be new requests, billed anew: "
                "pass --allow-changes (allow_changes=True) to run them"
            )
            code = "input_changed"
        super().__init__(message, code=code)
        self.lines = lines
        self.count = count
        self.removed = removed
        self.removed_count = removed_count
        self.surface_was: str | None = surfaces[0] if surfaces is not None else None
        self.surface: str | None = surfaces[1] if surfaces is not None else None


SHOWN_FINGERPRINT = 12  # hex digits of a key's fingerprint a message shows, as key_fingerprint's


class KeyChangedError(ConfigurationError):
    """This output folder's run was made with another API key (a rotated key, or a colleague's);
    nothing was sent and no line was touched.

    A task is visible only to the key that made it: run on with this key, every line's query
    would find nothing and the paid results would be given up. ``fingerprint_was`` is the
    slow fingerprint of the key the run was made with, ``fingerprint`` this client's (compare
    with ``client.key_fingerprint``; neither reveals a key). Run with the run's key, or use
    another folder for this one.

    Example::

        import os

        run_batch("prompts.jsonl", "out/")
        os.environ["IMGGW_API_KEY"] = "sk-the-new-key"      # the key was rotated
        try:
            run_batch("prompts.jsonl", "out/")
        except KeyChangedError as err:
            print(err.fingerprint_was[:12], err.fingerprint[:12])
    """

    def __init__(self, folder: object, fingerprint_was: str, fingerprint: str) -> None:
        was, now = fingerprint_was[:SHOWN_FINGERPRINT], fingerprint[:SHOWN_FINGERPRINT]
        super().__init__(
            f"{folder}'s run was made with another API key (key fingerprint {was}...), and this "
            f"run uses key {now}...: its tasks are visible only to the key that made them; "
            "nothing was sent and no line was changed. Run with the run's key to resume it, or "
            "use another output folder for this key",
            code="key_changed",
        )
        self.fingerprint_was = fingerprint_was
        self.fingerprint = fingerprint


def check_key(folder: object, run: RunIdentity | None, fingerprint: str | None) -> None:
    """Refuses (:class:`KeyChangedError`) a run whose key is not the one ``run`` was made with;
    a run record that predates keeping the key's fingerprint passes (the run then records it).
    """
    if run is None or fingerprint is None or run.key_fingerprint is None:
        return
    if not hmac.compare_digest(run.key_fingerprint, fingerprint):
        raise KeyChangedError(folder, run.key_fingerprint, fingerprint)


def idempotency_key(run_id: str, identity: str, request_digest: str) -> str:
    """The key of one line: the same on every re-run of it, anywhere."""
    digest = hashlib.sha256(f"{run_id}\0{identity}\0{request_digest}".encode()).hexdigest()
    return f"imggw-{digest[:40]}"


def line_digest(identity: str, request_digest: str) -> bytes:
    """A line's entry in ``lines.fp``: 8 bytes naming the line, 4 naming its request."""
    named = hashlib.blake2b(identity.encode(), digest_size=_ID).digest()
    return named + hashlib.blake2b(request_digest.encode(), digest_size=12 - _ID).digest()


def load(folder: Path) -> RunIdentity | None:
    """The folder's run identity, or None if no run began there."""
    path = folder / RUN_NAME
    refuse_link(path)  # never read through a planted link (exit 4, naming it)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RequestValidationError(
            "out_dir", f"{path} is unreadable ({exc}); it is not a run's folder"
        ) from exc
    return parse_identity(data, str(path))


def save(folder: Path, identity: RunIdentity) -> None:
    """Keeps ``identity`` as the folder's ``run.json``, whole (a temp file, then a rename)."""
    Storage(folder).write(RUN_NAME, identity_bytes(identity))


class LineDigests:
    """Writes the new ``lines.fp`` while comparing it with the old one, line by line, keyed by
    each line's identity: a line whose request changed, a line added and (over a whole input)
    a line removed are changes; a line that moved, as when a comment is added above it, is
    not (its key does not change).

    ``old`` is the record to compare with (default: the folder's own); ``within`` is the range
    of new line numbers compared (a shard compares its range with a whole run's record: lines
    the shard does not hold are not removed).

    Most reruns send the same input: entries are compared in order as they come, in constant
    memory, and only when they stop matching does :meth:`finish` compare by identity, on disk.
    """

    def __init__(
        self, folder: Path, *, old: Path | None = None, within: range | None = None
    ) -> None:
        self.folder = folder
        self._old_path = folder / LINES_NAME if old is None else old
        self._within = within
        self._had_old = self._old_path.exists()
        self._old = _read_entries(self._old_path, within)
        self._in_step = True  # every entry so far matched the old one at its place
        self._tmp = temp_name(folder / LINES_NAME)
        self._out: BinaryIO = os.fdopen(create_new(self._tmp), "wb")
        self._input_digest = hashlib.sha256()
        # Every change (new, changed and removed lines: what needs consent), and apart: the
        # new or changed lines (numbered as in this input) and the removed ones (numbered as
        # in the run's), each the first ones in order and how many in all.
        self.changed: list[int] = []
        self.changed_count = 0
        self.added: list[int] = []
        self.added_count = 0
        self.removed: list[int] = []
        self.removed_count = 0

    def add(self, line: int, digest: bytes) -> None:
        entry = _ENTRY.pack(line, digest)
        self._out.write(entry)
        self._input_digest.update(entry)
        if self._in_step:
            previous = next(self._old, None)
            self._in_step = previous is not None and previous[1] == digest

    def finish(self) -> str:
        """Ends the comparison; returns the new input's digest. The new entries are kept
        aside until :meth:`commit`."""
        self._out.close()
        if not self._had_old:
            return self._input_digest.hexdigest()
        if self._in_step and next(self._old, None) is None:
            return self._input_digest.hexdigest()
        self._old.close()
        self._compare_by_identity()
        return self._input_digest.hexdigest()

    def _compare_by_identity(self) -> None:
        # An anonymous SQLite database lives in a temporary file: a million lines' entries
        # need no memory of ours. Lines are matched on the identity half of their digests.
        db = sqlite3.connect("")
        try:
            for table in ("old", "new"):
                db.execute(f"CREATE TABLE {table} (id BLOB PRIMARY KEY, fp BLOB, line INTEGER)")
            rows = ((d[:_ID], d[_ID:], n) for n, d in _read_entries(self._old_path))
            db.executemany("INSERT OR REPLACE INTO old VALUES (?, ?, ?)", rows)
            rows = ((d[:_ID], d[_ID:], n) for n, d in _read_entries(self._tmp))
            db.executemany("INSERT OR REPLACE INTO new VALUES (?, ?, ?)", rows)
            added = (
                "SELECT new.line FROM new LEFT JOIN old ON old.id = new.id"
                " WHERE old.id IS NULL OR old.fp != new.fp"
            )
            # Lines the input no longer has, at their old numbers (a shard compares only its
            # range: the rest of the run's lines are not removed).
            removed = (
                "SELECT old.line FROM old LEFT JOIN new ON new.id = old.id WHERE new.id IS NULL"
            )
            self.added_count, self.added = _count_and_first(db, added)
            if self._within is None:
                self.removed_count, self.removed = _count_and_first(db, removed)
            self.changed_count = self.added_count + self.removed_count
            self.changed = sorted(self.added + self.removed)[:KEPT]
        finally:
            db.close()

    def new_entries(self) -> bytes:
        """The new record's bytes (after :meth:`finish`)."""
        return self._tmp.read_bytes()

    def commit(self) -> None:
        """Makes the new entries the folder's record of its input."""
        with self._tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        refuse_link(self.folder / LINES_NAME)
        os.replace(self._tmp, self.folder / LINES_NAME)

    def discard(self) -> None:
        if not self._out.closed:
            self._out.close()
        self._old.close()
        self._tmp.unlink(missing_ok=True)


KEPT = 1000  # changed line numbers kept, of each kind


def _count_and_first(db: sqlite3.Connection, query: str) -> tuple[int, list[int]]:
    (count,) = db.execute(f"SELECT count(*) FROM ({query})").fetchone()
    found = db.execute(f"SELECT line FROM ({query}) ORDER BY line LIMIT {KEPT}")
    return count, [line for (line,) in found]


def _read_entries(
    path: Path, within: range | None = None
) -> Generator[tuple[int, bytes], None, None]:
    refuse_link(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size % _ENTRY.size:
            raise RequestValidationError(
                "out_dir",
                f"{path} is damaged (its size, {size} bytes, is not a whole number of "
                f"entries); delete it and rerun: the input is then compared with nothing",
            )
        while chunk := handle.read(_ENTRY.size * 4096):
            for line, digest in _ENTRY.iter_unpack(chunk):
                if within is None or line in within:
                    yield line, digest
                elif line >= within.stop:
                    return


def entry_lines(path: Path) -> Iterator[int]:
    """The line numbers a ``lines.fp`` records, in order: every good line of the input."""
    for line, _ in _read_entries(path):
        yield line


def identity_bytes(identity: RunIdentity) -> bytes:
    """``run.json``'s content for ``identity``."""
    fields: dict[str, object] = {
        "format": FORMAT,
        "run_id": identity.run_id,
        # The file's field keeps its first name: run.json is a format other versions read.
        "input_fingerprint": identity.input_digest,
        "updated_at": time.time(),
    }
    if identity.surface is not None:
        fields["surface"] = identity.surface
    if identity.key_fingerprint is not None:
        fields["key_fingerprint"] = identity.key_fingerprint
    for field, value in (("name", identity.name), ("input", identity.input_path)):
        if value is not None:
            fields[field] = value
    return json.dumps(fields, indent=1).encode() + b"\n"


def parse_identity(data: bytes, where: str) -> RunIdentity:
    """The identity in a ``run.json``'s content (``where`` names it in errors)."""
    try:
        parsed = json_loads(data)
    except ValueError as exc:
        raise RequestValidationError(
            "out_dir", f"{where} is unreadable ({exc}); it is not a run's folder"
        ) from exc
    version = parsed.get("format", 0) if isinstance(parsed, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT:
        raise RequestValidationError(
            "out_dir", f"{where} was written by a newer imggw: upgrade to resume it"
        )
    run_id = parsed.get("run_id") if isinstance(parsed, dict) else None
    if not isinstance(version, int) or not isinstance(run_id, str) or not run_id:
        raise RequestValidationError(
            "out_dir", f"{where} is damaged (no run id); it is not a run's folder"
        )
    surface = parsed.get("surface")
    if surface is not None and surface not in rules.SURFACES:
        # It picks the surface a rerun's requests go to and is shown in messages: only a
        # surface the spec names is one.
        raise RequestValidationError(
            "out_dir",
            f"{where} is damaged (its surface is not one); it is not a run's folder as imggw"
            " wrote it",
        )
    fingerprint = parsed.get("key_fingerprint")
    if fingerprint is not None and not _is_fingerprint(fingerprint):
        # Whoever can write the folder chose it, and messages show it: only hex is one.
        raise RequestValidationError(
            "out_dir",
            f"{where} is damaged (its key fingerprint is not one); it is not a run's"
            " folder as imggw wrote it",
        )
    return RunIdentity(
        run_id,
        str(parsed.get("input_fingerprint", "")),
        surface if isinstance(surface, str) else None,
        fingerprint if isinstance(fingerprint, str) and fingerprint else None,
        name=_recorded_text(parsed.get("name")),
        input_path=_recorded_text(parsed.get("input")),
    )


def _recorded_text(value: object) -> str | None:
    """A recorded template or input path: bounded text (checked again where it is used)."""
    ok = isinstance(value, str) and 0 < len(value) <= 4096 and "\0" not in value
    return value if ok and isinstance(value, str) else None


def _is_fingerprint(value: object) -> bool:
    """Whether ``value`` has the form of a key fingerprint: lowercase hex, as
    ``key_fingerprint`` writes it."""
    return (
        isinstance(value, str)
        and 16 <= len(value) <= 128
        and all(c in "0123456789abcdef" for c in value)
    )


# ---------------------------------------------------------------------------- in a storage


IDENTITY_WAIT = 30.0  # how long a shard waits for the run's lines.fp its creator is writing


def load_stored(storage: Storage) -> RunIdentity | None:
    """The identity a (maybe remote) output folder keeps, or None if no run began there."""
    data = storage.read(RUN_NAME)
    if data is None:
        return None
    return parse_identity(data, storage.where(RUN_NAME))


def claim(
    storage: Storage,
    digests: LineDigests,
    input_digest: str,
    *,
    run_id: str,
    surface: str,
    key_fingerprint: str | None = None,
    name: str | None = None,
    input_path: str | None = None,
) -> tuple[RunIdentity, bool]:
    """The run's identity in ``storage``: created here, exactly once, if the folder has none
    (an exclusive create: of shards started at once on a fresh folder, one wins and every
    other loads its run id; each derives the same id, so none depends on which wins). Returns
    it and whether it was made here; its maker publishes the input's record at once. ``name``
    and ``input_path`` are kept for a rerun as a single run keeps them."""
    identity = RunIdentity(
        run_id, input_digest, surface, key_fingerprint, name=name, input_path=input_path
    )
    if storage.create(RUN_NAME, identity_bytes(identity)):
        publish_lines(storage, digests)
        return identity, True
    found = load_stored(storage)
    if found is None:  # pragma: no cover - a run.json deleted in that very instant
        raise StorageError(f"{storage.where(RUN_NAME)} vanished", code="storage_failed")
    return found, False


def adopt_key(storage: Storage, run: RunIdentity, fingerprint: str | None) -> RunIdentity:
    """The run, checked against this key and, when its record does not name a key yet (made by
    a driver without one, or by an older imggw), made to name this one: a rerun with another key
    is then refused, not left to mark every line ``not_found``. Read back after writing: of
    two processes with different keys recording at once, one is refused."""
    check_key(storage.url, run, fingerprint)
    if fingerprint is None or run.key_fingerprint is not None:
        return run
    storage.write(RUN_NAME, identity_bytes(dataclasses.replace(run, key_fingerprint=fingerprint)))
    kept = load_stored(storage)
    check_key(storage.url, kept, fingerprint)
    return kept or run


def publish_lines(storage: Storage, digests: LineDigests) -> None:
    """Makes the compared input the run's record of its input (``lines.fp``), whole."""
    storage.write(LINES_NAME, digests.new_entries())


def wait_for_lines(storage: Storage, timeout: float = IDENTITY_WAIT) -> bool:
    """Waits (a little) for the run's ``lines.fp``, which its maker writes just after
    ``run.json``. False if it never came (its maker died between the two)."""
    deadline = time.monotonic() + timeout
    while storage.size(LINES_NAME) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class IdentityStore(Protocol):
    """Where a run's identity is kept: the run id every key follows from, the surface it was
    made on, and the record of its input the plan compares with (a single run's folder, or a
    shard's: ``_shards``)."""

    run_id: str

    def previous_surface(self) -> str | None:
        """The surface the run was made on, if the store tells it."""

    def digests(self) -> LineDigests:
        """A comparison of the input with the record, written beside it until accepted."""

    def accept(self, digests: LineDigests, input_digest: str) -> None:
        """The plan goes: keep what it compared as the record (before anything is sent)."""


class FolderIdentity:
    """A single run's identity, in its output folder: ``run.json`` and ``lines.fp``. A folder
    with no ``run.json`` gets the run id ``derive`` makes (the same for the same folder,
    gateway and key: a folder made again replays its tasks), or a random one with
    ``new_run`` (refused where a run is already kept: that folder's lines have their keys).
    ``key_fingerprint``: the slow fingerprint of this run's API key, kept in ``run.json``; a
    folder whose run was made with another key is refused (``KeyChangedError``) before
    anything is sent (None: a dry run, which sends nothing and needs no key). ``name`` and
    ``input_path``: the run's file name template and input, kept in ``run.json`` for a rerun
    and its resume hint (None: left as recorded)."""

    def __init__(
        self,
        folder: Path,
        *,
        surface: str,
        derive: Callable[[], str] | None = None,
        new_run: bool = False,
        key_fingerprint: str | None = None,
        name: str | None = None,
        input_path: str | None = None,
    ) -> None:
        self.folder = folder
        self.surface = surface
        self.key_fingerprint = key_fingerprint
        self.name = name
        self.input_path = input_path
        self.run = load(folder)
        check_key(folder, self.run, key_fingerprint)
        if new_run and self.run is not None:
            raise RequestValidationError(
                "out_dir",
                f"{folder} holds a run already ({RUN_NAME}): --new-run (new_run=True) "
                "starts one only in a folder without one; use another folder; nothing was sent",
                code="run_exists",
            )
        if self.run is not None:
            self.run_id = self.run.run_id
        elif new_run or derive is None:
            self.run_id = random_run_id()
        else:
            self.run_id = derive()

    def previous_surface(self) -> str | None:
        return self.run.surface if self.run is not None else None

    def digests(self) -> LineDigests:
        return LineDigests(self.folder)

    def accept(self, digests: LineDigests, input_digest: str) -> None:
        run = self.run
        fingerprint = self.key_fingerprint or (run.key_fingerprint if run is not None else None)
        name = self.name or (run.name if run is not None else None)
        source = self.input_path or (run.input_path if run is not None else None)
        if (
            run is None
            or run.input_digest != input_digest
            or run.surface != self.surface
            or run.key_fingerprint != fingerprint  # a record older than keeping it gets it now
            or (run.name, run.input_path) != (name, source)
        ):
            # Before anything is sent: the keys of every line follow from this run id.
            kept = RunIdentity(
                self.run_id, input_digest, self.surface, fingerprint, name=name, input_path=source
            )
            save(self.folder, kept)
            digests.commit()
