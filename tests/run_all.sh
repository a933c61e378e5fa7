#!/usr/bin/env bash
# The whole suite (`make test`, and so CI), in four pytest runs:
# - the Slurm tests and every other test side by side. The Slurm tests run three at a time on one
#   test cluster (pytest-xdist workers; each finds its own jobs by their working directory, and the
#   few that change the cluster for every job run alone, last: conftest.using_the_cluster), since
#   they wait on signals, checkpoints and the scheduler much of the time; the others keep about one
#   core busy. Every job trains with one thread, so none waits on a partner thread that another
#   holds off its core (benchmarks/README.md, section 12). The data, model and reference runs they
#   share are built once (conftest.built_once);
# - once the Slurm tests end (about 22 of the others' 27 minutes, 2026-11-26), a core is free:
#   `after_slurm` (the config checks and the lab pipeline's tests, which start many Snakemakes and
#   train little, and benchmarks/gpu.py's check on the CPU: 27 s alone, 1½ to 3 minutes beside the
#   Slurm tests; about 4 minutes in all) runs beside what is left of the others, instead of in them;
# - then the benchmarks' ratio tests, alone: a ratio of two timings taken while other tests come and
#   go beside them says nothing (rsync 0.36 s against stage-in 0.89 s beside an image build).
# Options (not test paths) go to every one.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
slurm_tests=(tests/test_slurm.py tests/test_slurm_faults.py)
slurm_workers=3
alone=(tests/test_benchmarks.py)
after_slurm=(tests/test_config_validation.py tests/test_lab_pipeline.py tests/test_gpu_benchmark.py)
# Threads that wait for a partner sleep instead of spinning: both cores are busy for all of the suite,
# and torch's default (OpenMP spinning) made a 2-thread process beside others take a core its partner
# needed (benchmarks/README.md, section 12: the same weights, bit for bit, in less time).
export OMP_WAIT_POLICY=PASSIVE
SCRATCHFLOW_TEST_SHARED=$(mktemp -d /tmp/scratchflow-tests-XXXXXX)
export SCRATCHFLOW_TEST_SHARED
others_log=$SCRATCHFLOW_TEST_SHARED/others.log
after_slurm_log=$SCRATCHFLOW_TEST_SHARED/after-slurm.log
after=
trap 'kill "$others" $after 2>/dev/null; rm -rf "$SCRATCHFLOW_TEST_SHARED"' EXIT

# The references both compare with are trained first, by the others (conftest.shared_references_first).
SCRATCHFLOW_TEST_TRAINS_REFERENCES=1 "$python" -m pytest \
    "${slurm_tests[@]/#/--ignore=}" "${alone[@]/#/--ignore=}" "${after_slurm[@]/#/--ignore=}" "$@" \
    >"$others_log" 2>&1 &
others=$!
"$python" -m pytest -n "$slurm_workers" --dist loadgroup --no-loadscope-reorder "${slurm_tests[@]}" "$@"
slurm_status=$?
"$python" -m pytest "${after_slurm[@]}" "$@" >"$after_slurm_log" 2>&1 &
after=$!
wait "$others"
others_status=$?
wait "$after"
after_status=$?
echo
echo "=== every other test (all but ${slurm_tests[*]}, ${alone[*]} and ${after_slurm[*]}), beside the Slurm tests above ==="
cat "$others_log"
echo
echo "=== ${after_slurm[*]}, once the Slurm tests ended, beside the others ==="
cat "$after_slurm_log"
echo
echo "=== the benchmarks' ratio tests, alone ==="
"$python" -m pytest "${alone[@]}" "$@"
alone_status=$?
exit $((slurm_status != 0 || others_status != 0 || after_status != 0 || alone_status != 0))
