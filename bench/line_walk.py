"""How many of our modules one batch line crosses: `imggw batch` on a one-line input, from the
CLI to the files on disk, against the reference gateway served on loopback (its own modules,
the gateway's, are not counted). A module counts when any of its functions runs during the run
(a profile hook on every thread); code run only at import does not. DESIGN 24's target: at
most 40.

Run: python bench/line_walk.py [--json] [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

OURS = ("imggw_client", "imggw_cli")
NOT_THE_LINE = ("imggw_client.mock",)  # the gateway's side of the wire


def walk() -> tuple[set[str], int]:
    """The modules of ours that ran for one batch line, and how many modules we have."""
    import imggw_cli._app as cli
    from imggw_client.mock import MockGateway

    ran: set[str] = set()
    importing = threading.local()  # module bodies running on this thread: an import under way

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if frame.f_code.co_name == "<module>":  # what an import runs is not the line's
            if event in ("call", "return"):
                depth = getattr(importing, "depth", 0)
                importing.depth = depth + (1 if event == "call" else -1)
            return
        if event != "call" or getattr(importing, "depth", 0):
            return
        name = frame.f_globals.get("__name__", "")
        if name.startswith(OURS) and not name.startswith(NOT_THE_LINE):
            ran.add(name)

    gw = MockGateway(duration_min=0.01, duration_max=0.02)
    with gw.serve() as url, tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.txt"
        source.write_text("a lighthouse at dusk\n")
        os.environ["IMGGW_API_KEY"] = gw.config.api_keys[0]
        argv = ["batch", str(source), "-o", str(Path(tmp) / "out"), "--base-url", url, "-q"]
        threading.setprofile(hook)
        sys.setprofile(hook)
        try:
            code = cli.app(argv, prog_name="imggw", standalone_mode=False)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        if code not in (0, None):
            raise SystemExit(f"the batch failed (exit {code})")
        saved = list((Path(tmp) / "out").glob("*.png"))
        if len(saved) != 1:
            raise SystemExit(f"expected one saved image, found {len(saved)}")
    root = Path(cli.__file__).resolve().parents[1]
    ours = [p for pkg in OURS for p in (root / pkg).rglob("*.py")]
    total = sum(1 for p in ours if "mock" not in p.relative_to(root).parts)
    return ran, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--list", action="store_true", help="name the modules crossed")
    args = parser.parse_args()
    ran, total = walk()
    if args.json:
        print(json.dumps({"modules_crossed": len(ran), "modules": total, "crossed": sorted(ran)}))
        return
    print(f"one batch line crosses {len(ran)} of our {total} modules (target: at most 40)")
    if args.list:
        for name in sorted(ran):
            print(f"  {name}")


if __name__ == "__main__":
    main()
