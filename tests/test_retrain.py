"""What trained each run, shown; and training chosen runs again from zero: each record names its
task's code by sha256 (scratchflow.provenance.code_record), the status says which runs were trained
by other code or packages with the line that trains them again, and that line (scripts/retrain.py,
`make retrain`) releases those runs only, or refuses, releasing nothing."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NUMBERS, REPO, jobs_run, lab_pipeline, workflow_env
from scratchflow import verify
from scratchflow.plan import COMPARISON_OUTPUTS, Plan
from scratchflow.provenance import code_record, command_line, difference_lines

STATUS = REPO / "scripts" / "status.py"
RETRAIN = REPO / "scripts" / "retrain.py"
MARKER = "COMPLETE"
TASK_SOURCE = "def train(context):\n    return None\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def lab_task(folder: Path, source: str = TASK_SOURCE) -> Path:
    """A lab's task module ourlab.mlp beside its schema fragment, in `folder`."""
    write(folder / "ourlab" / "mlp.schema.yaml", "type: object\n")
    return write(folder / "ourlab" / "mlp.py", source)


def record(run_id: str, minute: int, code: dict | None, torch: str = "2.13.0", task: str = "ourlab.mlp") -> dict:
    """A run's record as a train job writes it: its task's code, what trained it, when it ended."""
    return {
        "run_id": run_id,
        "task": task,
        "environment": {
            "scratchflow_version": "0.2.0",
            "python": "3.11.7",
            "packages": {"torch": torch, "transformers": "5.24.0"},
            "finished_at": f"2026-11-27T10:{minute:02d}:00+0000",
        },
        **({"code": code} if code is not None else {}),
    }


def grid(workdir: Path, records: dict[str, dict], executor: str = "local", configfiles=(), **plan) -> None:
    """A grid the workflow has planned in `workdir`, its runs trained: a record, a model and metrics
    each, and a final checkpoint kept (checkpointing.keep_after_training); and compared, with each
    pack's files where runs are packed."""
    planned = Plan(
        {run_id: {"seed": 0} for run_id in records}, {}, None, "ourlab.mlp", "accuracy", "max", MARKER, **plan
    )
    planned.started(executor, configfiles).write(workdir)
    for output in planned.final_outputs():
        write(workdir / output, "")
    for run_id, written in records.items():
        write(workdir / "results" / "runs" / run_id / "record.json", written)
        write(workdir / "results" / "runs" / run_id / "metrics.json", {"accuracy": 0.9})
        write(workdir / "results" / "runs" / run_id / "model" / "weights.bin", "w")
        write(workdir / "checkpoints" / run_id / "checkpoint-40" / MARKER, "")


def status(workdir: Path, cwd: Path | None = None) -> list[str]:
    shown = subprocess.run(
        [sys.executable, STATUS, workdir], cwd=cwd or workdir, capture_output=True, text=True, check=True
    )
    return shown.stdout.splitlines()


def retrain(workdir: Path, *arguments: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, RETRAIN, *arguments], cwd=workdir, capture_output=True, text=True, env=env or workflow_env()
    )


def folders(workdir: Path) -> set[str]:
    """Every file and folder under the grid's results and checkpoints."""
    return {
        str(path.relative_to(workdir)) for root in ("results", "checkpoints") for path in (workdir / root).rglob("*")
    }


def test_a_labs_task_is_recorded_by_the_sha256_of_its_module_and_schema_fragment(tmp_path):
    module = lab_task(tmp_path)
    code = code_record("ourlab.mlp", module, {"learning_rate": 0.1})
    assert code["task"] == "ourlab.mlp" and code["folder"] == str(tmp_path)
    assert code["files"] == {"ourlab/mlp.py": sha256(TASK_SOURCE), "ourlab/mlp.schema.yaml": sha256("type: object\n")}
    module.write_text(TASK_SOURCE + "# tuned\n")
    edited = code_record("ourlab.mlp", module, {})
    assert edited["files"]["ourlab/mlp.py"] == sha256(TASK_SOURCE + "# tuned\n") and edited["sha256"] != code["sha256"]
    package = write(tmp_path / "ourlab" / "segment" / "__init__.py", TASK_SOURCE)
    write(package.with_suffix(".schema.yaml"), "type: object\n")
    assert set(code_record("ourlab.segment", package, {})["files"]) == {
        "ourlab/segment/__init__.py",
        "ourlab/segment/__init__.schema.yaml",
    }


