"""The soak script's short version: every fault kind at 30%, both surfaces, both clients."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).parent.parent / "bench" / "soak.py"


def test_short_soak_bills_once_loses_nothing_and_verifies_every_file() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--requests", "80", "--seconds", "120", "--seed", "5"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert (
        "checks: billed == 80, no duplicates, nothing lost, every file verified: ok" in done.stdout
    )
    assert "faults injected" in done.stdout
