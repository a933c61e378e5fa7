"""Which failures a retry cannot fix (scratchflow.failures), and where in the lab's code they came from."""

from __future__ import annotations

import dataclasses
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
from scratchflow.jobs import RunFailed, RunOutputs
from scratchflow.tasks import Trained, WrongTrained, check_trained
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


def test_what_train_returns_is_taken_with_its_folder_as_a_string_and_refused_in_one_line_otherwise(tmp_path):
    """`Trained.output` given as a string (a path is what a lab's code often has) is taken as a Path;
    what the protocol does not take is one line naming the task, what it returned and where its
    train is, a failure a retry cannot fix; None is a stop only where one was asked."""
    task = tmp_path / "lab_task.py"
    task.write_text("def train(context):\n    return context\n")
    namespace: dict = {}
    exec(compile(task.read_text(), str(task), "exec"), namespace)
    train, folder = namespace["train"], tmp_path / "output"
    folder.mkdir()
    taken = check_trained("ourlab.task", train, Trained(output=str(folder), metrics={"loss": 0.5}), stop_asked=False)
    assert taken == Trained(output=folder, metrics={"loss": 0.5})
    assert check_trained("ourlab.task", train, None, stop_asked=True) is None
    elsewhere = Trained(output=tmp_path / "on-another-node", metrics={})  # a rank's that is not kept
    assert check_trained("ourlab.task", train, elsewhere, stop_asked=False, kept=False) == elsewhere
    wrong = {
        "a dict, not a Trained(output, metrics)": {"output": folder},
        "an output that is an int": Trained(output=3, metrics={}),
        f"an output, {tmp_path / 'nowhere'}, that is no folder": Trained(output=tmp_path / "nowhere", metrics={}),
        "metrics that are a list": Trained(output=folder, metrics=[0.5]),
        "metrics that are not JSON-serializable": Trained(output=folder, metrics={"loss": object()}),
        "None, which means stopped, though no stop was asked": None,
    }
    for said, returned in wrong.items():
        with pytest.raises(WrongTrained) as refused:
            check_trained("ourlab.task", train, returned, stop_asked=False)
        assert str(refused.value).startswith(f"task ourlab.task: train returned {said}"), str(refused.value)
        failure = final_failure(refused.value, task, None)
        assert failure is not None and failure.where == f"{task}:1 (in train)", "final: a retry cannot fix it"
        assert failure.cause.startswith("WrongTrained: task ourlab.task: train returned") and "\n" not in failure.cause


def test_a_train_that_returns_what_the_protocol_does_not_take_fails_its_run_in_its_one_job(tmp_path, monkeypatch):
    """A whole train job in this process (the command task), its train returning the folder it trained
    into as a dict: the job ends, its run recorded `failed` with one line that names the task's train,
    and nothing of scratchflow's own raised (before, a string given as the folder failed in
    scratchflow's copy back, and every retry trained again and failed the same way)."""
    from scratchflow.jobs import train_job
    from scratchflow.tasks import command
    from test_run_folder import a_train_job

    for variable in ("SCRATCHFLOW_STOP_SIGNAL", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # the job sets them
        monkeypatch.setenv(variable, "")
    monkeypatch.chdir(tmp_path)
    job = a_train_job(tmp_path)
    job.log.parent.mkdir(parents=True)
    real_train = command.train

    def as_a_string(context):
        trained = real_train(context)
        return Trained(output=str(trained.output), metrics=trained.metrics)

    monkeypatch.setattr(command, "train", as_a_string)
    train_job(job)
    assert json.loads(job.ends_with.record.read_text())["outcome"] == "finished"
    assert job.ends_with.model.is_dir()

    def as_a_dict(context):
        return {"output": real_train(context).output}

    monkeypatch.setattr(command, "train", as_a_dict)
    run = tmp_path / "results" / "runs" / "r2"
    again = dataclasses.replace(
        job,
        run_id="r2",
        shared_folder=tmp_path / "checkpoints" / "r2",
        ends_with=RunOutputs(run / "model", run / "params.json", run / "record.json"),
        tracking_dir=run / "tensorboard",
        prediction_at_end=run / "predicted-in-training",
    )
    with pytest.raises(RunFailed, match="a retry cannot fix it: WrongTrained: task command: train returned a dict"):
        train_job(again)  # the job's context ends it as a success: its outputs say the run failed
    record = json.loads(again.ends_with.record.read_text())
    assert record["outcome"] == FAILED, record
    (piece,) = record["pieces"]
    assert piece["cause"].startswith("WrongTrained: task command: train returned a dict, not a Trained"), piece
    assert piece["where"].endswith("(in as_a_dict)"), piece
