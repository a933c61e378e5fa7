"""Where a command's CPU time goes, by kind of process: runs COMMAND (the test suite, say) while it
reads every process's CPU time from /proc once a second, then prints the CPU minutes per kind (a
train job's Python, a job step's Snakemake, a torchrun worker, slurmd, unsquashfs, ...) and the
machine's own threads beside them; then per test: a test's processes, its Slurm jobs' included,
work in its pytest folder (tmp_path, named after the test), which their working directory shows,
and what the suite's tests share (conftest.built_once) works in the shared folder, by name. A
process that lives less than a second may be missed, so the figures are a floor. Root sees every
process, the test cluster's jobs included.

    python benchmarks/suite_cpu.py [--json FILE] -- CI=true bash .ci/run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
# The kinds, first match wins: a command line's pattern and its name.
KINDS = [
    (r"\.snakemake/scripts/tmp\w*\.(\w+)\.py", None),  # a rule's script: train, predict, ...
    (r"scratchflow\.distributed", "training process or launcher (several processes)"),
    (r"snakemake.*--target-jobs", "a job step's Snakemake"),
    (r"snakemake", "Snakemake (the workflow's, or a plan)"),
    (r"-m pytest|execnet|exec\(eval\(sys\.stdin", "pytest"),
    (r"pip install", "pip install"),
    (r"^\S*?(slurmctld|slurmd|slurmstepd|slurmdbd|mariadbd|munged|unsquashfs|mksquashfs|enroot\S*|chrom\w*)", None),
]


def kind_of(command: str) -> str:
    if not command:
        return "the machine's own threads (no command line)"
    for pattern, name in KINDS:
        found = re.search(pattern, command)
        if found:
            return name or found.group(1)
    words = [word.rsplit("/", 1)[-1] for word in command.split()[:2]]
    if words[0].startswith("python") and len(words) > 1 and not words[1].startswith("-"):
        return f"python {words[1]}"  # a Python program by its script
    return words[0]


def test_of(cwd: str) -> str:
    """The test a process worked for, from its working directory: pytest's folder for the test
    (its name cut to 30 characters, then a number), or a folder of what the tests share."""
    found = re.search(r"/pytest-\d+/(?:popen-gw\d+/)?(.+?)\d*(?:/|$)", cwd)
    if found:
        return found.group(1)
    shared = re.search(r"/scratchflow-tests-\w+/([^/]+)", cwd)
    return f"shared: {shared.group(1)}" if shared else "other"


def sample(seen: dict[str, list], stop: threading.Event) -> None:
    """pid:start -> [CPU seconds spent since sampling began, command line, CPU seconds before it,
    working directory (read once)]."""
    first = True
    while not stop.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                key, cpu = f"{pid}:{fields[19]}", (int(fields[11]) + int(fields[12])) / TICKS
                if key not in seen:
                    seen[key] = [0.0, "", cpu if first else 0.0, os.readlink(f"/proc/{pid}/cwd")]
                entry = seen[key]
                entry[0] = max(entry[0], cpu - entry[2])
                # Read again each time: a process that execs another program (`exec`, the image's
                # python) keeps its pid and start time, and its CPU goes to what it became.
                line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                entry[1] = line or entry[1]
            except (OSError, ValueError, IndexError):  # ended meanwhile
                continue
        first = False
        stop.wait(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    seen: dict[str, list] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(seen, stop), daemon=True)
    started = time.monotonic()
    sampler.start()
    returncode = subprocess.run(["bash", "-c", " ".join(command)]).returncode
    wall = time.monotonic() - started
    stop.set()
    sampler.join()
    minutes, counts, by_test = Counter(), Counter(), Counter()
    for cpu, line, _before, cwd in seen.values():
        minutes[kind_of(line)] += cpu / 60
        counts[kind_of(line)] += 1
        by_test[test_of(cwd)] += cpu / 60
    total = sum(minutes.values())
    print(
        f"\n{wall / 60:.1f} min of wall time; {total:.1f} CPU minutes seen ({os.cpu_count()} cores: at most "
        f"{wall / 60 * os.cpu_count():.1f})",
        file=sys.stderr,
    )
    for kind, spent in minutes.most_common(25):
        print(f"{spent:7.2f} min  {counts[kind]:5d} processes  {kind}", file=sys.stderr)
    print("\nBy test (its Slurm jobs included):", file=sys.stderr)
    for test, spent in by_test.most_common(40):
        print(f"{spent:7.2f} min  {test}", file=sys.stderr)
    if options.json:
        figures = {"wall_minutes": wall / 60, "cpu_minutes": dict(minutes), "cpu_minutes_by_test": dict(by_test)}
        options.json.write_text(json.dumps(figures, indent=1))
    return returncode


if __name__ == "__main__":
    sys.exit(main())
