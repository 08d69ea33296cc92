"""What a user installs: the wheel and the sdist carry the LICENSE and say so in the metadata,
and the gallery's page files, which an installed wheel writes its galleries from."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASSETS = "imggw_client/batch/gallery_assets"
ASSET_FILES = ("gallery.css", "gallery.js", "page.html")


def source(name: str) -> str:
    return (ROOT / "src" / ASSETS / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel and the sdist, built once for this module."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist


@pytest.mark.slow
def test_the_wheel_and_sdist_ship_the_license(built: tuple[Path, Path]) -> None:
    wheel, sdist = built
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


def test_the_wheel_and_sdist_ship_the_gallery_files(built: tuple[Path, Path]) -> None:
    wheel, sdist = built
    with zipfile.ZipFile(wheel) as archive:
        for name in ASSET_FILES:
            assert archive.read(f"{ASSETS}/{name}").decode() == source(name)
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    for name in ASSET_FILES:
        assert any(n.endswith(f"/src/{ASSETS}/{name}") for n in names), name


def test_an_installed_wheel_writes_its_gallery(built: tuple[Path, Path], tmp_path: Path) -> None:
    wheel, _ = built
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # what an installer puts in site-packages
    output = tmp_path / "out"
    output.mkdir()
    # The environment's own packages provide the dependencies; the wheel, ahead of them on the
    # path, provides imggw_client (the checkout's src/ is never imported).
    code = (
        "import sys, imggw_client.batch as batch; "
        "batch.write_gallery(sys.argv[1], [{'line': 1, 'status': 'succeeded', 'prompt': 'p'}]); "
        "print(batch.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(output)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(done.stdout.strip()).is_relative_to(site)
    markup = (output / "index.html").read_text(encoding="utf-8")
    assert f"<style>{source('gallery.css')}</style>" in markup
    assert f"<script>{source('gallery.js')}</script>" in markup
    assert (output / "gallery").is_dir()
