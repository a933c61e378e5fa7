#!/usr/bin/env bash
# The whole suite (`make test`) as two pytest processes side by side: the Slurm tests, which mostly
# wait on the test cluster (one cluster, its tests in order), and every other test. Each prints its
# own report; the Slurm one's comes second, in full. Arguments go to both.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
slurm_tests=(tests/test_slurm.py tests/test_slurm_faults.py)
slurm_log=$(mktemp)
trap 'rm -f "$slurm_log"' EXIT
"$python" -m pytest "${slurm_tests[@]}" "$@" >"$slurm_log" 2>&1 &
slurm=$!
"$python" -m pytest "${slurm_tests[@]/#/--ignore=}" "$@"
others=$?
wait "$slurm"
slurm_status=$?
echo
echo "=== the Slurm tests (tests/test_slurm.py, tests/test_slurm_faults.py), run beside the above ==="
cat "$slurm_log"
exit $((others != 0 || slurm_status != 0))
