"""Make a lab's own pipeline on scratchflow (docs/lab-pipeline.md):

    python3 scripts/new_pipeline.py DIR --cluster narval [--source URL_OR_PATH] [--tag vX.Y.Z]

DIR gets git, scratchflow as the submodule scratchflow/ at the tag (default: the release this clone
is, or its commit where it has no release tags), a Snakefile that uses it as a module,
config/config.yaml (the release's demo grid, to start from), a layer over the cluster's profile (or,
with --cluster PATH, the lab's own profile copied whole with its facts file), requirements.txt
(scratchflow's, and the lab's packages to add), a Makefile (run, submit, cluster, status, retrain,
test, with the Python environment the lab activated), .gitignore and a README, staged for the first
commit.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratchflow.lab_pipeline import CLUSTERS, PipelineError, default_source, make_pipeline

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("folder", type=Path)
parser.add_argument(
    "--cluster", required=True, help=f"one of {', '.join(CLUSTERS)}, or the folder of a profile of your own"
)
parser.add_argument("--source", default=default_source(), help="scratchflow's repository (default: %(default)s)")
parser.add_argument("--tag", help="the release (or commit) to pin (default: the release of this clone)")
arguments = parser.parse_args()
try:
    pinned = make_pipeline(arguments.folder, arguments.cluster, arguments.source, arguments.tag)
except PipelineError as error:
    sys.exit(f"new_pipeline.py: {error}")
for note in pinned.notes:
    print(f"new_pipeline.py: {note}")
print(
    f"{arguments.folder}: a pipeline on scratchflow {pinned.tag}. Next:\n"
    f"  cd {arguments.folder} && git commit -m 'Our pipeline on scratchflow {pinned.tag}'\n"
    "  on the cluster's login node: its environment from requirements.txt (scratchflow/docs/clusters.md), "
    "then make test and make submit\n"
    "  on a laptop: make run (with no environment active, it builds .venv here first)"
)
