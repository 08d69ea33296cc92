"""CSV input cut into shards (``--shard I/N`` and the Dask engine): a record belongs to the
shard its first line is in, a record that runs across a cut is sent once and whole, every
slice reads the header, and a rerun sends nothing again. Over loopback against the reference
gateway; what it receives is read off its wire."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from imggw_cli._app import app
from imggw_client.batch import merge, run_shard
from imggw_client.batch._ledger import Ledger
from imggw_client.batch.scale._dask import ClientSpec, ShardedProgress, run_sharded
from imggw_client.mock import MockGateway

from ..test_input_formats import Wire
from .conftest import FAST, KEY

# 8 lines. Cut in 2 (lines 1-4, 5-8), the poster's record (lines 4-6) begins in the first
# shard and ends in the second; cut in 3 (1-2, 3-5, 6-8), it begins in the second and ends in
# the third. A CSV row that begins with # is a prompt: CSV has no comment lines.
CSV = 'prompt,id\na cat,c\n\n"a poster\nreading ""OPEN""\n",p\na dog,\n#hashtag owl,h\n'
PROMPTS = ["a cat", 'a poster\nreading "OPEN"\n', "a dog", "#hashtag owl"]
LINES = [2, 4, 7, 8]
IDENTITIES = {("id:c", 2), ("id:p", 4), ("line:3", 7), ("id:h", 8)}


pytestmark = pytest.mark.gateway(api_keys=[KEY], seed=3, duration_min=0.05, duration_max=0.2)


@pytest.fixture
def wire(gateway: MockGateway) -> Wire:
    return Wire(gateway)


def identities(out: Path) -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    for ledger_path in sorted(out.glob("shards/*/ledger.sqlite")):
        with Ledger.open(ledger_path.parent) as ledger:
            found |= {(row.identity, row.line) for row in ledger.iter_rows()}
    return found


def manifest(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_shards_take_each_record_where_it_begins_and_send_it_once_whole(
    gateway: MockGateway, wire: Wire, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.csv"
    source.write_text(CSV)
    out = tmp_path / "out"
    reports = [
        run_shard(
            source, out, index=i, count=2, client_factory=lambda: gateway.async_client(**FAST)
        )
        for i in (1, 2)
    ]
    assert [r.counts for r in reports] == [{"saved": 2}, {"saved": 2}]  # c and p; dog and owl
    assert sorted(p for _, p, _, _ in wire.submits) == sorted(PROMPTS)
    assert identities(out) == IDENTITIES
    assert merge(out).exit_code == 0
    assert [(r["line"], r["prompt"]) for r in manifest(out)] == list(
        zip(LINES, PROMPTS, strict=True)
    )
    again = run_shard(
        source, out, index=2, count=2, client_factory=lambda: gateway.async_client(**FAST)
    )
    assert (again.counts, again.changed_count) == ({"saved": 2}, 0)
    assert len(wire.submits) == 4


@pytest.mark.slow
def test_the_dask_engine_cuts_csv_into_slices_that_keep_every_record_whole(
    gateway: MockGateway, wire: Wire, gateway_url: str, dask_client: Any, tmp_path: Path
) -> None:
    source = tmp_path / "prompts.txt"  # not named .csv: --format says it
    source.write_text(CSV)
    out = tmp_path / "out"
    command = [
        "--json",
        "batch",
        str(source),
        "-o",
        str(out),
        "--engine",
        "dask",
        "--address",
        dask_client.scheduler.address,
        "--shard-size",
        "3",
        "--base-url",
        gateway_url,
        "--format",
        "csv",
    ]
    first = CliRunner().invoke(app, command, env={"IMGGW_API_KEY": KEY})
    assert first.exit_code == 0, first.stderr
    assert [json.loads(line)["line"] for line in first.stdout.splitlines()] == LINES
    assert sorted(p for _, p, _, _ in wire.submits) == sorted(PROMPTS)
    assert identities(out) == IDENTITIES
    assert [(r["line"], r["prompt"]) for r in manifest(out)] == list(
        zip(LINES, PROMPTS, strict=True)
    )

    seen: list[ShardedProgress] = []
    again = run_sharded(
        source,
        out,
        address=dask_client.scheduler.address,
        shard_size=3,
        client=ClientSpec(base_url=gateway_url, **FAST),
        format="csv",
        on_progress=seen.append,
        progress_every=0.05,
    )
    assert (again.exit_code, again.changed_count) == (0, 0)
    assert seen
    assert {p.total for p in seen} == {4}  # each record counted once, in one shard
    assert len(wire.submits) == 4  # nothing sent again
    assert gateway.stats()["tasks_created"] == 4
