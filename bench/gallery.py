"""The gallery (``write_gallery``) at 10,000, 100,000 and 1,000,000 manifest records, against a
baseline measured in the same run: writing the same records as ``manifest.jsonl`` (one
``json.dumps`` and one line each), which every batch does anyway. Each size runs in its own
process, records streamed from a generator (as ``iter_manifest`` gives them), so peak RSS is
the gallery's own. Prints seconds, records/s, peak RSS, the files written and the ratios.

Targets: time per record flat across the sizes (the writer is one pass); peak RSS that does not
grow with the records (pages are flushed as they fill); the page opened in a browser loads one
page file of 200 cards whatever the size (the browser test, tests/batch/gallery/, checks that).

Run: python bench/gallery.py [--sizes 10000,100000,1000000] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (2_000, 20_000)


def records(count: int) -> Iterator[dict[str, Any]]:
    """Manifest records as a batch writes them: most succeeded, some failed or expired."""
    for line in range(1, count + 1):
        task = str(10_000_000 + line)
        failed = line % 50 == 0
        expired = line % 97 == 0
        yield {
            "line": line, "id": f"row-{line}", "task_id": task,
            "status": "failed" if failed else "succeeded",
            "files": [] if failed or expired else
            [{"path": f"{task}-0.png", "sha256": f"{line:064x}", "size": 1_234_567}],
            "error": {"code": "content_policy", "message": "refused"} if failed else
            {"code": "result_expired", "message": "links died"} if expired else None,
            "surface": "beta", "prompt": f"a watercolour lighthouse at dusk, take {line}",
            "aspect_ratio": "16:9", "resolution": "2k", "cost": 0.04, "credits": 4,
            "expires_at": "2030-01-02T11:59:30Z",
        }  # fmt: skip


def child(mode: str, count: int, folder: Path) -> dict[str, Any]:
    started = time.perf_counter()
    if mode == "gallery":
        from imggw_client.batch import write_gallery

        write_gallery(folder, records(count), title="bench")
    else:
        with (folder / "manifest.jsonl").open("w", encoding="utf-8") as out:
            for record in records(count):
                out.write(json.dumps(record) + "\n")
    seconds = time.perf_counter() - started
    files = size = 0
    for root, _, names in os.walk(folder):
        for name in names:
            files += 1
            size += (Path(root) / name).stat().st_size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_rss_mib": peak, "files": files, "bytes": size}


def run(mode: str, count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--count", str(count), "--folder", folder],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return dict(json.loads(done.stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help="comma-separated [10000,100000,1000000]")
    parser.add_argument("--quick", action="store_true", help="2,000 and 20,000 records")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=["gallery", "manifest"], help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.count, Path(args.folder))))
        return 0
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    rows = []
    for count in sizes:
        base, gallery = run("manifest", count), run("gallery", count)
        rows.append({"records": count, "manifest": base, "gallery": gallery,
                     "time_ratio": gallery["seconds"] / base["seconds"],
                     "us_per_record": 1e6 * gallery["seconds"] / count})  # fmt: skip
    if args.json:
        print(json.dumps(rows))
        return 0
    print("write_gallery against writing the same records as manifest.jsonl (baseline), each "
          "in its own process")  # fmt: skip
    print(f"{'records':>10} {'gallery s':>10} {'µs/record':>10} {'peak RSS MiB':>12} "
          f"{'files':>6} {'MB':>7} {'manifest s':>11} {'RSS MiB':>8} "
          f"{'time ratio':>10}")  # fmt: skip
    for r in rows:
        g, m = r["gallery"], r["manifest"]
        print(f"{r['records']:>10,} {g['seconds']:>10.2f} {r['us_per_record']:>10.1f} "
              f"{g['peak_rss_mib']:>12.1f} {g['files']:>6,} {g['bytes'] / 1e6:>7.1f} "
              f"{m['seconds']:>11.2f} {m['peak_rss_mib']:>8.1f} "
              f"{r['time_ratio']:>9.2f}x")  # fmt: skip
    per = [r["us_per_record"] for r in rows]
    rss = [r["gallery"]["peak_rss_mib"] for r in rows]
    print(f"time per record, largest/smallest: {per[-1] / per[0]:.2f}x; peak RSS, largest/"
          f"smallest: {rss[-1] / rss[0]:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
