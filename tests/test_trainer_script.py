"""A lab's own Hugging Face Trainer script (tests/trainer_script_lab/train.py, written to be run by hand)
under `task: command`: unchanged through `python -m scratchflow.trainer_script`, and changed by a few
lines through its helpers; paused by the stop signal or killed after a checkpoint, each resumes to
the weights and metrics of an uninterrupted run, byte for byte."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import (
    LAUNCHED,
    REPO,
    SCRIPT_ARGUMENTS,
    TRAINER_SCRIPT_LAB,
    _cwd_of,
    different_results,
    job_process,
    lab_pipeline,
    one_run,
    run_with,
    run_workflow,
    script_config,
    start_workflow,
    workflow_env,
    write_config,
)
from scratchflow import program, trainer_script
from scratchflow.contract import different_files, metrics_difference
from scratchflow.program import figures, flag_words
from scratchflow.tasks.command import check_settings
from scratchflow.trainer_script import expanded, launched_script, prediction_table, script_problem

pytestmark = pytest.mark.slow
# The lines the helper depth changes in the script: each a line of the unchanged script, and its new text.
WITH_HELPERS = {
    "import pandas as pd\n": "import pandas as pd\nfrom scratchflow import trainer_script as scratchflow\n",
    "frame = pd.read_csv(args.data)\n": "frame = pd.read_csv(scratchflow.data_file(args.data))\n",
    "tokenizer = AutoTokenizer.from_pretrained(args.model)\n": (
        "tokenizer = AutoTokenizer.from_pretrained(scratchflow.model_dir(args.model))\n"
    ),
    "model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=len(names))\n": (
        "model = AutoModelForSequenceClassification.from_pretrained(scratchflow.model_dir(args.model), "
        "num_labels=len(names))\n"
    ),
    "training_args = TrainingArguments(\n": "training_args = scratchflow.training_arguments(\n",
    "    compute_metrics=accuracy,\n": "    compute_metrics=accuracy,\n    callbacks=scratchflow.callbacks(),\n",
    "trainer.train()\n": "trainer.train(resume_from_checkpoint=scratchflow.resume_from())\n",
    'trainer.save_model("final_model")\n': 'trainer.save_model(scratchflow.output_dir("final_model"))\n',
    "print(trainer.evaluate())\n": "print(scratchflow.write_metrics(trainer.evaluate()))\n",
    "print(trainer.predict(encode(test)).metrics)": (
        "print(scratchflow.write_predictions(trainer.predict(encode(test)), model.config.id2label).metrics)"
    ),
}


def wait_for_shared_checkpoint(workdir: Path, workflow: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not list(workdir.glob("checkpoints/*/checkpoint-*/COMPLETE")):
        assert time.monotonic() < deadline and workflow.poll() is None, workflow.communicate()[0][-4000:]
        time.sleep(0.05)


def paused_by_usr1_and_resumed(workdir: Path) -> None:
    """The one run of `workdir`'s grid, sent USR1 once a checkpoint is on shared storage: paused at a
    checkpoint, and resumed from it by the local profile's retry to its end."""
    workflow = start_workflow(workdir)
    wait_for_shared_checkpoint(workdir, workflow)
    os.kill(job_process(workdir), signal.SIGUSR1)
    output = workflow.communicate(timeout=600)[0]
    assert workflow.returncode == 0, output[-3000:]
    first, second = json.loads((one_run(workdir) / "record.json").read_text())["pieces"]
    assert (first["outcome"], first["signal"]) == ("paused", "SIGUSR1"), output[-3000:]
    assert first["reached_step"] == second["resumed_from_step"] > 0


