"""The shards of a Dask run on its cluster (``batch/scale/_dask_dispatch.py``), without a cluster:
what a worker makes its client from (never the key), an error that travels back whole or as
its words, and one outcome per shard covering the input."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest

from imggw_client import RetryPolicy
from imggw_client._base_client import key_fingerprint
from imggw_client._core.exceptions import ImggwError, InvalidRequestError
from imggw_client.batch._identity import RunIdentity
from imggw_client.batch._plan import BatchOptions
from imggw_client.batch.scale._dask_dispatch import (
    ClientSpec,
    Dispatch,
    HeldTickets,
    Prepared,
    ShardError,
    ShardOutcome,
    _portable,
)
from imggw_client.batch.scale._shards import ShardReport, ShardSpec


@pytest.mark.anyio
async def test_a_worker_makes_its_client_from_the_spec_and_its_own_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IMGGW_API_KEY", "sk-worker-own-key-0001")
    spec = ClientSpec(
        base_url="http://127.0.0.1:9",
        surface="alpha",
        timeout=12.0,
        retry=RetryPolicy(max_attempts=2),
    )
    assert b"sk-worker" not in pickle.dumps(spec)  # what travels in a task holds no key
    async with spec.make() as client:
        assert (client.base_url, client.surface, client.retry.max_attempts) == (
            "http://127.0.0.1:9",
            "alpha",
            2,
        )
        assert client.key_fingerprint == key_fingerprint("sk-worker-own-key-0001")  # its own


def test_a_shards_error_travels_whole_or_as_its_words() -> None:
    class Unpicklable(ImggwError):  # a class of a function's own: pickle cannot name it
        pass

    plain = InvalidRequestError("bad", status_code=400, code="invalid_request")
    assert _portable(plain) is plain
    odd = _portable(Unpicklable("it broke", code="odd"))
    assert isinstance(odd, ShardError)
    assert (odd.message, odd.kind, odd.code) == ("it broke", "Unpicklable", "odd")
    again = pickle.loads(pickle.dumps(odd))
    assert (again.message, again.kind, again.code) == ("it broke", "Unpicklable", "odd")


def test_one_outcome_per_shard_covers_every_line_of_the_input() -> None:
    run = RunIdentity("run-1", "digest", "beta", None)
    prepared = Prepared(run, total=10, count=3, scan=None, first_entries=[1, 4, 7])  # type: ignore[arg-type]
    template = ShardSpec("", "out", 1, 3, BatchOptions())
    dispatch = Dispatch(prepared, "input.txt", template, ClientSpec(), retries=2, on_shard=None)
    lines = [n for outcome in dispatch.outcomes for n in outcome.lines]
    assert lines == list(range(1, 11))
    assert [o.name for o in dispatch.outcomes] == ["0001-of-0003", "0002-of-0003", "0003-of-0003"]
    outcome = dispatch.outcomes[0]
    assert not outcome.ended
    assert outcome.attempts == 0
    outcome.report = ShardReport(index=1, count=3, lines=outcome.lines, counts={}, elapsed=0.1)
    assert outcome.ended
    assert ShardOutcome(2, 3, range(4, 7), 1, error=RuntimeError("x")).ended
    assert Path(template.folder) == Path("shards/0001-of-0003")


@pytest.mark.anyio
async def test_a_scheduler_that_cannot_take_back_a_slot_never_hides_the_shards_outcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # give_back runs in the shard task's `finally`: an error there would replace the shard's
    # own result (or its error) with the scheduler's.
    released: list[Hashable] = []

    class Gone:
        async def reserve(self, kind: str) -> tuple[Hashable, float]:
            return kind, 0.0

        async def wait_time(self, ticket: Hashable) -> float:
            return 0.0

        async def release(self, ticket: Hashable) -> None:
            released.append(ticket)
            raise OSError("scheduler unreachable")

        async def finished(self, ticket: Hashable, **ended: Any) -> None: ...

    held = HeldTickets(Gone())
    await held.reserve("submit")
    await held.reserve("query")
    with caplog.at_level(logging.WARNING, logger="imggw_client"):
        await held.give_back()
    assert held.held == set()
    assert sorted(map(str, released)) == ["query", "submit"]  # each asked once, none raised
    assert [
        r.getMessage().startswith("a shard's budget slot was not given back (OSError)")
        for r in caplog.records
    ] == [True, True]
