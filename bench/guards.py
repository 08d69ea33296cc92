"""The spend guard at scale: N lines (10,000) through ``run_batch`` against the in-process
reference gateway (4 credits a 1k task), capped at half the input's cost, against the same
lines uncapped, measured in the same run.

Printed: tasks the capped run created against the cap's count (target: exactly
floor(cap / price)), what it was charged against the cap, and its wall time per task created
against the uncapped run's (the guard's cost). A third run caps above the input's whole cost,
so the guard checks every line and never stops: its wall time against the uncapped run's is the
guard's cost alone. A mixed run (1k and 4k lines, 4 and 16 credits) shows the charge against
the cap when lines are estimated per resolution.

Never a credit past the cap (DESIGN 18), what the gateway billed against each cap: a run whose
gateway states a charge of 0 while tasks run (the ``charge_at_end`` quirk, as many providers
do), capped at half the input's cost; and runs of 1k lines then 4k lines, whose first 4k line
has no price yet, capped at the 1k lines' cost plus 10 credits (no 4k line fits its worst case)
and plus 100 (the first 4k line goes alone at its worst case, 64, then the rest at its price).

Each run is its own process (fresh gateway, fresh folder). Run: python bench/guards.py
[--lines N] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GATEWAY = {"duration_min": 0.05, "duration_max": 0.2, "retention": 30.0,
           "idempotency_ttl": 30.0, "seed": 1}  # fmt: skip
PRICE = 4.0  # credits of a 1k task on the reference gateway


def is_4k(i: int, lines: int, mix: str) -> bool:
    """Whether line ``i`` is a 4k one: every fourth (``interleaved``), the last quarter
    (``split``: 1k lines, then 4k lines), or none."""
    if mix == "interleaved":
        return i % 4 == 3
    return mix == "split" and i >= lines - lines // 4


def child(mode: str, lines: int, cap: float | None, mix: str, quirks: list[str]) -> dict[str, Any]:
    """One run in this process: the gateway in process, the batch through run_batch."""
    from imggw_client import PollPolicy
    from imggw_client.batch import run_batch
    from imggw_client.mock import MockGateway, fingerprint

    gateway = MockGateway(**GATEWAY, quirks=quirks)
    poll = PollPolicy(initial_interval=0.1, max_interval=0.3)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        with source.open("w") as out:
            for i in range(lines):
                line: dict[str, Any] = {"prompt": f"line {i}"}
                if is_4k(i, lines, mix):
                    line.update(resolution="4k", aspect_ratio="16:9")
                out.write(json.dumps(line) + "\n")
        options: dict[str, Any] = {"concurrency": 32, "gallery": False}
        if cap is not None:
            options["max_credits"] = cap
        started = time.perf_counter()
        report = run_batch(source, Path(tmp) / "out",
                           client_factory=lambda: gateway.async_client(poll=poll),
                           **options)  # fmt: skip
        wall = time.perf_counter() - started
    stats = gateway.stats()
    billed = stats["billing"].get(fingerprint(gateway.config.api_keys[0]), {}).get("credits", 0)
    return {"mode": mode, "lines": lines, "cap": cap, "wall": wall,
            "tasks": stats["tasks_created"], "credits": report.credits, "billed": billed,
            "stopped_by": report.stopped_by, "exit": int(report.exit_code)}  # fmt: skip


def run(
    mode: str, lines: int, cap: float | None, mix: str = "none", quirks: tuple[str, ...] = ()
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", mode, "--lines", str(lines), "--mix", mix]
    if cap is not None:
        command += ["--cap", str(cap)]
    for quirk in quirks:
        command += ["--quirk", quirk]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def within(result: dict[str, Any]) -> str:
    """The never-a-credit-past-the-cap figure of a capped run: what the gateway billed."""
    where = "within" if result["billed"] <= result["cap"] else "PAST"
    return f"billed {result['billed']:g} of {result['cap']:g} ({where} the cap)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="2,000 lines")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cap", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--mix", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--quirk", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    lines = 2000 if args.quick else args.lines
    if args.child:
        print(json.dumps(child(args.child, lines, args.cap, args.mix, args.quirk)))
        return
    half = lines * PRICE / 2
    uncapped = run("uncapped", lines, None)
    capped = run("capped at half", lines, half)
    above = run("capped above all", lines, lines * PRICE * 2)
    mixed_cap = (lines * 3 // 4 * 4 + lines // 4 * 16) / 2
    mixed = run("mixed, capped at half", lines, mixed_cap, mix="interleaved")
    at_end = run("charge 0 while running, capped at half", lines, half, quirks=("charge_at_end",))
    small = lines - lines // 4
    split_tight = run("1k then 4k, no room for a 4k", lines, small * PRICE + 10, mix="split")
    split_room = run("1k then 4k, room for some", lines, small * PRICE + 100, mix="split")
    figures = {
        "lines": lines,
        "cap": half,
        "tasks_created": capped["tasks"],
        "target_tasks": int(half // PRICE),
        "charged": capped["credits"],
        "stopped_by": capped["stopped_by"],
        "exit": capped["exit"],
        "wall_per_task_capped": capped["wall"] / max(capped["tasks"], 1),
        "wall_per_task_uncapped": uncapped["wall"] / max(uncapped["tasks"], 1),
        "wall_above_all": above["wall"],
        "wall_uncapped": uncapped["wall"],
        "mixed_cap": mixed_cap,
        "mixed_charged": mixed["credits"],
        "mixed_tasks": mixed["tasks"],
        "mixed_billed": mixed["billed"],
        "charge_at_end_cap": half,
        "charge_at_end_billed": at_end["billed"],
        "charge_at_end_tasks": at_end["tasks"],
        "charge_at_end_wall": at_end["wall"],
        "split_tight_cap": split_tight["cap"],
        "split_tight_billed": split_tight["billed"],
        "split_tight_tasks": split_tight["tasks"],
        "split_room_cap": split_room["cap"],
        "split_room_billed": split_room["billed"],
        "split_room_tasks": split_room["tasks"],
        "never_past_the_cap": all(
            r["billed"] <= r["cap"] for r in (capped, mixed, at_end, split_tight, split_room)
        ),
    }
    if args.json:
        print(json.dumps(figures))
        return
    ratio = figures["wall_per_task_capped"] / figures["wall_per_task_uncapped"]
    print(f"{lines} lines, 4 credits each, cap {half:g} credits (half the input's cost)")
    print(f"  tasks created: {capped['tasks']} (target floor(cap / price) = "
          f"{figures['target_tasks']}); charged {capped['credits']:g} of {half:g}; "
          f"stopped by {capped['stopped_by']} (exit {capped['exit']})")  # fmt: skip
    print(f"  wall per task: capped {figures['wall_per_task_capped'] * 1e3:.2f} ms, uncapped "
          f"{figures['wall_per_task_uncapped'] * 1e3:.2f} ms ({ratio:.2f}x)")  # fmt: skip
    print(f"  a cap never reached: {above['wall']:.1f} s against uncapped {uncapped['wall']:.1f}"
          f" s ({above['wall'] / uncapped['wall']:.2f}x), {above['tasks']} tasks")  # fmt: skip
    print(f"  mixed 1k/4k lines, cap {mixed_cap:g}: charged {mixed['credits']:g} "
          f"({mixed['tasks']} tasks), stopped by {mixed['stopped_by']}")  # fmt: skip
    print("never a credit past the cap (what the gateway billed):")
    for name, result in (("capped at half", capped), ("mixed 1k/4k", mixed),
                         ("charge 0 while running", at_end),
                         (f"{small} 1k then {lines // 4} 4k, cap +10", split_tight),
                         (f"{small} 1k then {lines // 4} 4k, cap +100", split_room)):  # fmt: skip
        print(f"  {name:<34} {within(result)}; {result['tasks']} tasks, "
              f"{result['wall']:.1f} s, exit {result['exit']}")  # fmt: skip


if __name__ == "__main__":
    main()
