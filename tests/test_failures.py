"""Which failures a retry cannot fix (scratchflow.failures), and where in the lab's code they came from."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

import pytest
from scratchflow.failures import (
    DIVERGED,
    FAILED,
    Diverged,
    FinalFailure,
    final_failure,
    unfinished_line,
    unfinished_runs,
    where_in_output,
)
from scratchflow.files import NoSpace
from scratchflow.tasks.command import CommandFailed


def raised_in(task_file: Path, source: str) -> Exception:
    """What the task in `task_file` (source `source`, defining train()) raises when called."""
    task_file.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(task_file), "exec"), namespace)
    try:
        namespace["train"]()
    except Exception as error:
        return error
    raise AssertionError("it raised nothing")


def test_a_tasks_own_error_is_final_and_names_the_tasks_line(tmp_path):
    task = tmp_path / "lab_task.py"
    error = raised_in(task, "def train():\n    shapes = {}\n    return shapes['hidden']\n")
    assert final_failure(error, task, None) == FinalFailure("KeyError: 'hidden'", f"{task}:3 (in train)")


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.EIO, "Input/output error"),  # a shared filesystem's hiccup
        NoSpace("no space left"),
        MemoryError(),
        SystemExit(143),  # SIGTERM before the piece could pause
        KeyboardInterrupt(),
        CommandFailed("the command ['python', 'train.py'] was killed by SIGKILL", exit_status=-9),
        CommandFailed("the command ['python', 'train.py'] exited with 137", exit_status=137),  # a shell's SIGKILL
        CommandFailed("the command ['bash', 'run.sh'] exited with 104", exit_status=104),
    ],
    ids=["EIO", "no space", "host memory", "SIGTERM", "Ctrl-C", "killed", "exit 137", "exit 104"],
)
def test_what_a_retry_may_fix_is_retried(error):
    assert final_failure(error, None, None) is None


def test_a_gpu_out_of_memory_is_retried_once_and_final_the_second_time_in_a_row():
    out_of_memory = type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert final_failure(out_of_memory, None, "paused") is None
    again = final_failure(out_of_memory, None, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert again is not None and again.cause.startswith("OutOfMemoryError: CUDA out of memory")


def test_a_lab_programs_own_error_is_final_and_names_the_line_its_traceback_ends_in(tmp_path):
    output = (
        "loading\nTraceback (most recent call last):\n"
        f'  File "{tmp_path}/train.py", line 40, in <module>\n    main()\n'
        f'  File "{tmp_path}/train.py", line 12, in main\n    model(batch)\n'
        f'  File "{sys.prefix}/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _call_impl\n'
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x10 and 12x2)\n"
    )
    said = "the command ['python', 'train.py'] exited with 1, its last line: RuntimeError: mat1 and mat2 shapes"
    failed = CommandFailed(f"{said}; its last lines:\n{output}", 1)
    assert final_failure(failed, None, None) == FinalFailure(
        f"CommandFailed: {said}", f"{tmp_path}/train.py:12 (in main)"
    )
    silent = CommandFailed("metrics.json is missing: the command must write metrics.json into $SCRATCHFLOW_OUTPUT_DIR")
    assert final_failure(silent, None, None) == FinalFailure(f"CommandFailed: {silent}", None)
    assert where_in_output("no traceback at all") is None


def test_a_divergence_is_final_a_result_at_its_step_and_said_in_one_line():
    diverged = final_failure(Diverged(33, "its weights became NaN or infinite"), None, None)
    assert diverged == FinalFailure("diverged at step 33: its weights became NaN or infinite", None, DIVERGED, 33)
    said = {"cause": diverged.cause, "where": None, "piece": 2, "step": 33}
    assert (
        unfinished_line("abc", DIVERGED, said)
        == "run abc diverged at step 33: its weights became NaN or infinite (piece 2)"
    )
    failed = {"cause": "KeyError: 'hidden'", "where": "task.py:3 (in train)", "piece": 1, "step": 20}
    assert (
        unfinished_line("abc", FAILED, failed)
        == "run abc failed: KeyError: 'hidden' at task.py:3 (in train) (piece 1, its newest checkpoint: step 20)"
    )
    records = {"a": {"outcome": "finished"}, "b": {"outcome": FAILED, "failure": failed}, "c": {"divergence": said}}
    assert unfinished_runs(records) == {"c": (DIVERGED, said), "b": (FAILED, failed)}, "diverged first"


def test_a_programs_loss_that_is_not_finite_ends_it_as_diverged(tmp_path, monkeypatch):
    from scratchflow import program

    monkeypatch.setenv("SCRATCHFLOW_RUN_ID", "abc")
    monkeypatch.setenv("SCRATCHFLOW_OUTPUT_DIR", str(tmp_path))
    program.end_if_diverged(2.5, 10)
    with pytest.raises(SystemExit) as ended:
        program.end_if_diverged(float("nan"), 11)
    assert ended.value.code == 0
    assert json.loads((tmp_path / program.DIVERGED_FILE).read_text()) == {"step": 11, "detail": "the loss became nan"}
    monkeypatch.delenv("SCRATCHFLOW_RUN_ID")
    with pytest.raises(SystemExit, match="diverged at step 12: the loss became inf"):
        program.end_if_diverged(float("inf"), 12)


def test_a_programs_gpu_out_of_memory_is_retried_once_too():
    said = "the command ['python', 'train.py'] exited with 1, its last line: torch.OutOfMemoryError: CUDA out of memory"
    out_of_memory = CommandFailed(f"{said}; its last lines:\n...", 1)
    assert final_failure(out_of_memory, None, "killed by SIGTERM") is None
    assert final_failure(out_of_memory, None, f"CommandFailed: {said}") == FinalFailure(f"CommandFailed: {said}", None)
