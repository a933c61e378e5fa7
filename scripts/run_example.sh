#!/usr/bin/env bash
# Runs one of config/examples/<name>/ on this machine: makes example-runs/<name>/ its working
# directory (config/config.yaml and the example's other files copied in, its data and model made by
# its prepare.py if it has one), then runs scripts/run_local.sh there. Extra arguments go to Snakemake.
#     scripts/run_example.sh image|command [snakemake arguments]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
name=${1:?usage: run_example.sh NAME, one of: $(ls "$repo/config/examples" | tr '\n' ' ')}
shift
example="$repo/config/examples/$name"
[ -d "$example" ] || { echo "no example $name in $repo/config/examples" >&2; exit 2; }
python=python3
[ -x "$repo/.venv/bin/python" ] && python="$repo/.venv/bin/python"
work="${SCRATCHFLOW_EXAMPLE_DIR:-$repo/example-runs/$name}"
mkdir -p "$work/config"
cp "$example/config.yaml" "$work/config/config.yaml"
find "$example" -maxdepth 1 -type f ! -name config.yaml ! -name prepare.py -exec cp {} "$work/" \;
if [ -f "$example/prepare.py" ]; then
    PYTHONPATH="$repo/scripts" "$python" "$example/prepare.py" "$work"
fi
cd "$work"
echo "scratchflow: example $name in $work"
exec "$repo/scripts/run_local.sh" "$@"
