"""The durable batch runner against the in-process reference gateway, in two parts.

1. Against a baseline measured in the same run: N lines (2,000) through ``run_batch`` and the
   same requests through a plain AsyncClient (submit, wait, download, same concurrency, no
   ledger); wall time, peak RSS and their ratios.
2. Scale (issue 10, item 0): CPU per line (process CPU time / lines) and peak RSS at 1,000,
   10,000 and 100,000 lines, as the CLI runs a batch: lines streamed from a text file, and
   ``on_progress`` the CLI's own display (``batch_display`` with stderr not a terminal: a line
   every few seconds, sent to /dev/null). Ratios against the smallest size. Targets: CPU per
   line flat within 15% across the range; peak RSS at the largest size within 1.2x of that at
   the smallest.

Each run is its own process, so its peak RSS is its own. The in-process gateway lives in that
process too and its memory counts in RSS: it gets short ``retention`` and ``idempotency_ttl``
(10 s), so it keeps a bounded working set (it forgets a task a minute after its retention, a
key after its TTL); its live tasks and the RSS are sampled every second during the run, and its
bytes per live task and key are measured apart (RSS growth over 20,000 tasks in another
process), so the table shows the gateway's share beside the RSS. ``--diagnose N`` runs N lines
under tracemalloc (what grew between 30% and 98% of the lines) and cProfile (CPU by owner:
gateway, runner, SDK, CLI display, httpx, ...).

Run: python bench/batch.py [--lines N] [--sizes 1000,10000,100000] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

GATEWAY = {"duration_min": 0.05, "duration_max": 0.3, "seed": 1}
# Scale: short tasks that one poll after the first query sees finished (the runner's wait
# queries at once, then every 0.24-0.3 s), so each line costs 4 requests: submit, 2 queries,
# 1 download. The gateway forgets results 10 s + 1 min after they finish, keys after 10 s.
SCALE_GATEWAY = {"duration_min": 0.05, "duration_max": 0.2, "retention": 10.0,
                 "idempotency_ttl": 10.0, "seed": 1}  # fmt: skip
SCALE_POLL = {"initial_interval": 0.3, "max_interval": 0.3}
SIZES = (1000, 10_000, 100_000)
QUICK_SIZES = (1000, 2000, 4000)
CPU_FLAT = 1.15  # target: CPU per line, largest over smallest across the sizes
RSS_GROWTH = 1.2  # target: peak RSS at the largest size over the smallest


def _clients() -> tuple[Any, dict[str, Any]]:
    from imggw_client import PollPolicy
    from imggw_client.mock import MockGateway

    gateway = MockGateway(**GATEWAY)
    return gateway, {"poll": PollPolicy(initial_interval=0.05, max_interval=0.3)}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------- 1. comparison


def child(mode: str, lines: int, concurrency: int, folder: Path) -> dict[str, float]:
    import anyio

    gateway, options = _clients()
    prompts = [f"image {i}" for i in range(lines)]
    started = time.perf_counter()
    if mode == "batch":
        from imggw_client.batch import run_batch

        report = run_batch(prompts, folder, concurrency=concurrency,
                           client_factory=lambda: gateway.async_client(**options))  # fmt: skip
        assert report.exit_code == 0, report.counts
    else:

        async def plain() -> None:
            limiter = anyio.CapacityLimiter(concurrency)
            async with gateway.async_client(**options) as client:

                async def one(prompt: str) -> None:
                    async with limiter:
                        sub = await client.submit(prompt)
                    task = await client.wait(sub)
                    async with limiter:
                        await client.download(task, folder)

                async with anyio.create_task_group() as group:
                    for prompt in prompts:
                        group.start_soon(one, prompt)

        anyio.run(plain)
    elapsed = time.perf_counter() - started
    assert gateway.stats()["tasks_created"] == lines
    assert len(list(folder.glob("*.png"))) == lines
    return {"seconds": elapsed, "peak_rss_mib": _peak_rss_mib()}


def compare(lines: int, concurrency: int) -> dict[str, Any]:
    results = {}
    for mode in ("plain", "batch"):
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--folder", folder,
                 "--lines", str(lines), "--concurrency", str(concurrency)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            results[mode] = json.loads(done.stdout)
    ratio_time = results["batch"]["seconds"] / results["plain"]["seconds"]
    ratio_rss = results["batch"]["peak_rss_mib"] / results["plain"]["peak_rss_mib"]
    return {**results, "time_ratio": round(ratio_time, 3), "rss_ratio": round(ratio_rss, 3),
            "lines": lines, "concurrency": concurrency}  # fmt: skip


def print_compare(summary: dict[str, Any]) -> None:
    lines, results = summary["lines"], summary
    for mode, label in (("plain", "plain AsyncClient (baseline)"), ("batch", "durable batch")):
        r = results[mode]
        print(f"{label:<30}{r['seconds']:>8.2f} s  {r['peak_rss_mib']:>7.1f} MiB peak RSS  "
              f"{lines / r['seconds']:>7.1f} lines/s")  # fmt: skip
    print(f"ratios: time {summary['time_ratio']:.2f}x, peak RSS {summary['rss_ratio']:.2f}x "
          f"({lines} lines, concurrency {summary['concurrency']})")  # fmt: skip


# ---------------------------------------------------------------------------- 2. scale


def scale_child(
    lines: int,
    concurrency: int,
    folder: Path,
    source: Path,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One batch as `imggw batch FILE -o DEST -c N` runs it (stderr is /dev/null here).
    ``on_sample`` sees the gateway's stats once a second (for the diagnosis)."""
    import anyio

    from imggw_cli._batch_run import batch_display
    from imggw_cli._globals import Globals
    from imggw_cli._output import Output
    from imggw_client import PollPolicy
    from imggw_client.batch import BatchReport, arun_batch
    from imggw_client.mock import MockGateway

    assert not sys.stderr.isatty()
    gateway = MockGateway(**SCALE_GATEWAY)
    poll = PollPolicy(**SCALE_POLL)
    # Once a second: (lines submitted, the gateway's live tasks and keys, RSS MiB).
    samples: list[tuple[int, int, int, float | None]] = []

    def sample() -> None:
        stats = gateway.stats()
        live = stats["live"]
        samples.append((stats["tasks_created"], live["tasks"], live["idempotency_keys"],
                        _rss_mib()))  # fmt: skip
        if on_sample is not None:
            on_sample(stats)

    async def main() -> BatchReport:
        async def sampler() -> None:
            while True:
                await anyio.sleep(1.0)
                sample()

        async with gateway.async_client(poll=poll) as client:
            with batch_display(Output(Globals(quiet=False))) as on_progress:
                async with anyio.create_task_group() as group:
                    group.start_soon(sampler)
                    report = await arun_batch(
                        source,
                        folder,
                        client=client,
                        concurrency=concurrency,
                        on_progress=on_progress,
                    )
                    group.cancel_scope.cancel()
        return report

    rss_start = _rss_mib()
    cpu, started = _cpu(), time.perf_counter()
    report = anyio.run(main)
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    peak = _peak_rss_mib()
    sample()
    stats = gateway.stats()
    assert report.exit_code == 0, report.counts
    assert report.counts == {"saved": lines}, report.counts
    assert stats["tasks_created"] == lines, stats["tasks_created"]
    saved = sum(1 for _ in os.scandir(folder) if _.name.endswith(".png"))
    assert saved == lines, saved
    return {
        "lines": lines,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_rss_mib": peak,
        "rss_start_mib": rss_start,
        "requests": sum(stats["requests"].values()),
        "gateway_live_end": stats["live"],
        "gateway_samples": samples,
    }


