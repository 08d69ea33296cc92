"""Any run's folder read back (``batch/scale/_folder.py``): a single run's status and charges from
its ledger alone, a folder that holds no run refused, and shards' manifests merged whole, lines
no shard reached yet pending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imggw_client import PollPolicy
from imggw_client._core.exceptions import RequestValidationError
from imggw_client.batch import merge, run_batch, run_shard, status
from imggw_client.batch._admission import Charge
from imggw_client.batch.scale._folder import charges
from imggw_client.batch.scale._storage import open_storage
from imggw_client.mock import MockGateway

FAST = {"poll": PollPolicy(initial_interval=0.02, max_interval=0.1)}

pytestmark = pytest.mark.gateway(duration_min=0.01, duration_max=0.02)


def test_a_single_runs_status_and_charges_come_from_its_folder_alone(
    gateway: MockGateway, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"colour": "red"}\n')
    out = tmp_path / "out"
    report = run_batch(
        source, out, skip_bad_lines=True, client_factory=lambda: gateway.async_client(**FAST)
    )
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
    gateway: MockGateway,
    tmp_path: Path,
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"p{n}\n" for n in range(6)))
    out = tmp_path / "out"
    made = lambda: gateway.async_client(**FAST)  # noqa: E731
    assert run_shard(str(source), str(out), index=2, count=2, client_factory=made).exit_code == 0
    merged = merge(out, gallery=False)
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["status"] for r in rows] == ["pending"] * 3 + ["succeeded"] * 3
    assert merged.counts == {"pending": 3, "succeeded": 3}
    assert merged.exit_code == 3
    assert not (out / "index.html").exists()


def test_status_tells_an_active_run_expired_results_and_the_soonest_expiry(
    tmp_path: Path,
) -> None:
    """What an operator acts on (DESIGN 21): whether a run holds the folder, results that
    expired counted apart from failures, and when the soonest unsaved result's links die."""
    from imggw_client.batch._schema import EXPIRED, FAILED, RUNNING, SAVED

    from .ledgers import planned, row

    out = tmp_path / "out"
    rows = [
        row(1, SAVED, task_id="1", files=["1-0.png"]),
        row(2, FAILED, task_id="2", error_code="task_failed", error_message="no"),
        row(3, EXPIRED, task_id="3", error_code="result_expired", error_message="gone"),
        row(4, RUNNING, task_id="4", expires_at=2_000_000_000.0),
        row(5, RUNNING, task_id="5", expires_at=1_900_000_000.0),
        row(6, RUNNING, task_id="6"),
    ]
    with planned(out, rows):
        (out / "run.json").write_text('{"format": 1, "run_id": "r", "surface": "beta"}')
        held = status(out)
    assert held.active is True  # the ledger's lock is held while the run has it open
    after = status(out)
    assert after.active is False
    assert after.counts == {"pending": 0, "running": 3, "succeeded": 1, "failed": 1}
    assert after.expired == 1
    assert after.total == 6
    assert after.soonest_expiry == "2030-03-17T17:46:40Z"  # line 5's, the sooner of 4 and 5
    assert after.exit_code == 3  # some still to do
    record = json.loads(json.dumps(after.as_dict()))
    assert (record["expired"], record["active"]) == (1, False)


def test_expired_results_alone_exit_as_failures(tmp_path: Path) -> None:
    from imggw_client.batch._schema import EXPIRED, SAVED

    from .ledgers import planned, row

    out = tmp_path / "out"
    with planned(
        out,
        [
            row(1, SAVED, task_id="1", files=["1-0.png"]),
            row(2, EXPIRED, task_id="2", error_code="result_expired"),
        ],
    ):
        (out / "run.json").write_text('{"format": 1, "run_id": "r", "surface": "beta"}')
    found = status(out)
    assert found.counts["failed"] == 0
    assert found.expired == 1
    assert found.exit_code == 1
