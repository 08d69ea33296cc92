"""``imggw batch --dry-run``: what a run would do and cost, checked as a run checks its input
and folder, for people (a fact a line) or as one JSON object; nothing is sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._command import session
from ._globals import current


def dry_run_local(source: str, output: Path, **options: Any) -> None:
    """``--dry-run``: the plan of a run, on stdout (one JSON object with --json); nothing is
    sent, and the folder is left as it was."""
    from imggw_client.batch import plan_batch

    flags = current()
    with session() as out:
        options["surface"] = flags.surface
        plan = plan_batch(source, output, **options)
        out.data(plan.as_dict(), plan_lines(plan))


def plan_lines(plan: Any) -> list[str]:
    """A dry run's plan for people, a fact a line."""
    lines = [
        f"lines: {plan.total} ({plan.to_submit} to submit, {plan.to_wait} to wait for, "
        f"{plan.to_collect} to collect, {plan.done} done, {plan.bad} bad)",
        f"changed since the folder's run: {plan.changed}",
        f"comment lines (skipped): {plan.comments}",
        f"spent so far: {plan.spent['credits']:g} credits, cost "
        f"{'unknown' if plan.spent['cost'] is None else format(plan.spent['cost'], 'g')}",
    ]
    if plan.estimate is None:
        lines.append("estimate: unknown (no charge seen yet in this folder's run)")
    else:
        cost = plan.estimate["cost"]
        lines.append(
            f"estimate for the lines to submit: {plan.estimate['credits']:g} credits, "
            f"cost {'unknown' if cost is None else format(cost, 'g')}"
        )
    if plan.fit is not None:
        lines.append(f"under the cap: {plan.fit} of the {plan.to_submit} lines to submit fit")
    lines.append("nothing was sent")
    return lines
