#!/usr/bin/env bash
# The whole suite (`make test`, and so CI), in six pytest runs:
# - the Slurm tests and every other test side by side. The Slurm tests run three at a time on one
#   test cluster (pytest-xdist workers; each finds its own jobs by their working directory, and the
#   few that change the cluster for every job run alone, last: conftest.using_the_cluster), since
#   they wait on signals, checkpoints and the scheduler much of the time; the others keep about one
#   core busy. Every job trains with one thread, so none waits on a partner thread that another
#   holds off its core (benchmarks/README.md, section 12). The data, model and reference runs they
#   share are built once (conftest.built_once);
# - once the others end, or the Slurm tests are down to those that need the cluster alone (the
#   last: one test runs where three did), a core is free: `once_a_core_frees` (the config checks,
#   the lab pipeline's, retraining's and search tests, which start many Snakemakes and train little,
#   and benchmarks/gpu.py's check on the CPU: 27 s alone, 1½ to 3 minutes beside the Slurm tests;
#   about 8 minutes in all) runs beside what is left, instead of in them;
# - once the others or the Slurm tests end, another core is free: `once_a_side_ends` (the
#   two-process tests, about 2½ minutes that would otherwise run last in the others' lane, on one
#   core while the other had nothing left to do, and a lab's Trainer and plain-PyTorch scripts',
#   about 3 minutes, their reference trained by the others first) runs beside what is left, a
#   pytest run per file: run as one, it was the suite's last minute and a half on one core;
# - then the benchmarks' ratio tests, alone: a ratio of two timings taken while other tests come and
#   go beside them says nothing (rsync 0.36 s against stage-in 0.89 s beside an image build).
# Options (not test paths) go to every one.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
slurm_tests=(tests/test_slurm.py tests/test_slurm_faults.py)
slurm_workers=3
alone=(tests/test_benchmarks.py)
once_a_core_frees=(
    tests/test_config_validation.py tests/test_lab_pipeline.py tests/test_retrain.py tests/test_search.py
    tests/test_gpu_benchmark.py
)
once_a_side_ends=(tests/test_distributed.py tests/test_trainer_script.py)
# Threads that wait for a partner sleep instead of spinning: both cores are busy for all of the suite,
# and torch's default (OpenMP spinning) made a 2-thread process beside others take a core its partner
# needed (benchmarks/README.md, section 12: the same weights, bit for bit, in less time).
export OMP_WAIT_POLICY=PASSIVE
SCRATCHFLOW_TEST_SHARED=$(mktemp -d /tmp/scratchflow-tests-XXXXXX)
export SCRATCHFLOW_TEST_SHARED
others_log=$SCRATCHFLOW_TEST_SHARED/others.log
late_log=$SCRATCHFLOW_TEST_SHARED/once-a-core-frees.log
last=()
trap 'kill "$others" "$late" "${last[@]}" 2>/dev/null; rm -rf "$SCRATCHFLOW_TEST_SHARED"' EXIT

# The references both compare with are trained first, by the others (conftest.shared_references_first).
SCRATCHFLOW_TEST_TRAINS_REFERENCES=1 "$python" -m pytest \
    "${slurm_tests[@]/#/--ignore=}" "${alone[@]/#/--ignore=}" "${once_a_core_frees[@]/#/--ignore=}" \
    "${once_a_side_ends[@]/#/--ignore=}" "$@" >"$others_log" 2>&1 &
others=$!

# Run pytest with the arguments after MARK and LOG, output to LOG, once the others have ended or
# MARK exists. Started by a watcher, so that the Slurm tests stay in the foreground (Ctrl-C reaches them).
start_once() {
    local mark=$1 log=$2
    shift 2
    (
        while kill -0 "$others" 2>/dev/null && [ ! -e "$mark" ]; do sleep 2; done
        exec "$python" -m pytest "$@" >"$log" 2>&1
    ) &
}
# The first is left by the first test that needs the cluster alone (conftest.using_the_cluster), or below.
slurm_ending=$SCRATCHFLOW_TEST_SHARED/slurm-tests-ending
slurm_ended=$SCRATCHFLOW_TEST_SHARED/slurm-tests-ended
start_once "$slurm_ending" "$late_log" "${once_a_core_frees[@]}" "$@"
late=$!
for tests in "${once_a_side_ends[@]}"; do
    start_once "$slurm_ended" "$SCRATCHFLOW_TEST_SHARED/once-a-side-ends-$(basename "$tests").log" "$tests" "$@"
    last+=($!)
done
"$python" -m pytest -n "$slurm_workers" --dist loadgroup --no-loadscope-reorder "${slurm_tests[@]}" "$@"
slurm_status=$?
touch "$slurm_ending" "$slurm_ended"
timeline=$SCRATCHFLOW_TEST_SHARED/slurm-timeline.tsv  # written by conftest.pytest_runtest_protocol
if [ -e "$timeline" ]; then
    echo "=== the Slurm tests' timeline: minutes from the first one's start to its end, the worker, the test ==="
    sort -n "$timeline" | awk -F'\t' 'NR == 1 { t0 = $1 } { printf "%5.1f %5.1f  %s  %s\n", ($1 - t0) / 60, ($2 - t0) / 60, $3, $4 }'
fi
wait "$others"
others_status=$?
wait "$late"
late_status=$?
last_status=0
for pid in "${last[@]}"; do
    wait "$pid" || last_status=1
done
echo
echo "=== every other test (all but ${slurm_tests[*]}, ${alone[*]}, ${once_a_core_frees[*]} and ${once_a_side_ends[*]}), beside the Slurm tests above ==="
cat "$others_log"
echo
echo "=== ${once_a_core_frees[*]}, from the first of: the others' end, the Slurm tests' end or last tests ==="
cat "$late_log"
echo
for tests in "${once_a_side_ends[@]}"; do
    echo "=== $tests, from the first of: the others' end, the Slurm tests' end ==="
    cat "$SCRATCHFLOW_TEST_SHARED/once-a-side-ends-$(basename "$tests").log"
    echo
done
echo "=== the benchmarks' ratio tests, alone ==="
"$python" -m pytest "${alone[@]}" "$@"
alone_status=$?
exit $((slurm_status != 0 || others_status != 0 || late_status != 0 || last_status != 0 || alone_status != 0))
