"""Tag every release CHANGELOG.md names (`v<version>`) at the commit that set it, as scratchflow's
repository tags them (scratchflow.releases); run after cutting a release, or in a clone that lacks
its tags:

    python3 scripts/tag_releases.py [REPOSITORY]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratchflow.releases import ReleaseError, tag_releases

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("repository", type=Path, nargs="?", default=Path(__file__).resolve().parents[1])
try:
    tagged = tag_releases(parser.parse_args().repository)
except ReleaseError as error:
    sys.exit(f"tag_releases.py: {error}")
for tag, commit in tagged.items():
    print(f"{tag} {commit}")
