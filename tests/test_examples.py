"""Every example runs, as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_quickstart_saves_a_real_png(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "a red fox", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (png,) = tmp_path.glob("*.png")
    content = png.read_bytes()
    assert content.startswith(b"\x89PNG\r\n\x1a\n")
    assert int.from_bytes(content[16:20], "big") == 512  # 16:9 at 512 px
    assert int.from_bytes(content[20:24], "big") == 288
    assert f"saved {png}" in done.stdout
    assert "succeeded 100%" in done.stdout
