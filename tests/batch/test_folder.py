"""Any run's folder read back (``batch/_folder.py``): a single run's status and charges from
its ledger alone, a folder that holds no run refused, and shards' manifests merged whole, lines
no shard reached yet pending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imggw_client import PollPolicy
from imggw_client._exceptions import RequestValidationError
from imggw_client.batch import merge, run_batch, run_shard, status
from imggw_client.batch._folder import charges
from imggw_client.batch._spending import Charge
from imggw_client.batch._storage import open_storage
from imggw_client.mock import MockGateway

FAST = {"poll": PollPolicy(initial_interval=0.02, max_interval=0.1)}


def test_a_single_runs_status_and_charges_come_from_its_folder_alone(tmp_path: Path) -> None:
    gw = MockGateway(duration_min=0.01, duration_max=0.02)
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"colour": "red"}\n')
    out = tmp_path / "out"
    report = run_batch(source, out, skip_bad_lines=True,
                       client_factory=lambda: gw.async_client(**FAST))  # fmt: skip
    assert report.exit_code == 1  # a bad line
    found = status(out)
    assert (found.total, found.bad, found.shards, found.stopped_by) == (2, 1, [], None)
    assert found.counts == {"pending": 0, "running": 0, "succeeded": 2, "failed": 0}
    assert found.spent == Charge(8.0, 0.02)
    assert found.exit_code == 1
    assert json.loads(json.dumps(found.as_dict()))["spent"] == {"credits": 8.0, "cost": 0.02}
    assert charges(open_storage(out)) == (Charge(8.0, 0.02), {"1k": Charge(4.0, 0.01)})


def test_a_folder_that_holds_no_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RequestValidationError, match="is not a batch's output folder"):
        status(tmp_path)
    with pytest.raises(RequestValidationError, match=r"\(no run.json\)"):
        merge(tmp_path)


def test_shards_merge_into_one_manifest_in_line_order_with_unreached_lines_pending(
    tmp_path: Path,
) -> None:
    gw = MockGateway(duration_min=0.01, duration_max=0.02)
    source = tmp_path / "in.txt"
    source.write_text("".join(f"p{n}\n" for n in range(6)))
    out = tmp_path / "out"
    made = lambda: gw.async_client(**FAST)  # noqa: E731
    assert run_shard(str(source), str(out), index=2, count=2, client_factory=made).exit_code == 0
    merged = merge(out, gallery=False)
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["status"] for r in rows] == ["pending"] * 3 + ["succeeded"] * 3
    assert merged.counts == {"pending": 3, "succeeded": 3}
    assert merged.exit_code == 3
    assert not (out / "index.html").exists()