def test_a_command_tasks_program_is_recorded_by_its_sha256_and_scratchflows_own_tasks_by_its_release(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.py", "print('training')\n")
    code = code_record("command", Path("unused"), {"command": ["python", "train.py", "--fast"]})
    assert code["files"] == {"train.py": sha256("print('training')\n")} and code["folder"] == str(tmp_path)
    launched = ["python", "-m", "scratchflow.trainer_script", "train.py", "--epochs", "3"]  # a lab's Trainer script
    assert code_record("command", Path("unused"), {"command": launched})["files"] == code["files"]
    for command in (["python", "-c", "print(1)"], ["true"]):  # inline code; a program on PATH
        assert code_record("command", Path("unused"), {"command": command})["files"] == {}
    builtin = code_record("text-classification", REPO / "scripts/scratchflow/tasks/text_classification.py", {})
    assert builtin == {"task": "text-classification", "folder": None, "files": {}, "sha256": None}


def test_runs_trained_by_an_earlier_version_of_the_labs_task_are_shown_with_the_line_that_retrains_them(tmp_path):
    module = lab_task(tmp_path)
    before = code_record("ourlab.mlp", module, {})
    module.write_text(TASK_SOURCE + "# a better loss\n")
    now = code_record("ourlab.mlp", module, {})
    grid(
        tmp_path, {"aaaa": record("aaaa", 1, before), "bbbb": record("bbbb", 2, now), "cccc": record("cccc", 3, before)}
    )
    lines = status(tmp_path)
    script = shlex.join([sys.executable, str(RETRAIN), "aaaa", "cccc"])
    verify = shlex.join([sys.executable, str(RETRAIN.with_name("verify.py")), "aaaa", "cccc"])
    edited = (
        f"  ourlab/mlp.py as it was before (sha256 {before['files']['ourlab/mlp.py'][:8]} ≠ now "
        f"{now['files']['ourlab/mlp.py'][:8]}) trained 2 of 3 runs: aaaa, cccc"
    )
    assert lines[-4:] == [
        "trained by other code or packages:",
        edited,
        f"  to train these 2 runs again from zero, and nothing else: {script}",
        "  or, to show that what changed changes no result (the cheapest trained again and compared, byte for "
        f"byte): {verify}",
    ]
    write(tmp_path / "Makefile", "retrain:  ## as scratchflow's and a lab's have it\n\techo\nverify:\n\techo\n")
    assert status(tmp_path)[-2].endswith(': make retrain RUNS="aaaa cccc"')
    assert status(tmp_path)[-1].endswith(': make verify RUNS="aaaa cccc"')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert status(tmp_path, cwd=elsewhere)[-2].endswith(f"{script} --dir {tmp_path}"), "run from another folder"

    # `make verify` found the edit reproduces a run's results: every run it flagged is told as verified.
    change = {"what": "ourlab/mlp.py", "was": before["files"]["ourlab/mlp.py"], "now": now["files"]["ourlab/mlp.py"]}
    write(
        tmp_path / "results" / "verified.json", json.dumps([{"run": "cccc", "on": "2026-11-29", "changes": [change]}])
    )
    assert status(tmp_path)[-2:] == [
        "trained by other code or packages, verified (make verify) to give the same results:",
        f"{edited}; verified: trained again with it, run cccc on 2026-11-29 gave the same weights, metrics and "
        "predictions, byte for byte",
    ]
    assert "trained by other code or packages:" not in status(tmp_path)
    module.write_text(TASK_SOURCE + "# a better loss, and then another edit\n")
    assert "trained by other code or packages:" in status(tmp_path), "an edit after the verification is flagged"

    # One that `make verify` found changes results: flagged, saying so, and verifying it is not offered again.
    edited_again = code_record("ourlab.mlp", module, {})["files"]["ourlab/mlp.py"]
    found = [
        {"run": "aaaa", "on": "2026-11-30", "changes": [{**change, "now": edited_again}], "differs": ["metrics.json"]}
    ]
    write(tmp_path / "results" / "verified.json", json.dumps(found))
    lines = status(tmp_path)
    assert lines[-2].endswith(
        "trained 3 of 3 runs: aaaa, bbbb, cccc; make verify found it changes results (run aaaa on 2026-11-30)"
    )
    assert lines[-1].endswith(': make retrain RUNS="aaaa bbbb cccc"'), "no make verify line"


def test_runs_trained_by_other_packages_are_told_against_the_newest_run(tmp_path):
    code = {"task": "text-classification", "folder": None, "files": {}, "sha256": None}
    records = {
        "aaaa": record("aaaa", 5, code, torch="2.12.0", task="text-classification"),
        "bbbb": record("bbbb", 9, code, task="text-classification"),
        "cccc": record("cccc", 7, code, task="text-classification"),
    }
    records["cccc"]["environment"]["python"] = "3.12.1"
    assert difference_lines(records, tmp_path, halving=False) == [
        "trained by other code or packages:",
        "  Python 3.12.1 trained 1 of 3 runs, 3.11.7 the newest: cccc",
        "  torch 2.12.0 trained 1 of 3 runs, 2.13.0 the newest: aaaa",
        "  to train these 2 runs again from zero, and nothing else: "
        + command_line("retrain", ["aaaa", "cccc"], tmp_path),
        "  or, to show that what changed changes no result (the cheapest trained again and compared, byte for "
        f"byte): {command_line('verify', ['aaaa', 'cccc'], tmp_path)}",
    ]
    change = {"what": "torch", "was": "2.12.0", "now": "2.13.0"}
    write(
        tmp_path / "results" / "verified.json", json.dumps([{"run": "aaaa", "on": "2026-11-29", "changes": [change]}])
    )
    assert difference_lines(records, tmp_path, halving=False) == [
        "trained by other code or packages:",
        "  Python 3.12.1 trained 1 of 3 runs, 3.11.7 the newest: cccc",
        f"  to train it again from zero, and nothing else: {command_line('retrain', ['cccc'], tmp_path)}",
        "  or, to show that what changed changes no result (the cheapest trained again and compared, byte for "
        f"byte): {command_line('verify', ['cccc'], tmp_path)}",
        "trained by other code or packages, verified (make verify) to give the same results:",
        "  torch 2.12.0 trained 1 of 3 runs, 2.13.0 the newest: aaaa; verified: trained again with it, run aaaa on "
        "2026-11-29 gave the same weights, metrics and predictions, byte for byte",
    ]
    assert (
        "  a halving search's runs are not trained again one by one: run the search again in a new directory"
    ) in difference_lines(records, tmp_path, halving=True)


def test_runs_trained_alike_are_not_told_and_records_from_before_the_code_was_recorded_are_said_unknown(tmp_path):
    module = lab_task(tmp_path)
    now = code_record("ourlab.mlp", module, {})
    assert difference_lines({"aaaa": record("aaaa", 1, now), "bbbb": record("bbbb", 2, now)}, tmp_path, False) == []
    assert difference_lines({"aaaa": {}, "bbbb": {"run_id": "bbbb"}}, tmp_path, False) == [], "records naming nothing"
    assert difference_lines({"aaaa": record("aaaa", 1, None), "bbbb": record("bbbb", 2, now)}, tmp_path, False) == [
        "trained by other code or packages:",
        "  1 of 2 runs record no sha256 of their task's code (trained before scratchflow recorded it; whether it "
        "has changed since is not known): aaaa",
    ]


def test_retrain_releases_the_named_runs_and_the_comparison_and_touches_no_other_run(tmp_path):
    """A grid whose jobs went to Slurm, two runs to a job: the runs are released with the comparison
    and their pack's files (else Snakemake would take the missing runs for intermediate files it need
    not make), then the command that submits the grid (after --) runs in the grid's directory; with
    none given, it says to submit the grid as before."""
    runs = ("aaaa", "bbbb", "cccc", "dddd")
    grid(tmp_path, {run_id: record(run_id, 1, None) for run_id in runs}, executor="slurm", pack_runs=2)
    compared = {*COMPARISON_OUTPUTS.values(), "results/packs/train-0.json", "results/packs/predict-0.json"}
    kept = {name for name in folders(tmp_path) if "aaaa" not in name and "bbbb" not in name and name not in compared}
    assert {"results/packs/train-1.json", "results/best_run.json", "checkpoints/cccc/checkpoint-40"} < folders(tmp_path)
    submit = write(tmp_path.parent / "submit.sh", '#!/bin/sh\necho "submitted in $(pwd): $*"\n')
    submit.chmod(0o755)
    env = {**workflow_env(), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}  # no squeue: none answers
    done = retrain(
        tmp_path.parent, "aaaa", "bbbb", "--dir", str(tmp_path), "--", str(submit), "--profile", "p", env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"scratchflow retrain: aaaa, bbbb released (checkpoints and results); training them from zero: {submit} "
        "--profile p",
        f"submitted in {tmp_path}: --profile p",
    ]
    assert folders(tmp_path) == kept
    grid(tmp_path, {"aaaa": record("aaaa", 1, None)}, executor="slurm")
    done = retrain(tmp_path, "aaaa", env=env)
    assert done.returncode == 0 and "submit it as before" in done.stdout and "aaaa" not in " ".join(folders(tmp_path))
    # A grid started with a config file of its own (--configfile) is trained again with it: the runs
    # released are its, not config/config.yaml's (a newcomer's retrain trained nothing).
    grid(tmp_path, {"aaaa": record("aaaa", 1, None)}, executor="slurm", configfiles=["/lab/config/long.yaml"])
    done = retrain(tmp_path, "aaaa", "--", str(submit), "--profile", "p", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"submitted in {tmp_path}: --profile p --configfile /lab/config/long.yaml"


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        ((), 'give the runs to train again: make retrain RUNS="<run id> …" (make status names them)'),
        (("aaaa", "dddd"), "no run dddd in the grid in {workdir} (make status lists its runs); nothing was released"),
        (("aaaa", "held"), "run held is being trained or predicted now (a job holds it: {holder}): wait for it"),
        (("aaaa", "queued"), "run queued is being trained or predicted now (Slurm job 17 pending (Priority)): wait"),
        (("aaaa", "--", "no-such-submit"), "no-such-submit is not found: nothing was released"),
    ],
    ids=["no runs", "a run not in the grid", "a run a live job holds", "a run with a queued job", "no such command"],
)
def test_retrain_refuses_in_one_line_and_releases_nothing(tmp_path, arguments, refusal):
    runs = ("aaaa", "held", "queued")
    grid(tmp_path, {run_id: record(run_id, 1, None) for run_id in runs}, executor="slurm")
    holder = {"host": os.uname().nodename, "pid": os.getpid(), "slurm_job_id": None}
    write(tmp_path / "checkpoints" / "held" / "running.json", holder)
    squeue = write(
        tmp_path.parent / "bin" / "squeue",
        f"#!/bin/sh\necho '17|PENDING|Priority||{tmp_path}|rule_train_wildcards_queued'\n",
    )
    squeue.chmod(0o755)
    before = folders(tmp_path)
    refused = retrain(tmp_path, *arguments, env={**workflow_env(), "PATH": f"{squeue.parent}:{os.environ['PATH']}"})
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("scratchflow retrain: " + refusal.format(workdir=tmp_path, holder=holder))
    assert len(refused.stderr.splitlines()) == 1 and folders(tmp_path) == before