def calibrate_child(traced: int, grown: int) -> dict[str, float]:
    """The reference gateway's memory per live task and per live idempotency key, with the
    scale run's request shapes: the RSS growth while ``grown`` tasks (each with its key) are
    created, split between task and key as tracemalloc sees ``traced`` more (their Python
    allocations after a full collection, then the clock moved past the keys' TTL)."""
    import gc
    import tracemalloc

    import anyio

    from imggw_client.mock import MockGateway

    settings = {**SCALE_GATEWAY, "duration_min": 0.0, "duration_max": 0.0}

    async def rss_growth(folder: Path) -> float:
        gateway = MockGateway(**settings, manual_clock=True)
        async with gateway.async_client() as client:
            for warm in range(50):  # imports, caches and the client's connection pool
                task = await client.get((await client.submit(f"warm {warm}")).task_id)
                await client.download(task, folder)
            gc.collect()
            before = _rss_mib() or 0.0
            for i in range(grown):
                await client.submit(f"image {i}")  # the SDK sends a key with each
            gc.collect()
            assert gateway.stats()["live"]["tasks"] == grown + 50
            return ((_rss_mib() or 0.0) - before) * 2**20 / grown

    async def split(folder: Path) -> tuple[float, float]:
        gateway = MockGateway(**settings, manual_clock=True)
        async with gateway.async_client() as client:
            for warm in range(50):
                task = await client.get((await client.submit(f"warm {warm}")).task_id)
                await client.download(task, folder, overwrite=True)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for i in range(traced):
                await client.submit(f"image {i}")
            gc.collect()
            with_keys = tracemalloc.get_traced_memory()[0]
            gateway.advance(SCALE_GATEWAY["idempotency_ttl"] + 1)
            assert gateway.stats()["live"]["idempotency_keys"] == 0
            gc.collect()
            without_keys = tracemalloc.get_traced_memory()[0]
            return (without_keys - before) / traced, (with_keys - without_keys) / traced

    with tempfile.TemporaryDirectory() as folder:
        pair = anyio.run(rss_growth, Path(folder))
        tracemalloc.start()
        task, key = anyio.run(split, Path(folder))
    share = task / (task + key)
    return {"bytes_per_task": pair * share, "bytes_per_key": pair * (1 - share),
            "traced_per_task": task, "traced_per_key": key}  # fmt: skip


