"""scratchflow: the HPC experiment lifecycle (tar, stage, train, predict, sync back, clean up).

The Snakemake rules declare files, resources and software; everything else lives in this package as
plain functions and objects that tests and other tools call directly: the plan of a grid or search (`plan`), the
checks and hooks around the workflow (`workflow_hooks`), one function per job (`jobs`), and the tasks
that jobs train (`tasks`). Only `snakemake_adapter` reaches into Snakemake's internals.
"""

from pathlib import Path

# The release (CHANGELOG.md); recorded in every run's record.json with the commit it ran from.
__version__ = "0.5.0.dev0"
# scratchflow's own folder (Snakefile, rules, scripts), also when a lab's Snakefile uses it as a module.
SCRATCHFLOW_DIR = Path(__file__).resolve().parents[2]