def test_retrain_refuses_while_a_local_run_of_the_grid_is_active_and_in_a_halving_search(tmp_path):
    grid(tmp_path, {"aaaa": record("aaaa", 1, None)})
    lock = write(tmp_path / ".snakemake" / "run_local.flock", "")
    with open(lock) as held:  # as scripts/run_local.sh holds it while its run lives
        fcntl.flock(held, fcntl.LOCK_EX)
        refused = retrain(tmp_path, "aaaa")
    assert refused.returncode == 2 and "a run of the grid is active in" in refused.stderr
    grid(tmp_path, {"aaaa": record("aaaa", 1, None)}, rungs=[1, 2], keep=0.5)
    refused = retrain(tmp_path, "aaaa")
    assert refused.returncode == 2 and "holds a halving search" in refused.stderr
    assert (tmp_path / "results" / "runs" / "aaaa" / "record.json").is_file()


def test_make_retrain_runs_the_script_with_the_grids_directory_and_a_clusters_profile():
    planned = subprocess.run(
        ["make", "-n", "--no-print-directory", "retrain", "RUNS=aaaa bbbb", "DIR=runs/here", "PROFILE=profiles/narval"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.splitlines()[-1] == (
        f".venv/bin/python scripts/retrain.py aaaa bbbb --dir runs/here -- {REPO}/.venv/bin/snakemake "
        f"--snakefile {REPO}/Snakefile --profile {REPO}/profiles/narval"
    )


@pytest.mark.slow
def test_editing_a_labs_task_flags_the_runs_it_trained_and_the_line_given_retrains_those_only(tmp_path):
    """A lab's grid of two runs of its own plain-PyTorch task, their final checkpoints kept; the
    task's module edited. The status flags both runs with the line that trains them again; that line
    for the first run alone trains it from zero (not from its final checkpoint), with the task as it
    is now, and nothing else: the other run's record stays byte for byte, and the status then flags
    it alone."""
    config = {
        "task": "ourlab.mlp",
        "dataset": NUMBERS,
        "grid": {"learning_rate": [0.1, 0.2]},
        "checkpointing": {"keep_after_training": True},
        "cluster": {"scratch_root": str(tmp_path / "scratch")},
    }
    lab = lab_pipeline(tmp_path / "lab", "narval", config)
    first = subprocess.run(
        [lab / "scratchflow" / "scripts" / "run_local.sh"], cwd=lab, capture_output=True, text=True, env=workflow_env()
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    module = lab / "ourlab" / "mlp.py"
    module.write_text(module.read_text() + "# tuned\n")
    # Run from the lab's parent folder: the line holds the grid's directory (a lab's Makefile may have a
    # retrain target, whose line is `make retrain RUNS=…`).
    shown = status_of(lab, cwd=tmp_path)
    flagged, line = shown[-3], shown[-2]  # the last: how to verify instead
    runs = flagged.rsplit(": ", 1)[1].split(", ")
    assert len(runs) == 2 and flagged.startswith("  ourlab/mlp.py as it was before (sha256 ")
    command = line.split("again from zero, and nothing else: ", 1)[1]
    script = lab / "scratchflow" / "scripts" / "retrain.py"
    assert shlex.split(command) == [sys.executable, str(script), *runs, "--dir", str(lab)]
    kept = (lab / "results" / "runs" / runs[1] / "record.json").read_bytes()

    retrained = subprocess.run(  # as `make retrain` runs it: the environment's Python, not on PATH
        [sys.executable, script, runs[0], "--dir", lab],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**workflow_env(), "PATH": "/usr/bin:/bin"},
    )
    assert retrained.returncode == 0, retrained.stdout[-3000:] + retrained.stderr[-3000:]
    assert jobs_run(retrained.stdout + retrained.stderr) == {"train": 1, "predict": 1, "aggregate": 1, "all": 1}
    record = json.loads((lab / "results" / "runs" / runs[0] / "record.json").read_text())
    assert record["code"]["files"]["ourlab/mlp.py"] == hashlib.sha256(module.read_bytes()).hexdigest()
    assert [piece["resumed_from_step"] for piece in record["pieces"]] == [None], "from zero, not its final checkpoint"
    assert (lab / "results" / "runs" / runs[1] / "record.json").read_bytes() == kept
    assert status_of(lab, cwd=tmp_path)[-2].endswith(
        shlex.join([sys.executable, str(script), runs[1], "--dir", str(lab)])
    )
    summary = (lab / "results" / "summary.tsv").read_text().splitlines()
    assert summary[0].endswith("\ttrained_by_code") and len({row.split("\t")[-1] for row in summary[1:]}) == 2
    assert "The runs were trained by other code or packages" in (lab / "results" / "summary.html").read_text()


def status_of(workdir: Path, cwd: Path) -> list[str]:
    shown = subprocess.run(
        [sys.executable, workdir / "scratchflow" / "scripts" / "status.py", workdir],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return shown.stdout.splitlines()


def test_verify_trains_the_cheapest_finished_run_in_a_folder_of_the_grids_files_but_its_outputs(tmp_path):
    """scratchflow.verify's choices, before anything trains: the cheapest of the runs named (by the
    recorded training time), never a run not finished; the working folder links every entry of the
    grid's folder but what the workflow writes; the local runner, with the grid's config files."""
    records = {run_id: record(run_id, 1, None) for run_id in ("aaaa", "bbbb", "cccc")}
    for seconds, written in zip((30.0, 10.0, 5.0), records.values(), strict=True):
        written["timings_seconds"] = {"stage": 1.0, "train": seconds}
    records["cccc"]["outcome"] = "failed"
    grid(tmp_path, records, configfiles=["config/second.yaml"])
    plan = Plan.read(tmp_path)
    assert verify.chosen_run(tmp_path, plan, ["aaaa", "bbbb"]) == "bbbb"
    for runs, refusal in (
        ([], "give the runs to verify"),
        (["zzzz"], "no run zzzz in the grid"),
        (["aaaa", "cccc"], "run cccc has not finished training"),
    ):
        with pytest.raises(verify.VerifyRefused, match=refusal):
            verify.chosen_run(tmp_path, plan, runs)

    (tmp_path / "ourlab").mkdir()
    folder = verify.working_folder(tmp_path, "bbbb")
    linked = {entry.name for entry in folder.iterdir()}
    assert "ourlab" in linked and not linked & {"results", "checkpoints", "logs", ".snakemake"}
    assert (folder / "ourlab").resolve() == tmp_path / "ourlab"
    command = verify.training_command(tmp_path, plan, [], "bbbb")
    assert command[-3:] == ["--configfile", str(tmp_path / "config/second.yaml"), "results/runs/bbbb/metrics.json"]
    assert Path(command[0]).name == "run_local.sh"


def test_verify_compares_weights_metrics_and_predictions_byte_for_byte_and_names_what_changed(tmp_path):
    recorded, again = tmp_path / "recorded", tmp_path / "again"
    for folder in (recorded, again):
        write(folder / "model" / "weights.bin", "w")
        write(folder / "metrics.json", {"accuracy": 0.9})
        write(folder / "predictions.csv", "id,label\n1,a\n")
        write(folder / "record.json", {"took": str(folder)})  # where and when: never compared
    assert verify.what_differs(recorded, again) == []
    write(again / "model" / "weights.bin", "v")
    write(again / "predictions.csv", "id,label\n1,b\n")
    assert verify.what_differs(recorded, again) == ["model/weights.bin", "predictions.csv"]

    module = lab_task(tmp_path)
    then = record("aaaa", 1, code_record("ourlab.mlp", module, {}))
    module.write_text(TASK_SOURCE + "# renamed inside\n")
    now = record("aaaa", 2, code_record("ourlab.mlp", module, {}), torch="2.14.0")
    assert [(change["what"], change["was"], change["now"]) for change in verify.changes(then, now, tmp_path)] == [
        ("ourlab/mlp.py", then["code"]["files"]["ourlab/mlp.py"], now["code"]["files"]["ourlab/mlp.py"]),
        ("torch", "2.13.0", "2.14.0"),
    ]
