"""What a user installs: the wheel and the sdist carry the LICENSE and say so in the metadata."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_wheel_and_sdist_ship_the_license(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-d", str(tmp_path)],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    (sdist,) = tmp_path.glob("*.tar.gz")
    license_text = (ROOT / "LICENSE").read_text()
    assert "MIT License" in license_text
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
        (shipped,) = [n for n in names if n.endswith("licenses/LICENSE")]
        assert archive.read(shipped).decode() == license_text
    assert "License-Expression: MIT" in text
    assert "License-File: LICENSE" in text
    assert "Classifier: Programming Language :: Python :: 3.13" in text
    with tarfile.open(sdist) as archive:
        (member,) = [m for m in archive.getnames() if m.endswith("/LICENSE")]
        extracted = archive.extractfile(member)
        assert extracted is not None
        assert extracted.read().decode() == license_text
