"""Apply a switch (docs/clusters.md: several nodes, one node, a preemptible partition) to your lab
pipeline's settings over scratchflow's profile, every other key of the profile kept:

    python scratchflow/scripts/apply_switch.py narval-several-nodes [--pipeline DIR] [--cluster NAME]

with the Python you run snakemake with (or scratchflow/.venv/bin/python, which make setup builds).

SWITCH: one of scratchflow's (scratchflow/config/tests/profiles/<name>.yaml), or a switch file of
your own. Writes DIR/profiles/<cluster>/config.v8+.yaml (DIR: this folder; your pipeline's, or the
working directory you run scratchflow's Snakefile in), the layer that `snakemake --profile
scratchflow/profiles/<cluster> --workflow-profile profiles/<cluster>` (make submit) reads: each key
the switch names holds the profile's value, or the layer's own, with the switch's keys merged in; the
layer's other keys stay. Commit it with your pipeline.

SWITCH may be the layer itself (profiles/<cluster>/config.v8+.yaml): each of its keys is then written
whole, scratchflow's entries with the layer's over them, as the workflow asks of a layer that drops
what scratchflow's profile sets (a 0.2 layer's `set-resources: train: runtime: 720`).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    from scratchflow.profiles import SwitchError, apply_switch
except ModuleNotFoundError as missing:  # a Python without PyYAML, e.g. the system's
    sys.exit(f"apply_switch.py: this Python lacks {missing.name}: run it with the Python you run snakemake with")

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("switch", help="a switch's name (narval-several-nodes) or a switch file's path")
parser.add_argument("--pipeline", type=Path, default=Path(), help="your pipeline's folder (default: this one)")
parser.add_argument("--cluster", help="the cluster whose profile the switch is for (default: its name's first word)")
arguments = parser.parse_args()
try:
    applied = apply_switch(arguments.pipeline, arguments.switch, arguments.cluster)
except SwitchError as error:
    sys.exit(f"apply_switch.py: {error}")
if Path(arguments.switch).resolve() == applied.layer.resolve():
    print(
        f"{applied.layer}: written whole, each key of it holding scratchflow's entries with yours over them (the "
        f"start-up check refused a layer that dropped some). Run with:\n  snakemake {applied.arguments}"
    )
    sys.exit()
print(
    f"{applied.layer}: {arguments.switch} applied (its header says what it was made from; set there what the "
    f"switch's comment asks for, e.g. a partition or a path). Run with:\n  snakemake {applied.arguments}"
)
