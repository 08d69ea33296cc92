"""Start-up time of `imggw --help` and `imggw --version` against a minimal one-command Typer
app's `--help`, measured in the same run, interleaved. Target: at most 1.2x.

Run: python bench/startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MINIMAL = """
import typer

app = typer.Typer()


@app.command()
def hello(name: str) -> None:
    print(f"hello {name}")


if __name__ == "__main__":
    app()
"""


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed: {done.stderr.decode()[-300:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        minimal = Path(folder) / "minimal.py"
        minimal.write_text(MINIMAL)
        commands = {
            "typer --help (baseline)": [sys.executable, str(minimal), "--help"],
            "imggw --help": [sys.executable, "-m", "imggw_cli", "--help"],
            "imggw --version": [sys.executable, "-m", "imggw_cli", "--version"],
        }
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for command in commands.values():
            timed(command)  # warm the file cache
        for _ in range(args.runs):
            for name, command in commands.items():
                samples[name].append(timed(command))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    baseline = medians["typer --help (baseline)"]
    result = {name: {"ms": round(ms * 1e3, 1), "ratio": round(ms / baseline, 3)}
              for name, ms in medians.items()}  # fmt: skip
    if args.json:
        print(json.dumps(result))
    else:
        for name, r in result.items():
            print(f"{name:<26}{r['ms']:>8.1f} ms{r['ratio']:>7.2f}x")
        worst = max(r["ratio"] for name, r in result.items() if name.startswith("imggw"))
        print(f"target: at most 1.20x -> {'ok' if worst <= 1.2 else 'OVER'} ({worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
