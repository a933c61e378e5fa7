#!/usr/bin/env python3
"""What the cluster offers a profile's jobs: python scripts/cluster.py profiles/<name> [LAYER].

LAYER: a lab's settings over the profile (its --workflow-profile), whose keys replace the profile's.

For each partition the profile's rules ask for (the cluster's default partition where a rule names
none): its nodes, the idle and total GPUs by type, and the jobs of every user pending there, so that
you see before submitting where a grid will wait. Asks Slurm; changes nothing. Exits 2 without Slurm."""

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratchflow.preflight import cluster_overview, pending_jobs, profile_partitions, read_cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "profiles", type=Path, nargs="+", help="a profile's folder (profiles/narval), then a lab's layer over it"
    )
    profiles = parser.parse_args().profiles
    try:
        cluster = read_cluster(user=None)
        pending = pending_jobs()
    except (OSError, subprocess.SubprocessError) as error:
        print(f"scratchflow cluster: Slurm did not answer ({error})", file=sys.stderr)
        return 2
    named = [name or cluster.default_partition for name in profile_partitions(*profiles)]
    print(cluster_overview(cluster, [name for name in dict.fromkeys(named) if name], pending))
    return 0


if __name__ == "__main__":
    sys.exit(main())
