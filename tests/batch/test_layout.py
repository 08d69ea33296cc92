"""The batch package's house (issue 29, item 5): no module over 500 lines in ``batch/``,
``tracking/`` or the CLI, and the tests mirror the package: a test file per module of
``batch/``, named after it (``_room.py``: ``test_room.py``, maybe in a subfolder), or the file
named here that covers it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
TESTS = Path(__file__).resolve().parent
MAX_LINES = 500
# Modules whose tests predate the mirror and carry another name: the file that covers each.
COVERED_BY = {
    "_identity": "test_run_identity.py",
    "_input": "test_input_formats.py",
    "_single": "test_batch.py",
    "_spending": "test_guards.py",
    "_dask_budget": "shards/test_dask.py",
    "_dask_progress": "shards/test_dask.py",
}


def test_no_module_is_over_500_lines() -> None:
    folders = [SRC / "imggw_client" / "batch", SRC / "imggw_client" / "tracking", SRC / "imggw_cli"]
    sizes = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for folder in folders
        for path in sorted(folder.glob("*.py"))
    }
    assert sizes, "no module found"
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"split these along a seam: {over}"


def test_every_module_of_the_batch_package_has_its_test_file() -> None:
    tests = {path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")}
    by_name = {Path(test).name for test in tests}
    missing = []
    for module in sorted((SRC / "imggw_client" / "batch").glob("_*.py")):
        if module.name == "__init__.py":
            continue
        covered = COVERED_BY.get(module.stem)
        if covered is not None:
            assert covered in tests, f"{module.name}: {covered} is gone"
        elif f"test_{module.stem.lstrip('_')}.py" not in by_name:
            missing.append(module.name)
    assert not missing, f"modules of batch/ with no test file named after them: {missing}"
    stale = [m for m in COVERED_BY if not (SRC / "imggw_client" / "batch" / f"{m}.py").exists()]
    assert not stale, f"COVERED_BY names modules that are gone: {stale}"


def test_every_module_of_the_tracking_package_has_its_test_file() -> None:
    tracking_tests = ROOT / "tests" / "tracking"
    names = {path.name for path in tracking_tests.glob("test_*.py")}
    modules = sorted((SRC / "imggw_client" / "tracking").glob("_*.py"))
    missing = [m.name for m in modules
               if m.name != "__init__.py" and f"test_{m.stem.lstrip('_')}.py" not in names]  # fmt: skip
    assert modules
    assert not missing, f"modules of tracking/ with no tests/tracking/test_<module>.py: {missing}"
