"""A dry run (DESIGN 14): every check a run makes before it sends (bad lines, a changed input,
a folder in use: the same errors), then what the run would do, and not one request sent
(``imggw batch --dry-run``).

The plan is made in the folder's ledger, inside a transaction that is rolled back: the folder
is left as it was (a ledger or folder that the dry run made is removed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.config import check_surface
from .._core.states import State
from . import _identity
from ._admission import Charge, Spending, Verdict
from ._ledger import Ledger, remove_if_empty
from ._lines import COLLECT, GENERATE
from ._options import BatchOptions
from ._plan import FolderIdentity, Plan, plan_run
from ._schema import BAD, FINAL, KEPT, UNKNOWN

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._options import RunOptions

__all__ = ["BatchPlan", "plan_batch"]

DEFAULT_SURFACE = "beta"


@dataclass(frozen=True)
class BatchPlan:
    """What a run of the folder would do now. Lines: ``total`` (bad ones included),
    ``to_submit`` (never sent), ``to_wait`` (sent, unfinished: waited on, then downloaded),
    ``to_collect`` (tasks made elsewhere, not saved yet), ``done`` (finished: saved, failed or
    expired), ``changed`` (new or changed since the folder's run: new requests), ``bad``.
    ``estimate`` is what the lines to submit would cost (``{credits, cost}``, from the highest
    charge this folder's run has seen per resolution; None before any charge), ``spent`` what
    the folder's run was charged so far, and with a cap, ``fit`` how many of the lines to
    submit fit under it at the prices seen (None without a cap, or before any charge).
    ``comments`` counts the input's comment lines, skipped (``#`` then whitespace or nothing:
    ``#hashtag sunset`` is a prompt, counted in ``total``).

    Example::

        plan = plan_batch("prompts.jsonl", "out/", max_credits=400)
        print(plan.to_submit, plan.estimate, plan.fit)
    """

    total: int
    to_submit: int
    to_wait: int
    to_collect: int
    done: int
    changed: int
    bad: int
    estimate: dict[str, float | None] | None
    spent: dict[str, float | None]
    fit: int | None = None
    max_credits: float | None = None
    max_cost: float | None = None
    comments: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The plan as ``imggw batch --dry-run --json`` prints it."""
        return asdict(self)


def plan_batch(
    source: str | Path | Iterable[Any],
    out_dir: str | Path,
    **options: Unpack[RunOptions],
) -> BatchPlan:
    """What :func:`run_batch` with the same input, folder and options would do now, with every
    check it makes before sending (:class:`BatchInputError`, :class:`InputChangedError`,
    :class:`BatchLockedError`: the same errors) and not one request sent. The folder is left as
    it was. No API key is needed: nothing is sent and no key is made.

    Example::

        plan = plan_batch("prompts.jsonl", "out/", max_credits=400)
        if plan.fit is not None and plan.fit < plan.to_submit:
            print(f"only {plan.fit} of {plan.to_submit} lines fit under the cap")
    """
    chosen = BatchOptions.of(options)
    folder = Path(out_dir)
    made = not folder.exists()
    found: list[BatchPlan] = []
    try:
        with Ledger.open(folder) as ledger:
            try:
                kept = _identity.load(folder)
                surface = check_surface(
                    chosen.surface or (kept.surface if kept else None) or DEFAULT_SURFACE
                )
                # No key is made in a dry run: any run id will do (nothing is kept).
                identity = FolderIdentity(folder, surface=surface, new_run=chosen.new_run)

                def look(planned: Ledger, plan: Plan) -> None:
                    found.append(_look(planned, plan, chosen))

                plan_run(
                    source, folder, ledger, identity, surface=surface, options=chosen, dry=look
                )
            finally:
                ledger.discard()  # only if this dry run made it
    finally:
        if made:
            remove_if_empty(folder)
    return found[0]


def _look(ledger: Ledger, plan: Plan, options: BatchOptions) -> BatchPlan:
    kinds = ledger.kinds()
    prices = {res: Charge(*charge) for res, charge in ledger.charges().items()}
    totals = ledger.totals()
    spending = Spending(options.caps, spent=Charge(totals.credits, totals.cost), prices=prices)
    pending = ledger.waiting_by_resolution(UNKNOWN)
    estimate = None
    if prices:
        credits, cost = 0.0, 0.0
        for res, n in pending.items():
            each = spending.estimate(res) or Charge()
            credits += (each.credits or 0.0) * n
            cost += (each.cost or 0.0) * n
        stated_cost = any(p.cost is not None for p in prices.values())
        estimate = {"credits": credits, "cost": round(cost, 6) if stated_cost else None}
    fit = None
    if options.caps.spend and prices:
        fit = 0
        for res in _in_order(ledger):
            if spending.admit(fit, res) is not Verdict.GO:
                break
            spending.charged(fit, res, Charge(), spending.estimate(res) or Charge(), final=True)
            fit += 1
    seen_cost = totals.cost or any(p.cost is not None for p in prices.values())

    def count(kind: str, states: Iterable[State]) -> int:
        return sum(kinds.get((kind, state), 0) for state in states)

    unfinished = [s for s in KEPT if s not in FINAL and s is not UNKNOWN]
    return BatchPlan(
        total=sum(kinds.values()),
        to_submit=count(GENERATE, [UNKNOWN]),
        to_wait=count(GENERATE, unfinished),
        to_collect=count(COLLECT, [s for s in KEPT if s not in FINAL]),
        done=count(GENERATE, FINAL) + count(COLLECT, FINAL),
        changed=plan.changed_count,
        bad=count(BAD, KEPT),
        estimate=estimate,
        spent={"credits": totals.credits, "cost": round(totals.cost, 6) if seen_cost else None},
        fit=fit,
        max_credits=options.max_credits,
        max_cost=options.max_cost,
        comments=plan.comments,
    )


def _in_order(ledger: Ledger) -> Iterable[str]:
    """The resolutions of the lines to submit, in line order (the order a run sends them)."""
    for row in ledger.iter_rows(states=(UNKNOWN,)):
        if row.kind == GENERATE:
            yield str(row.fields.get("resolution", ""))
