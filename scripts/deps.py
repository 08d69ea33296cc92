"""The pinned dependencies (``constraints.txt``) and the newest-releases lane (DESIGN 23).

    python3 scripts/deps.py newest     # the newest of everything in .venv-newest: fast lane
    python3 scripts/deps.py lock       # the same; if it passes, constraints.txt from it

The README's test command installs through ``constraints.txt`` (every runtime and dev
dependency at one version), so it installs the same packages on any day. ``newest`` installs
what the ranges in ``pyproject.toml`` admit today, ignoring the pins, runs the fast lane and the
Redis lane there, and lists every package whose newest release differs from its pin: upstream
drift, seen before it reaches main. Run it before a change lands, fix what it finds; ``lock``
then moves the pins to what passed. The pins are made on the Python CI runs (3.11, Linux);
another Python may need packages the file does not name, which pip then resolves freely.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
NEWEST = ROOT / ".venv-newest"
# The fast lane, and the Redis lane: the store's client is the dependency most apt to warn.
LANE = ["-m", "pytest", "-q", "-n", "auto", "-m", "not slow and not browser and not dask"]
HEADER = """\
# Every runtime and dev dependency at one version: the README's test command (and .ci/run)
# installs through this file, so it installs the same packages on any day.
# Made by `python3 scripts/deps.py lock` on Python {python}, after the fast lane passed with
# these versions; never edited by hand.
"""


def pins(text: str) -> dict[str, str]:
    """``name==version`` lines, by normalised name."""
    found = {}
    for line in text.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not name.startswith("#"):
            found[name.lower().replace("_", "-")] = version
    return found


def newest() -> tuple[int, str]:
    """Installs the newest releases into a fresh venv and runs the lane there; its exit code
    and ``pip freeze``."""
    venv.create(NEWEST, clear=True, with_pip=True)
    python = str(NEWEST / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--upgrade"]
    subprocess.run([*pip, "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    code = subprocess.run([python, *LANE], cwd=ROOT, check=False).returncode
    return code, frozen


def drift(frozen: str) -> list[str]:
    """What the newest releases change against the pins, one line a package."""
    old = pins(CONSTRAINTS.read_text()) if CONSTRAINTS.exists() else {}
    new = pins(frozen)
    names = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
    return [f"{name} {old.get(name, '-')} -> {new.get(name, '-')}" for name in names]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", choices=["newest", "lock"])
    what = parser.parse_args().what
    code, frozen = newest()
    changes = drift(frozen)
    print(f"drift against {CONSTRAINTS.name}: {len(changes)} packages", file=sys.stderr)
    for line in changes:
        print(f"  {line}", file=sys.stderr)
    if code != 0:
        print(f"the newest releases fail the lane (exit {code}): fix that first", file=sys.stderr)
        return code
    if what == "lock":
        python = ".".join(map(str, sys.version_info[:3]))
        CONSTRAINTS.write_text(HEADER.format(python=python) + frozen)
        print(f"wrote {CONSTRAINTS.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