def training_jobs(workdir: Path) -> dict[int, tuple[str, dict]]:
    """The train jobs training in `workdir` now: each job's process id -> the run id and parameters
    of the program it runs (read from the program's environment)."""
    jobs = {}
    # The launched programs only (pgrep): reading every process's environment takes longer than a
    # tiny run's training under the suite's load.
    found = subprocess.run(["pgrep", "-f", trainer_script.MODULE], capture_output=True, text=True).stdout.split()
    for process in (Path("/proc") / pid for pid in found):
        try:
            words = (process / "environ").read_bytes().decode(errors="replace").split("\0")
            environ = dict(word.split("=", 1) for word in words if "=" in word)
            if "SCRATCHFLOW_PARAMS" not in environ or _cwd_of(int(process.name)) != workdir.resolve():
                continue
            job = int((process / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if b".train.py" in Path(f"/proc/{job}/cmdline").read_bytes():
                jobs[job] = (environ["SCRATCHFLOW_RUN_ID"], json.loads(Path(environ["SCRATCHFLOW_PARAMS"]).read_text()))
        except (OSError, ValueError):  # not a process, or one that ended while it was read
            continue
    return jobs


def signal_past_a_shared_checkpoint(workdir: Path, workflow: subprocess.Popen, signals: dict[str, tuple]) -> None:
    """To each run's train job, its signal once a checkpoint of the run is on shared storage:
    `signals` maps a name to (the run's setting, the signal). All are watched at once: the runs
    train side by side, and one may end while another is waited for."""
    waiting, deadline = dict(signals), time.monotonic() + 300
    while waiting:
        for job, (run_id, params) in training_jobs(workdir).items():
            for name, (setting, number) in list(waiting.items()):
                if setting.items() <= params.items() and list(
                    workdir.glob(f"checkpoints/{run_id}/checkpoint-*/COMPLETE")
                ):
                    os.kill(job, number)
                    del waiting[name]
        assert time.monotonic() < deadline and workflow.poll() is None, (
            f"not signalled: {sorted(waiting)}\n" + workflow.communicate()[0][-4000:]
        )
        time.sleep(0.05)


def test_a_lab_pipelines_unchanged_script_trains_a_grid_and_its_paused_and_killed_runs_resume_exactly(
    tmp_path, news_csv, tiny_model, uninterrupted_script_runs
):
    """A lab's pipeline (scripts/new_pipeline.py) whose Trainer script runs unchanged through the
    launcher trains a 2 x 2 grid over learning_rate and per_device_train_batch_size.
    One run's job gets USR1 after its first checkpoint on shared storage: the launcher's callback
    saves at the step's end and the program ends as a pause (not on to the script's save_model and
    evaluate, which would record it finished). Another's job is SIGKILLed: its program dies with it.
    The local profile's retry resumes each; both end with the uninterrupted runs' weights, metrics
    and predictions, byte for byte, and the comparison ranks all 4 by the script's evaluation."""
    config = script_config(
        news_csv,
        tiny_model,
        tmp_path / "scratch",
        TRAINER_SCRIPT_LAB / "train.py",
        learning_rate=[2.0e-3, 1.0e-3],
        per_device_train_batch_size=[16, 32],
        seed=[1],
    )
    lab = lab_pipeline(tmp_path / "ourlab", "edinburgh", config)
    paused, killed = ({"learning_rate": 2.0e-3, "per_device_train_batch_size": batch, "seed": 1} for batch in (16, 32))
    workflow = start_workflow(lab)
    signal_past_a_shared_checkpoint(
        lab, workflow, {"paused": (paused, signal.SIGUSR1), "killed": (killed, signal.SIGKILL)}
    )
    output = workflow.communicate(timeout=900)[0]
    assert workflow.returncode == 0, output[-3000:]

    first, second = json.loads((run_with(lab, **paused) / "record.json").read_text())["pieces"]
    assert (first["outcome"], first["signal"]) == ("paused", "SIGUSR1"), output[-3000:]
    assert first["reached_step"] == second["resumed_from_step"] > 0
    assert json.loads((run_with(lab, **killed) / "record.json").read_text())["training"]["resumed_from_step"] > 0
    for setting in (paused, killed):
        assert different_results(lab, uninterrupted_script_runs, **setting) == [], setting

    metrics = json.loads((run_with(lab, **paused) / "metrics.json").read_text())
    assert set(metrics) == {"eval_accuracy", "eval_loss", "test_accuracy", "test_loss", "confusion_matrix"}
    predictions = pd.read_csv(run_with(lab, **paused) / "model" / "predictions.csv")
    assert list(predictions.columns) == ["row", "label", "predicted", "confidence"]
    assert metrics["test_accuracy"] == pytest.approx((predictions["label"] == predictions["predicted"]).mean())
    assert (run_with(lab, **paused) / "model" / "tokenizer.json").is_file(), "save_model() saved into the run's model"
    runs = pd.read_csv(lab / "results" / "runs.tsv", sep="\t")
    assert len(runs) == 4 and runs["eval_accuracy"].notna().all()
    best = json.loads((lab / "results" / "best_run.json").read_text())["run"]
    assert best["value"] == runs["eval_accuracy"].max()
    assert "confusion_matrix" in json.loads((lab / "results" / "runs" / best["run_id"] / "metrics.json").read_text())
    assert not (lab / "final_model").exists() and not (lab / "out").exists(), "nothing on shared storage"


def test_the_script_with_its_helpers_changes_few_lines_and_killed_resumes_to_the_same_results(
    tmp_path, news_csv, tiny_model, uninterrupted_script_runs
):
    """The helper depth: the script imports scratchflow.trainer_script and calls it; killed outright
    after a checkpoint, the next run resumes from it to the same weights and metrics."""
    changed, lines = changed_lines((TRAINER_SCRIPT_LAB / "train.py").read_text(), WITH_HELPERS)
    assert lines <= 10
    helped = tmp_path / "train.py"
    helped.write_text(changed)
    config = script_config(news_csv, tiny_model, tmp_path / "scratch", helped)
    # The parameters that are the script's flags are the lab's to pass at this depth.
    config["training"]["command"] = ["python", str(helped), *SCRIPT_ARGUMENTS, "--max-length", "48"]
    write_config(tmp_path, config)
    workflow = start_workflow(tmp_path)
    wait_for_shared_checkpoint(tmp_path, workflow)
    os.killpg(workflow.pid, signal.SIGKILL)
    workflow.wait()

    run_workflow(tmp_path)

    record = json.loads((one_run(tmp_path) / "record.json").read_text())
    assert record["training"]["resumed_from_step"] > 0
    assert different_results(tmp_path, uninterrupted_script_runs) == []


def test_check_task_stops_and_resumes_a_program_and_fails_one_whose_resume_differs_in_one_line(
    tmp_path, news_csv, tiny_model
):
    """The contract of a program, checked as a lab checks its task (scratchflow/scripts/check_task.py
    in its pipeline's folder): stopped by the stop signal after its first checkpoint, resumed, and
    compared with the same run uninterrupted. A script that splits its data unseeded trains each
    piece on another split (test rows leaking into training), and says so in one line; the other
    checks pass. (The same script seeded resumes exactly: the tests above.)"""
    # As datasets' train_test_split without a seed: a generator of fresh entropy, set_seed or not.
    unseeded = "frame.sample(frac=1.0, random_state=np.random.default_rng())"
    script = (TRAINER_SCRIPT_LAB / "train.py").read_text().replace("frame.sample(frac=1.0, random_state=42)", unseeded)
    (tmp_path / "train.py").write_text(script)
    config = script_config(news_csv, tiny_model, None, Path("train.py"))
    config["training"]["num_train_epochs"] = 2  # a TrainingArguments field: 30 steps, a checkpoint every 5
    (tmp_path / "contract").mkdir()
    (tmp_path / "contract" / "script.yaml").write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        [sys.executable, REPO / "scripts" / "check_task.py", "contract/script.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=workflow_env(),
        timeout=600,
    )
    lines = [line for line in checked.stdout.splitlines() if line.startswith("contract/script.yaml: ")]
    assert [line.split(": ")[2] for line in lines] == [
        "an empty dataset refused",
        "stopped by the stop signal, then resumed",
        "predicted what it trained",
        "resumed to the uninterrupted run's results",
    ], checked.stdout + checked.stderr[-3000:]
    failed = [line for line in lines if "FAILED" in line]
    assert checked.returncode == 1
    assert failed == [
        AnyLine(
            "contract/script.yaml: command: resumed to the uninterrupted run's results: FAILED: command: stopped and "
            "resumed, the run ended otherwise than uninterrupted: metrics.json differs (eval_"
        )
    ], checked.stdout


class AnyLine(str):
    """Equal to a line that starts with it and says what to do about it."""

    def __eq__(self, line: object) -> bool:
        return (
            isinstance(line, str)
            and line.startswith(self)
            and line.endswith("restore the optimizer's and the random states with the weights")
        )

    __hash__ = str.__hash__


def test_a_resumed_programs_output_is_compared_file_for_file_but_where_it_was_trained(tmp_path):
    resumed, uninterrupted = tmp_path / "resumed", tmp_path / "uninterrupted"
    for folder, loss in ((resumed, 0.5), (uninterrupted, 0.5)):
        (folder / "model").mkdir(parents=True)
        (folder / "model" / "model.safetensors").write_bytes(b"weights")
        (folder / "metrics.json").write_text(json.dumps({"eval_accuracy": 0.9, "eval_loss": loss}))
        (folder / "training_args.bin").write_bytes(str(folder).encode())  # the piece's scratch paths
    assert different_files(resumed, uninterrupted) == []
    matrix = {"labels": ["a", "b"], "rows_true_columns_predicted": [[1, 0], [0, 1]]}
    (uninterrupted / "metrics.json").write_text(
        json.dumps({"eval_accuracy": 0.9, "eval_loss": 0.75, "confusion_matrix": matrix})
    )
    (uninterrupted / "model" / "extra.bin").write_bytes(b"")
    assert different_files(resumed, uninterrupted) == ["metrics.json", "model/extra.bin"]
    assert metrics_difference(resumed / "metrics.json", uninterrupted / "metrics.json") == (
        " (eval_loss: 0.5 resumed, 0.75 uninterrupted)"
    ), "a figure first, then nested detail"


def test_a_script_the_launcher_cannot_drive_is_refused_in_one_line(tmp_path):
    plain = tmp_path / "loop.py"
    plain.write_text("import torch\nfor step in range(10):\n    pass\n")
    assert script_problem(plain, []) == (
        f"training.command: {plain} makes no Trainer (no call of a class named *Trainer): use task: command without "
        "scratchflow.trainer_script"
    )
    script = TRAINER_SCRIPT_LAB / "train.py"
    assert script_problem(script, ["learning_rate", "seed", "max_length"]) is None, "a field, a field, a flag"
    config = {"training": {"command": [*LAUNCHED, str(script)], "dropout": 0.1}, "grid": {"dropout": [0.1]}}
    with pytest.raises(ValueError) as refused:  # as the workflow's start-up checks it: one line, one key
        check_settings(config)
    assert str(refused.value).startswith("training.dropout: scratchflow.trainer_script gives")
    assert script_problem(script, ["max_lenght"]).endswith("and train.py has neither (did you mean 'max_length'?)")
    assert script_problem(script, ["dropout"]) == (
        "training.dropout: scratchflow.trainer_script gives a parameter to the Trainer's TrainingArguments field "
        "of its name or to the script's --dropout flag, and train.py has neither"
    )


def test_the_launchers_words_are_the_pieces_variables_and_its_flag_parameters():
    environ = {"SCRATCHFLOW_DATA_FILE": "/scratch/news.csv"}
    assert expanded(["--data", "${SCRATCHFLOW_DATA_FILE}", "${HOME}"], environ) == [
        "--data",
        "/scratch/news.csv",
        "${HOME}",
    ]
    run = {"learning_rate": 0.1, "max_length": 48, "lowercase": True, "fp16_off": False}
    assert flag_words(run, {"--max-length", "--lowercase", "--fp16_off"}) == ["--lowercase", "--max-length", "48"]
    assert launched_script([*LAUNCHED, "train.py", "--data", "x"]) == "train.py"
    assert launched_script(["python", "train.py"]) is None


def test_metrics_are_the_figures_of_the_model_never_the_timings():
    evaluation = {"eval_loss": 0.5, "eval_accuracy": 0.9, "eval_runtime": 1.2, "eval_samples_per_second": 80.0}
    assert figures({**evaluation, "epoch": 3.0, "eval_model_preparation_time": 0.01}) == {
        "eval_loss": 0.5,
        "eval_accuracy": 0.9,
    }


def test_outside_scratchflow_every_helper_gives_back_what_it_is_given(monkeypatch):
    for name in ("SCRATCHFLOW_RUN_ID", "SCRATCHFLOW_DATA_FILE", "SCRATCHFLOW_MODEL_DIR", "SCRATCHFLOW_OUTPUT_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert trainer_script.data_file("data/news.csv") == "data/news.csv"
    assert trainer_script.model_dir("distilbert-base-uncased") == "distilbert-base-uncased"
    assert trainer_script.output_dir("final_model") == "final_model"
    assert trainer_script.resume_from(True) is True
    assert trainer_script.callbacks() == []
    assert trainer_script.training_arguments(output_dir="out", learning_rate=0.5).learning_rate == 0.5


def test_a_stop_signal_to_the_program_alone_is_left_for_the_piece_to_record_a_pause(tmp_path, monkeypatch):
    """The stop signal sent to the program's process only (by hand; on Slurm every process of the
    step gets it): the helpers save, pause, and leave the signal in the stop file, so that the piece
    records a pause, not a program that ended without metrics.json (a newcomer's retrain did)."""
    stop_file = tmp_path / "stop"
    monkeypatch.setenv("SCRATCHFLOW_RUN_ID", "r1")
    monkeypatch.setenv("SCRATCHFLOW_STOP_FILE", str(stop_file))
    monkeypatch.setenv("SCRATCHFLOW_STOP_SIGNAL", "USR1")
    monkeypatch.setattr(program, "_piece", None)
    handlers = {number: signal.getsignal(number) for number in program.stop_signals()}
    try:
        program.end_if_stopped()  # not asked: goes on
        os.kill(os.getpid(), signal.SIGUSR1)
        with pytest.raises(SystemExit) as ended:
            program.end_if_stopped()
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert ended.value.code == 0 and stop_file.read_text() == "SIGUSR1"


def test_only_the_pieces_saves_are_published_and_a_step_saved_at_a_stop_is_not_saved_again(tmp_path, monkeypatch):
    """The script's own saves (its save_strategy) stay on scratch: only the checkpoints the piece asks
    for are marked COMPLETE and published. After a stop mid-epoch the Trainer ends the epoch, and with
    save_strategy "epoch" saves the same step again: its files rewritten while the piece copies the
    checkpoint, COMPLETE already in it."""
    from transformers import TrainerControl, TrainerState

    monkeypatch.setenv("SCRATCHFLOW_RUN_ID", "script0000")
    monkeypatch.setenv("SCRATCHFLOW_STOP_FILE", str(tmp_path / "stop-requested"))
    monkeypatch.setattr(program, "_piece", None)
    with contextlib.ExitStack() as handlers:
        for number in (signal.SIGUSR1, signal.SIGTERM):  # the callbacks listen: put back after
            handlers.callback(signal.signal, number, signal.getsignal(number))
        callbacks = {type(callback).__name__: callback for callback in trainer_script.callbacks()}
    mark_complete, asking = callbacks["MarkComplete"], callbacks["StopWhenAsked"]
    state, control = TrainerState(global_step=6, is_world_process_zero=True), TrainerControl()
    arguments = type("Arguments", (), {"output_dir": str(tmp_path)})()
    (tmp_path / "checkpoint-3").mkdir()
    mark_complete.on_save(arguments, TrainerState(global_step=3, is_world_process_zero=True), control)
    assert not (tmp_path / "checkpoint-3" / "COMPLETE").exists(), "the script's own save: not published"
    (tmp_path / "checkpoint-6").mkdir()
    asking.asked_save_at = 6  # the stop's
    mark_complete.on_save(arguments, state, control)
    assert (tmp_path / "checkpoint-6" / "COMPLETE").is_file()
    control.should_save = True  # the Trainer's epoch-end save, after the stop's
    mark_complete.on_epoch_end(arguments, state, control)
    assert not control.should_save
    state.global_step, control.should_save = 7, True
    mark_complete.on_step_end(arguments, state, control)
    assert control.should_save, "a step not saved yet is saved"


# The lines the helper depth changes in the plain-PyTorch script (tests/trainer_script_lab/plain_train.py).
PLAIN_WITH_HELPERS = {
    "import torch\n": "import torch\nfrom scratchflow import program as scratchflow\n",
    "args = parser.parse_args()\n": "args = parser.parse_args(scratchflow.arguments(parser))\n",
    "frame = pd.read_csv(args.data)\n": "frame = pd.read_csv(scratchflow.data_file(args.data))\n",
    "if args.resume:\n    state = torch.load(args.resume)\n": (
        'if resume := scratchflow.resume_from(args.resume, "checkpoint.pt"):\n    state = torch.load(resume)\n'
    ),
    "    if step % args.save_every == 0 or step == steps:\n": (
        "    if scratchflow.checkpoint_due(step, steps, by_hand=step % args.save_every == 0 or step == steps):\n"
    ),
    '        torch.save({**state, "rng": torch.get_rng_state()}, args.checkpoint)\n': (
        '        scratchflow.save({**state, "rng": torch.get_rng_state()}, step, by_hand=args.checkpoint)\n'
    ),
    "torch.save(model.state_dict(), args.out)\n": "torch.save(model.state_dict(), scratchflow.output_file(args.out))\n",
    "    json.dump(metrics, file)\n": "    json.dump(metrics, file)\nscratchflow.write_metrics(metrics)\n",
}


def changed_lines(script: str, changes: dict[str, str]) -> tuple[str, int]:
    """`script` with `changes` made, and the most lines the diff removes or adds."""
    changed = script
    for line, replacement in changes.items():
        assert line in changed, line
        changed = changed.replace(line, replacement)
    diff = [
        line
        for line in difflib.unified_diff(script.splitlines(), changed.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return changed, max(len([line for line in diff if line.startswith(sign)]) for sign in "-+")


def test_a_plain_pytorch_script_with_its_helpers_paused_resumes_to_the_uninterrupted_weights(tmp_path):
    """The plain-PyTorch script, changed by at most 10 lines to use scratchflow.program, runs by hand
    as before, and under scratchflow pauses on the stop signal and resumes to the weights and
    metrics of the same run uninterrupted."""
    helped, lines = changed_lines((TRAINER_SCRIPT_LAB / "plain_train.py").read_text(), PLAIN_WITH_HELPERS)
    assert lines <= 10
    (tmp_path / "train.py").write_text(helped)
    data = REPO / "tests" / "plain_pytorch_lab" / "data" / "numbers.csv"
    by_hand = subprocess.run(
        [sys.executable, "train.py", "--data", str(data), "--epochs", "2"],
        cwd=tmp_path,
        env={**workflow_env(), "PYTHONPATH": str(REPO / "scripts")},
        capture_output=True,
        text=True,
    )
    assert by_hand.returncode == 0, by_hand.stderr
    assert {path.name for path in tmp_path.iterdir()} >= {"checkpoint.pt", "model.pt", "metrics.json"}, "as before"

    config = {
        "task": "command",
        "dataset": {"name": "numbers", "path": str(data), "format": "csv"},
        "training": {"command": ["python", "train.py"], "lr": 0.05, "epochs": 800, "seed": 3},
        "grid": {"seed": [3]},
        "aggregate": {"metric": "train_loss", "goal": "min"},
        "checkpointing": {"every_steps": 200, "keep": 2},
    }
    reference, paused = tmp_path / "uninterrupted", tmp_path / "paused"
    for workdir in (reference, paused):
        workdir.mkdir()
        (workdir / "train.py").write_text(helped)
        write_config(workdir, {**config, "cluster": {"scratch_root": str(workdir / "scratch")}})
    run_workflow(reference)
    paused_by_usr1_and_resumed(paused)
    for name in ("metrics.json", "model/model.pt"):
        assert (one_run(paused) / name).read_bytes() == (one_run(reference) / name).read_bytes(), name


def test_a_predict_output_becomes_the_runs_predictions_and_a_classifiers_confusion_matrix():
    from transformers.trainer_utils import PredictionOutput

    logits = np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [5.0, 0.0, 0.0]])
    classified = PredictionOutput(predictions=logits, label_ids=np.array([0, 1, 0, 0]), metrics={})
    table, detail = prediction_table(classified, {0: "business", 1: "sport", 2: "tech"})
    assert list(table["predicted"]) == ["business", "sport", "tech", "business"]
    assert list(table["label"]) == ["business", "sport", "business", "business"]
    assert detail["confusion_matrix"] == {
        "labels": ["business", "sport", "tech"],
        "rows_true_columns_predicted": [[2, 0, 1], [0, 1, 0], [0, 0, 0]],
    }
    assert table["confidence"].between(1 / 3, 1).all()
    # A regression's one output per row: the number itself, and no confusion matrix.
    regressed = PredictionOutput(predictions=np.array([[0.5], [1.5]]), label_ids=np.array([0.4, 1.7]), metrics={})
    table, detail = prediction_table(regressed, None)
    assert table.to_dict("list") == {"row": [0, 1], "label": [0.4, 1.7], "predicted": [0.5, 1.5]} and detail == {}
