"""A task of your own against scratchflow's task protocol (scratchflow.contract), the checks that
scratchflow's own tasks pass, on a small config of it (docs/lab-pipeline.md, "Your own task"):

    scratchflow/.venv/bin/python scratchflow/scripts/check_task.py contract/texts.yaml

Run it in your pipeline's folder. Each config is a whole config.yaml (paths relative to that folder)
whose data and model train in seconds, with a checkpoint every few steps and at least two epochs.
"""

import argparse
import sys
from pathlib import Path

import yaml

SCRATCHFLOW_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SCRATCHFLOW_DIR / "scripts"))
from scratchflow import contract  # noqa: E402
from scratchflow.config import ConfigError, configured_task, validate_config  # noqa: E402
from scratchflow.tasks import find_lab_tasks_in  # noqa: E402


def checked_config(path: Path) -> dict:
    """The config at `path`, validated as the workflow validates it (ConfigError: one line)."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read it: {error}") from None
    validate_config(config)
    configured_task(config)
    return config


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("configs", nargs="+", type=Path)
find_lab_tasks_in(Path.cwd())
broken = 0
for path in parser.parse_args().configs:
    try:
        config = checked_config(path)
    except ConfigError as error:
        broken += 1
        print(f"{path}: not a config scratchflow runs: {error}", flush=True)
        continue
    for check, failure in contract.check_all(config):
        broken += failure is not None
        print(f"{path}: {config['task']}: {check}: {f'FAILED: {failure}' if failure else 'ok'}", flush=True)
sys.exit(1 if broken else 0)
