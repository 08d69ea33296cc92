"""A dry run (``batch/_run.py``): what a run would do now and cost, with every check a run
makes, not one request sent and the folder left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imggw_client import PollPolicy
from imggw_client.batch import BatchInputError, plan_batch, run_batch
from imggw_client.mock import MockGateway

FAST = {"poll": PollPolicy(initial_interval=0.02, max_interval=0.1)}


def prompts(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_a_new_folder_is_planned_and_left_as_it_was(tmp_path: Path) -> None:
    source = prompts(tmp_path / "in.txt", ["a fox", "# a note", "a cat", "an owl"])
    plan = plan_batch(source, tmp_path / "out", max_credits=100)
    assert (plan.total, plan.to_submit, plan.to_wait, plan.done, plan.comments) == (3, 3, 0, 0, 1)
    assert plan.estimate is None
    assert plan.fit is None
    assert plan.spent == {"credits": 0.0, "cost": None}
    assert not (tmp_path / "out").exists()
    assert json.loads(json.dumps(plan.as_dict()))["to_submit"] == 3


def test_bad_lines_are_refused_as_a_run_would_or_counted_when_skipped(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a fox"}\n{"colour": "red"}\n')
    with pytest.raises(BatchInputError):
        plan_batch(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert plan_batch(source, tmp_path / "out", skip_bad_lines=True).bad == 1


def test_more_bad_lines_than_a_message_lists_leave_the_folder_as_it_was(tmp_path: Path) -> None:
    # Past ten bad lines a run lists them in bad-lines.txt; a dry run made the folder to write
    # it, and with ten or fewer removed the listing an earlier run had left.
    source = tmp_path / "in.jsonl"
    source.write_text('{"colour": "red"}\n' * 12)
    with pytest.raises(BatchInputError) as refused:
        plan_batch(source, tmp_path / "out")
    assert (refused.value.count, refused.value.listing) == (12, None)
    assert not (tmp_path / "out").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "bad-lines.txt").write_text("an earlier run's listing\n")
    source.write_text('{"colour": "red"}\n{"prompt": "a fox"}\n')
    assert plan_batch(source, kept, skip_bad_lines=True).bad == 1
    # The folder's lock stays, as after any run: removed, a run starting then could share it.
    assert sorted(p.name for p in kept.iterdir()) == [".imggw-batch.lock", "bad-lines.txt"]
    assert (kept / "bad-lines.txt").read_text() == "an earlier run's listing\n"


@pytest.mark.gateway(duration_min=0.01, duration_max=0.02)
def test_a_folder_with_prices_is_estimated_and_its_cap_says_how_many_fit(
    gateway: MockGateway, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = prompts(tmp_path / "in.txt", ["p0", "p1", "p2"])
    assert run_batch(first, out, client_factory=lambda: gateway.async_client(**FAST)).exit_code == 0
    made = gateway.stats()["tasks_created"]
    more = prompts(tmp_path / "in.txt", ["p0", "p1", "p2", "p3", "p4", "p5"])
    before = sorted(p.name for p in out.iterdir())
    plan = plan_batch(more, out, allow_changes=True, max_credits=24)
    assert (plan.to_submit, plan.done, plan.changed) == (3, 3, 3)
    assert plan.estimate == {"credits": 12.0, "cost": 0.03}  # 3 lines at the price seen
    assert plan.spent == {"credits": 12.0, "cost": 0.03}
    assert plan.fit == 3  # 12 spent + 3 x 4 <= 24
    assert plan_batch(more, out, allow_changes=True, max_credits=20).fit == 2
    assert gateway.stats()["tasks_created"] == made  # nothing sent
    assert sorted(p.name for p in out.iterdir()) == before
