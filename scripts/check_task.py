"""A task of your own against scratchflow's task protocol (scratchflow.contract), the checks that
scratchflow's own tasks pass, on a small config of it (docs/lab-pipeline.md, "Your own task"):

    scratchflow/.venv/bin/python scratchflow/scripts/check_task.py contract/texts.yaml

Run it in your pipeline's folder. Each config is a whole config.yaml (paths relative to that folder)
whose data and model train in seconds, with a validation split and a checkpoint every few steps.
Each check prints `ok` or `FAILED` and why (docs/tasks.md, "What check_task.py checks"); what the
task raises in one is that check's FAILED line, and the next check runs.
"""

import argparse
import logging
import os
import sys
from pathlib import Path

SCRATCHFLOW_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SCRATCHFLOW_DIR / "scripts"))
from scratchflow.slurm_job import THREAD_VARIABLES  # noqa: E402

# The checks' pieces train on one thread, set before torch starts, as a job sets its CPUs: without,
# the text task's stopped and resumed run ended otherwise than its uninterrupted one here (both in
# this process), though it resumes byte for byte in its jobs.
for variable in THREAD_VARIABLES:
    os.environ[variable] = "1"
from scratchflow import contract  # noqa: E402
from scratchflow.config import ConfigError, LabTaskFailed  # noqa: E402
from scratchflow.tasks import find_lab_tasks_in  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("configs", nargs="+", type=Path)
find_lab_tasks_in(Path.cwd())
# The checks send the stop signal themselves: the piece's line that it heard one is no news here.
for name in ("scratchflow.piece", "scratchflow.training_process"):
    logging.getLogger(name).setLevel(logging.ERROR)
broken = 0
for path in parser.parse_args().configs:
    try:
        config = contract.contract_config(path)
    except LabTaskFailed as failure:
        broken += 1
        print(f"{path}: {failure.task}: loaded, its settings checked: FAILED: {failure.failure}", flush=True)
        continue
    except ConfigError as error:
        broken += 1
        print(f"{path}: not a config scratchflow runs: {error}", flush=True)
        continue
    for check, failure in contract.check_all(config):
        if isinstance(failure, contract.CheckSkipped):
            print(f"{path}: {config['task']}: {check}: skipped: {failure}", flush=True)
            continue
        broken += failure is not None
        print(f"{path}: {config['task']}: {check}: {f'FAILED: {failure}' if failure else 'ok'}", flush=True)
sys.exit(1 if broken else 0)
