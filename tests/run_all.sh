#!/usr/bin/env bash
# The whole suite (`make test`, and so CI), in three pytest runs:
# - the Slurm tests and every other test side by side. The Slurm tests run three at a time on one
#   test cluster (pytest-xdist workers; each finds its own jobs by their working directory, and the
#   few that change the cluster for every job run alone, last: conftest.using_the_cluster), since
#   they wait on signals, checkpoints and the scheduler much of the time; the others keep about one
#   core busy. Every job trains with one thread, so none waits on a partner thread that another
#   holds off its core (benchmarks/README.md, section 12). The data, model and reference runs they
#   share are built once (conftest.built_once);
# - then the benchmarks' ratio tests, alone: a ratio of two timings taken while other tests come and
#   go beside them says nothing (rsync 0.36 s against stage-in 0.89 s beside an image build).
# Options (not test paths) go to every one.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
slurm_tests=(tests/test_slurm.py tests/test_slurm_faults.py)
slurm_workers=3
alone=(tests/test_benchmarks.py)
SCRATCHFLOW_TEST_SHARED=$(mktemp -d /tmp/scratchflow-tests-XXXXXX)
export SCRATCHFLOW_TEST_SHARED
others_log=$SCRATCHFLOW_TEST_SHARED/others.log
trap 'kill "$others" 2>/dev/null; rm -rf "$SCRATCHFLOW_TEST_SHARED"' EXIT

# The references both compare with are trained first, by the others (conftest.shared_references_first).
SCRATCHFLOW_TEST_TRAINS_REFERENCES=1 "$python" -m pytest "${slurm_tests[@]/#/--ignore=}" "${alone[@]/#/--ignore=}" "$@" \
    >"$others_log" 2>&1 &
others=$!
"$python" -m pytest -n "$slurm_workers" --dist loadgroup --no-loadscope-reorder "${slurm_tests[@]}" "$@"
slurm_status=$?
wait "$others"
others_status=$?
echo
echo "=== every other test (all but ${slurm_tests[*]} and ${alone[*]}), run beside the Slurm tests above ==="
cat "$others_log"
echo
echo "=== the benchmarks' ratio tests, alone ==="
"$python" -m pytest "${alone[@]}" "$@"
alone_status=$?
exit $((slurm_status != 0 || others_status != 0 || alone_status != 0))
