"""Runs every benchmark in turn and prints their reports: the one command behind BENCHMARKS.md.

Run: python bench/run_all.py [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
SUITE = [
    ("overhead", ["overhead.py"], ["overhead.py", "--rounds", "5", "--per-round", "100"]),
    ("gateway", ["gateway.py"], ["gateway.py", "--seconds", "2", "--rounds", "1"]),
    ("startup", ["startup.py"], ["startup.py", "--runs", "5"]),
    ("polling", ["polling.py", "--virtual"], ["polling.py", "--virtual", "--tasks", "1000"]),
    ("polls that learn", ["polling.py"], ["polling.py", "--quick"]),
    ("scale", ["scale.py"], ["scale.py", "--tasks", "2000"]),
    ("downloads", ["downloads.py"], ["downloads.py", "--files", "10", "--big-mb", "64"]),
    ("batch", ["batch.py"], ["batch.py", "--quick"]),
    ("collect", ["collect.py"], ["collect.py", "--quick"]),
    ("gallery", ["gallery.py"], ["gallery.py", "--quick"]),
    ("soak", ["soak.py"], ["soak.py", "--requests", "100"]),
    ("budget", ["budget.py"], ["budget.py", "--quick"]),
    ("bursts", ["bursts.py", "--full"], ["bursts.py", "--part", "1"]),
    ("scale_out", ["scale_out.py"], ["scale_out.py", "--lines", "200"]),
    ("guards", ["guards.py"], ["guards.py", "--quick"]),
    ("shared budget", ["shared_budget.py"], ["shared_budget.py", "--quick"]),
    ("journal", ["journal.py"], ["journal.py", "--quick"]),
    ("tenants", ["tenants.py"], ["tenants.py"]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke check")
    args = parser.parse_args()
    failed = []
    for name, full, quick in SUITE:
        command = [sys.executable, str(HERE / (quick if args.quick else full)[0]),
                   *(quick if args.quick else full)[1:]]  # fmt: skip
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        done = subprocess.run(command, check=False)
        print(f"   ({time.monotonic() - started:.0f} s)\n", flush=True)
        if done.returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
