"""Which failures a retry cannot fix (scratchflow.failures), and where in the lab's code they came from."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest
from scratchflow.failures import FinalFailure, final_failure, where_in_output
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
    assert final_failure(error, task, None) == FinalFailure("KeyError: 'hidden'", f"{task}:3")


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
    assert final_failure(failed, None, None) == FinalFailure(f"CommandFailed: {said}", f"{tmp_path}/train.py:12")
    silent = CommandFailed("metrics.json is missing: the command must write metrics.json into $SCRATCHFLOW_OUTPUT_DIR")
    assert final_failure(silent, None, None) == FinalFailure(f"CommandFailed: {silent}", None)
    assert where_in_output("no traceback at all") is None
