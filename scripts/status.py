#!/usr/bin/env python3
"""Where every run of a grid stands: python scripts/status.py [the directory you run snakemake in].

Reads what the workflow writes (results/, checkpoints/, logs/) and, where there is a Slurm, one
squeue and one sacct (what the grid has cost so far); where the runs were trained by other code or
packages, says so, with the line that trains them again. Changes nothing. Exits 0, or 2 when the
directory holds no grid."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratchflow.plan import NoPlan
from scratchflow.status import current_status, render, run_records, spend_line, trained_by_lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", default=".", type=Path, help="where the grid runs (default: here)")
    workdir = parser.parse_args().directory
    try:
        statuses, rung = current_status(workdir)
    except NoPlan as error:
        print(f"scratchflow status: {error}", file=sys.stderr)
        return 2
    records = run_records(workdir)
    print(render(statuses, rung, spend_line(workdir, statuses, records), trained_by_lines(workdir, records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
