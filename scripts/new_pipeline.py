"""Make a lab's own pipeline on scratchflow (docs/lab-pipeline.md):

    python3 scripts/new_pipeline.py DIR --cluster narval [--source URL_OR_PATH] [--tag vX.Y.Z]

DIR gets git, scratchflow as the submodule scratchflow/ at the tag (default: this release's), a
Snakefile that uses it as a module, config/config.yaml (the demo's grid, to start from), a layer over
the cluster's profile, a Makefile (run, cluster, status, test), .gitignore and a README, staged for
the first commit.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratchflow.lab_pipeline import CLUSTERS, PipelineError, default_source, default_tag, make_pipeline

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("folder", type=Path)
parser.add_argument("--cluster", required=True, choices=CLUSTERS)
parser.add_argument("--source", default=default_source(), help="scratchflow's repository (default: %(default)s)")
parser.add_argument("--tag", default=default_tag(), help="the release to pin (default: %(default)s)")
arguments = parser.parse_args()
try:
    make_pipeline(arguments.folder, arguments.cluster, arguments.source, arguments.tag)
except PipelineError as error:
    sys.exit(f"new_pipeline.py: {error}")
print(
    f"{arguments.folder}: a pipeline on scratchflow {arguments.tag}. Next:\n"
    f"  cd {arguments.folder} && git commit -m 'Our pipeline on scratchflow {arguments.tag}' && make run"
)