def _run_child(args: list[str], *, stderr: Any = subprocess.DEVNULL) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                          stderr=stderr, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        command = " ".join([sys.executable, __file__, *args])
        raise SystemExit(f"child failed (exit {done.returncode}); run it alone: {command}")
    return json.loads(done.stdout.splitlines()[-1])


def scale(sizes: tuple[int, ...], concurrency: int) -> dict[str, Any]:
    cal = _run_child(["--child", "calibrate"], stderr=None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for lines in sizes:
            source = Path(tmp) / f"prompts-{lines}.txt"
            with source.open("w", encoding="utf-8") as handle:
                for i in range(lines):
                    handle.write(f"image {i}\n")
            folder = Path(tmp) / f"out-{lines}"
            row = _run_child(
                ["--child", "scale", "--lines", str(lines), "--concurrency", str(concurrency),
                 "--folder", str(folder), "--input", str(source)]
            )  # fmt: skip
            # The gateway's share: its largest estimated footprint over the samples.
            samples = row["gateway_samples"]
            est = max((t * cal["bytes_per_task"] + k * cal["bytes_per_key"]) / 2**20
                      for _, t, k, _ in samples)  # fmt: skip
            row["gateway_peak_mib"] = est
            row["gateway_peak_tasks"] = max(t for _, t, _, _ in samples)
            rows.append(row)
            shutil.rmtree(folder, ignore_errors=True)
    first = rows[0]
    for row in rows:
        row["lines_per_s"] = row["lines"] / row["seconds"]
        row["cpu_ms_per_line"] = 1000 * row["cpu_seconds"] / row["lines"]
        row["requests_per_line"] = row["requests"] / row["lines"]
        row["runner_rss_mib"] = row["peak_rss_mib"] - row["gateway_peak_mib"]
    for row in rows:
        row["cpu_ratio"] = row["cpu_ms_per_line"] / first["cpu_ms_per_line"]
        row["rss_ratio"] = row["peak_rss_mib"] / first["peak_rss_mib"]
        row["runner_rss_ratio"] = row["runner_rss_mib"] / first["runner_rss_mib"]
    cpus = [row["cpu_ms_per_line"] for row in rows]
    last = rows[-1]
    targets = {
        "cpu_flat": round(max(cpus) / min(cpus), 3),
        "cpu_flat_met": max(cpus) / min(cpus) <= CPU_FLAT,
        "rss_growth": round(last["rss_ratio"], 3),
        "rss_growth_met": last["rss_ratio"] <= RSS_GROWTH,
        "runner_rss_growth": round(last["runner_rss_ratio"], 3),
        "runner_rss_growth_met": last["runner_rss_ratio"] <= RSS_GROWTH,
    }
    return {"concurrency": concurrency, "gateway": SCALE_GATEWAY, "poll": SCALE_POLL,
            "calibration": cal, "rows": rows, "targets": targets}  # fmt: skip


def _ok(met: bool) -> str:
    return "met" if met else "MISSED"


def print_scale(result: dict[str, Any]) -> None:
    cal, rows, t = result["calibration"], result["rows"], result["targets"]
    g = result["gateway"]
    print(
        f"scale: run_batch over a text file, concurrency {result['concurrency']}, the CLI's "
        "progress display on (stderr not a terminal, to /dev/null), each size in its own "
        "process"
    )
    print(f"  in-process gateway: tasks of {g['duration_min']:g}-{g['duration_max']:g} s, "
          f"retention {g['retention']:g} s, idempotency_ttl {g['idempotency_ttl']:g} s: it "
          f"forgets a task {g['retention']:g} s + 1 min after it finishes, a key after "
          f"{g['idempotency_ttl']:g} s; polls every {0.8 * SCALE_POLL['initial_interval']:g}-"
          f"{SCALE_POLL['initial_interval']:g} s")  # fmt: skip
    print(f"  gateway memory, measured apart: {cal['bytes_per_task']:.0f} bytes per live task, "
          f"{cal['bytes_per_key']:.0f} per live key (RSS growth over 20,000 tasks, split as "
          "tracemalloc sees them); 'gateway MiB' below is its largest estimated share during "
          "the run (live tasks sampled every second)")  # fmt: skip
    header = (f"{'lines':>8} {'wall s':>7} {'lines/s':>8} {'req/line':>8} {'CPU ms/line':>11} "
              f"{'ratio':>6} {'peak RSS MiB':>12} {'ratio':>6} {'gateway tasks':>14} "
              f"{'gateway MiB':>11} {'RSS - gateway':>13} {'ratio':>6}")  # fmt: skip
    print(header)
    for r in rows:
        live = r["gateway_live_end"]["tasks"]
        tasks = f"{r['gateway_peak_tasks']:,}/{live:,}"
        print(f"{r['lines']:>8,} {r['seconds']:>7.1f} {r['lines_per_s']:>8.0f} "
              f"{r['requests_per_line']:>8.2f} {r['cpu_ms_per_line']:>11.2f} "
              f"{r['cpu_ratio']:>5.2f}x {r['peak_rss_mib']:>12.1f} {r['rss_ratio']:>5.2f}x "
              f"{tasks:>14} {r['gateway_peak_mib']:>11.1f} {r['runner_rss_mib']:>13.1f} "
              f"{r['runner_rss_ratio']:>5.2f}x")  # fmt: skip
    starts = ", ".join(f"{r['rss_start_mib']:.1f}" for r in rows if r["rss_start_mib"])
    print("  (gateway tasks: most live tasks seen during the run / live at the end; RSS before "
          f"each run, imports and gateway made: {starts} MiB)")  # fmt: skip
    last = rows[-1]
    points = []
    for share in (0.1, 0.25, 0.5, 0.75, 1.0):
        # The first sample at or past this share of the lines submitted.
        found = next((s for s in last["gateway_samples"] if s[0] >= share * last["lines"]), None)
        if found is None or found[3] is None:
            continue
        submitted, tasks, keys, rss = found
        gateway = (tasks * cal["bytes_per_task"] + keys * cal["bytes_per_key"]) / 2**20
        points.append(f"{submitted:,}: {rss:.1f} ({tasks:,}, {rss - gateway:.1f})")
    if points:
        print(f"  RSS during the {last['lines']:,}-line run, at lines submitted: RSS MiB (gateway "
              f"live tasks, RSS less the gateway's estimate): {'; '.join(points)}")  # fmt: skip
    big, small = rows[-1]["lines"], rows[0]["lines"]
    print(f"targets: CPU per line flat within 15% (largest/smallest {t['cpu_flat']:.2f}x): "
          f"{_ok(t['cpu_flat_met'])}; peak RSS at {big:,} lines <= 1.2x that at {small:,} "
          f"({t['rss_growth']:.2f}x): {_ok(t['rss_growth_met'])}; "
          f"less the gateway's share ({t['runner_rss_growth']:.2f}x): "
          f"{_ok(t['runner_rss_growth_met'])}")  # fmt: skip


# ---------------------------------------------------------------------------- diagnosis


def _owner(filename: str) -> str:
    for part, name in (("imggw_client/mock", "gateway (mock)"), ("imggw_client/batch", "runner"),
                       ("imggw_client/_core", "sdk core"), ("imggw_client", "sdk"),
                       ("imggw_cli", "cli display"), ("httpx", "httpx"), ("httpcore", "httpx"),
                       ("anyio", "anyio"), ("asyncio", "asyncio"), ("tenacity", "tenacity"),
                       ("pydantic", "pydantic"), ("sqlite3", "sqlite3")):  # fmt: skip
        if part in filename:
            return name
    return f"python {Path(filename).name}"


def diagnose_child(lines: int, concurrency: int, folder: Path, source: Path, how: str) -> None:
    """The scale run under tracemalloc (what grew between 30% and 98% of the lines) or
    cProfile (CPU by owner, and the top functions)."""
    import cProfile
    import pstats
    import tracemalloc

    if how == "memory":
        # Two snapshots: once the gateway's working set and the runner's window are full (30%
        # of the lines submitted), and near the end (98%). What grew between them grows with
        # lines; what did not is bounded.
        marks = [int(0.3 * lines), int(0.98 * lines)]
        shots: list[tuple[int, dict[str, int], float | None, Any]] = []

        def watch(stats: dict[str, Any]) -> None:
            if marks and stats["tasks_created"] >= marks[0]:
                marks.pop(0)
                shots.append((stats["tasks_created"], dict(stats["live"]), _rss_mib(),
                              tracemalloc.take_snapshot()))  # fmt: skip

        tracemalloc.start(1)
        scale_child(lines, concurrency, folder, source, on_sample=watch)
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        (_, _, _, first), (_, _, _, last) = shots[0], shots[-1]
        first, last = first.filter_traces(ignore), last.filter_traces(ignore)
        print("under tracemalloc (1 frame; RSS includes tracemalloc's own tables):")
        for submitted, live, rss, snap in shots:
            traced = sum(stat.size for stat in snap.filter_traces(ignore).statistics("filename"))
            print(f"  at {submitted:,} lines submitted: {traced / 2**20:.1f} MiB traced, RSS "
                  f"{rss or 0:.1f} MiB; the gateway held {live['tasks']:,} tasks, "
                  f"{live['idempotency_keys']:,} keys")  # fmt: skip

        def where(stat: Any) -> str:
            frame = stat.traceback[0]
            name = frame.filename.split("site-packages/")[-1].split("src/")[-1]
            return f"{name}:{frame.lineno}"

        print("allocation sites that changed most between the two (file:line):")
        for stat in last.compare_to(first, "lineno")[:12]:
            print(f"  {stat.size_diff / 2**20:>+7.2f} MiB {stat.count_diff:>+8,} blocks  (now "
                  f"{stat.size / 2**20:.2f} MiB)  {where(stat)}")  # fmt: skip
        by_owner: Counter[str] = Counter()
        for stat in last.statistics("filename"):
            by_owner[_owner(stat.traceback[0].filename)] += stat.size
        print("traced memory at the second, by the file that allocated it:")
        for owner, size in by_owner.most_common(8):
            print(f"  {owner:<20}{size / 2**20:>8.2f} MiB")
        return
    profile = cProfile.Profile()
    profile.enable()
    result = scale_child(lines, concurrency, folder, source)
    profile.disable()
    stats = pstats.Stats(profile)
    by_owner: Counter[str] = Counter()
    total = 0.0
    for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        owner = _owner(filename) if filename != "~" else f"builtin {name[:34]}"
        by_owner[owner] += tottime
        total += tottime
    print(f"CPU under cProfile: {total:.1f} s for {lines:,} lines "
          f"({result['seconds']:.1f} s wall), by owner (own time):")  # fmt: skip
    for owner, seconds in by_owner.most_common(16):
        print(f"  {owner:<44}{seconds:>7.2f} s {100 * seconds / total:>5.1f}%")
    print("top functions (own time):")
    stats.sort_stats("tottime").print_stats(12)


def diagnose(lines: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "prompts.txt"
        source.write_text("".join(f"image {i}\n" for i in range(lines)), encoding="utf-8")
        for how in ("memory", "cpu"):
            folder = Path(tmp) / f"out-{how}"
            print(f"== diagnosis, {how}: {lines:,} lines", flush=True)
            subprocess.run(
                [sys.executable, __file__, "--child", f"diagnose-{how}", "--lines", str(lines),
                 "--concurrency", str(concurrency), "--folder", str(folder),
                 "--input", str(source)],
                check=True, stderr=subprocess.DEVNULL,
            )  # fmt: skip


# ---------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000, help="lines of the comparison")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sizes", default=None,
                        help="scale sizes, comma-separated [1000,10000,100000]")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="300-line comparison; scale at 1k, 2k, 4k lines")  # fmt: skip
    parser.add_argument("--no-scale", action="store_true", help="the comparison only")
    parser.add_argument("--no-compare", action="store_true", help="the scale table only")
    parser.add_argument("--diagnose", type=int, metavar="N",
                        help="only: N lines under tracemalloc, then cProfile")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child in ("batch", "plain"):
        print(json.dumps(child(args.child, args.lines, args.concurrency, Path(args.folder))))
        return 0
    if args.child == "scale":
        print(json.dumps(scale_child(args.lines, args.concurrency, Path(args.folder),
                                     Path(args.input))))  # fmt: skip
        return 0
    if args.child == "calibrate":
        print(json.dumps(calibrate_child(2000, 20_000)))
        return 0
    if args.child in ("diagnose-memory", "diagnose-cpu"):
        diagnose_child(args.lines, args.concurrency, Path(args.folder), Path(args.input),
                       args.child.split("-")[1])  # fmt: skip
        return 0
    if args.diagnose:
        diagnose(args.diagnose, args.concurrency)
        return 0
    lines = 300 if args.quick and args.lines == 2000 else args.lines
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    summary: dict[str, Any] = {}
    if not args.no_compare:
        summary["compare"] = compare(lines, args.concurrency)
        if not args.json:
            print_compare(summary["compare"])
            print(flush=True)
    if not args.no_scale:
        summary["scale"] = scale(sizes, args.concurrency)
        if not args.json:
            print_scale(summary["scale"])
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
