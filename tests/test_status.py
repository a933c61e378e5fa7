"""The grid's status, read from what the workflow writes: every state a run can be in."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scratchflow.checkpoints import write_contents
from scratchflow.plan import NoPlan, Plan
from scratchflow.status import RunStatus, SlurmJob, current_status, render, rung_line, slurm_jobs, summary_line

STATUS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "status.py"
STAMP = "%Y-%m-%dT%H:%M:%S%z"
MARKER = "COMPLETE"


def statuses_in(workdir: Path, jobs: dict[tuple[str, str], SlurmJob] | None = None) -> list[RunStatus]:
    """Every run's status in `workdir`, with Slurm's `jobs` where given."""
    return current_status(workdir, jobs)[0]


def write(path: Path, content) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))


def piece(number: int, outcome: str, started: float) -> dict:
    return {"piece": number, "outcome": outcome, "started_at": time.strftime(STAMP, time.localtime(started))}


def write_grid(workdir: Path, runs: dict, metric: str, goal: str, executor: str) -> None:
    """The grid file the workflow writes when it starts."""
    plan = Plan(runs, {}, None, "command", metric, goal, checkpoint_marker=MARKER)
    plan.started(executor).write(workdir)


def checkpoint(folder: Path) -> Path:
    """A complete checkpoint (holding the task's marker)."""
    folder.mkdir(parents=True)
    (folder / MARKER).touch()
    return folder


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def grid_in_every_state(workdir: Path) -> None:
    now = time.time()
    runs = [
        "finished00",
        "predicts00",
        "predfail00",
        "trains0000",
        "starting00",
        "paused0000",
        "killed0000",
        "failed0000",
        "waits00000",
    ]
    write_grid(workdir, {run_id: {"seed": 0} for run_id in runs}, "accuracy", "max", "local")
    results, checkpoints = workdir / "results" / "runs", workdir / "checkpoints"
    write(results / "finished00" / "metrics.json", {"accuracy": 0.91234, "macro_f1": 0.9})
    for run_id in ("finished00", "predicts00", "predfail00"):
        write(results / run_id / "record.json", {})
    write(
        workdir / "logs" / "predict" / "predfail00.log",
        "2026-11-22 10:00:00,000 ERROR scratchflow: job failed: OSError: No space left on device\n",
    )
    me = {"host": os.uname().nodename, "pid": os.getpid(), "slurm_job_id": None}
    write(
        checkpoints / "trains0000" / "pieces.json",
        [piece(1, "TrainingStopped: x", now - 600), piece(2, "running", now - 60)],
    )
    write(checkpoints / "trains0000" / "running.json", me)
    write(
        checkpoints / "trains0000" / "progress.json",
        {"step": 120, "max_steps": 280, "loss": 0.5, "samples_per_second": 152.34, "seconds_left": 75, "at": now - 3},
    )
    write(checkpoints / "starting00" / "pieces.json", [piece(1, "running", now - 5)])
    write(checkpoints / "starting00" / "running.json", me)
    stopped = {**piece(1, "paused", now - 900), "signal": "SIGUSR1", "phase": "training", "reached_step": 40}
    write(checkpoints / "paused0000" / "pieces.json", [stopped])
    checkpoint(checkpoints / "paused0000" / "checkpoint-40")
    write(checkpoints / "killed0000" / "pieces.json", [piece(1, "running", now - 900)])
    write(checkpoints / "killed0000" / "running.json", {**me, "pid": dead_pid()})
    for step in (20, 60):
        checkpoint(checkpoints / "killed0000" / f"checkpoint-{step}")
    write(checkpoints / "failed0000" / "pieces.json", [piece(1, "ValueError: the loss is NaN\nmore", now - 900)])


def by_id(statuses):
    return {status.run_id: status for status in statuses}


def test_every_state_a_run_can_be_in_is_told_with_what_to_do_next(tmp_path):
    grid_in_every_state(tmp_path)
    statuses = by_id(statuses_in(tmp_path))

    assert {run_id: status.state for run_id, status in statuses.items()} == {
        "finished00": "finished",
        "predicts00": "predicts",
        "predfail00": "failed",
        "trains0000": "trains",
        "starting00": "trains",
        "paused0000": "paused",
        "killed0000": "interrupted",
        "failed0000": "failed",
        "waits00000": "waits",
    }
    assert statuses["finished00"].detail == "test accuracy 0.9123"
    assert statuses["predfail00"].detail == "prediction failed: OSError: No space left on device"
    assert statuses["predfail00"].log == "logs/predict/predfail00.log"
    trains = statuses["trains0000"].detail
    assert trains.startswith("piece 2, step 120 of 280 (43%), 152.3 samples/s, 1 min 15 s left at that speed")
    assert re.fullmatch(r"piece 1, running for [56] s; no checkpoint yet", statuses["starting00"].detail)
    assert statuses["paused0000"].detail == (
        "piece 1 stopped on SIGUSR1 at step 40 and paused; the next piece resumes from checkpoint-40"
    )
    assert statuses["killed0000"].detail == "piece 1 was killed; the next piece resumes from checkpoint-60"
    assert statuses["failed0000"].detail == "piece 1: ValueError: the loss is NaN"
    assert statuses["failed0000"].log == "logs/train/failed0000.log"
    assert summary_line(list(statuses.values())) == (
        "9 runs: 1 finished, 1 predicts, 2 trains, 1 paused, 1 interrupted, 1 waits, 2 failed"
    )


def test_a_halving_search_tells_its_rung_and_which_runs_it_stopped(tmp_path):
    """Rungs of 1, 2 and 4 epochs; the decision after rung 0 sent two of three runs on: one has
    trained rung 1 and waits for its decision, the other trains it (in a Slurm job of rule train_rung)."""
    runs = {run_id: {"seed": 0} for run_id in ("stopped000", "rungdone00", "inrung0000")}
    plan = Plan(runs, {}, None, "command", "macro_f1", "max", checkpoint_marker=MARKER, rungs=[1, 2, 4], keep=0.5)
    plan.started("local").write(tmp_path)  # the Slurm job below is given, not asked for
    write(
        tmp_path / "results" / "search" / "rung-0.json",
        {
            "rung": 0,
            "epochs": 1,
            "metric": "macro_f1",
            "values": {"stopped000": 0.41, "rungdone00": 0.72, "inrung0000": 0.65},
            "ranking": [{"promoted": True}, {"promoted": True}, {"promoted": False}],
            "promoted": ["rungdone00", "inrung0000"],
        },
    )
    write(tmp_path / "results" / "runs" / "rungdone00" / "rung-1.json", {"epochs": 2, "validation": {"macro_f1": 0.8}})
    jobs = {("train", "inrung0000"): SlurmJob("21", "PENDING", "Priority", "")}
    statuses = by_id(statuses_in(tmp_path, jobs))
    assert statuses["stopped000"].state == "stopped"
    assert statuses["stopped000"].detail == (
        "rung 0 (1 epochs): validation macro_f1 0.4100; not among the 2 of 3 settings that went on"
    )
    assert (statuses["rungdone00"].state, statuses["rungdone00"].detail) == (
        "waits",
        "rung 1 (2 epochs) trained, validation macro_f1 0.8000; waits for the rung's decision",
    )
    assert statuses["inrung0000"].detail == "rung 1 (2 epochs): not started yet (Slurm job 21 pending (Priority))"
    assert rung_line(plan, plan.decisions(tmp_path)) == (
        "successive halving: rung 1 of rungs 0 to 2 (2 epochs), 2 of 3 runs in it"
    )
    shown = subprocess.run([sys.executable, STATUS_SCRIPT, tmp_path], capture_output=True, text=True).stdout
    assert "successive halving: rung 1 of rungs 0 to 2" in shown and "1 stopped" in shown.splitlines()[-1]


def test_slurm_says_which_runs_are_queued_and_where_they_run(tmp_path):
    grid_in_every_state(tmp_path)
    jobs = {
        ("train", "waits00000"): SlurmJob("101", "PENDING", "Resources", ""),
        ("train", "paused0000"): SlurmJob("102", "PENDING", "BeginTime", ""),
        ("predict", "predicts00"): SlurmJob("103", "RUNNING", "None", "n1"),
        ("train", "failed0000"): SlurmJob("104", "PENDING", "Priority", ""),
    }
    statuses = by_id(statuses_in(tmp_path, jobs))
    assert statuses["waits00000"].detail == "not started yet (Slurm job 101 pending (Resources))"
    assert statuses["paused0000"].detail.endswith("resumes from checkpoint-40 (Slurm job 102 pending (BeginTime))")
    assert statuses["predicts00"].detail == "trained; prediction: Slurm job 103 running on n1"
    assert (statuses["failed0000"].state, statuses["failed0000"].detail) == (
        "waits",
        "piece 1 failed; a retry starts again from step 0 (Slurm job 104 pending (Priority))",
    )


def test_a_holder_whose_slurm_job_is_gone_is_not_training(tmp_path):
    write_grid(tmp_path, {"gone000000": {}}, "accuracy", "max", "local")
    folder = tmp_path / "checkpoints" / "gone000000"
    write(folder / "pieces.json", [piece(1, "running", time.time() - 60)])
    write(folder / "running.json", {"host": "node7", "pid": 1, "slurm_job_id": "77"})
    (status,) = statuses_in(tmp_path, jobs={})
    assert status.state == "interrupted"
    (status,) = statuses_in(tmp_path, jobs={("train", "gone000000"): SlurmJob("77", "RUNNING", "None", "n2")})
    assert status.state == "trains"


def test_a_packed_run_trains_in_the_job_of_its_pack(tmp_path):
    """cluster.pack_runs: the Slurm job is the pack's (no run in its comment); the run's checkpoints
    name it, so the run trains there, and is interrupted once that job is gone."""
    write_grid(tmp_path, {"packed0000": {}}, "accuracy", "max", "slurm")
    folder = tmp_path / "checkpoints" / "packed0000"
    write(folder / "pieces.json", [piece(1, "running", time.time() - 60)])
    write(folder / "running.json", {"host": "n1", "pid": 1, "slurm_job_id": "88"})
    (status,) = statuses_in(tmp_path, jobs={("packed_train", "88"): SlurmJob("88", "RUNNING", "None", "n1")})
    assert status.state == "trains"
    assert re.fullmatch(
        r"piece 1, running for 1 min 0[01] s; no checkpoint yet \(Slurm job 88 running on n1\)", status.detail
    )
    (status,) = statuses_in(tmp_path, jobs={("packed_train", "89"): SlurmJob("89", "PENDING", "Resources", "")})
    assert status.state == "interrupted"


def test_the_squeue_listing_is_read_by_rule_and_run_of_this_directory_only(tmp_path):
    """The same grid in another directory has the same run ids: its jobs are not this grid's."""
    here, elsewhere = tmp_path / "grid", tmp_path / "copy-of-the-grid"
    squeue = tmp_path / "squeue"
    squeue.write_text(
        "#!/bin/sh\n"
        f"echo '11|PENDING|Resources||{here}|rule_train_wildcards_aaaaaaaaaa'\n"
        f"echo '12|RUNNING|None|n2|{here}/|rule_predict_wildcards_bbbbbbbbbb'\n"
        f"echo '13|RUNNING|None|n1|{here}|an interactive job'\n"
        f"echo '14|RUNNING|None|n1|{here}|rule_packed_train'\n"
        f"echo '15|RUNNING|None|n1|{here}|rule_train_rung_wildcards_cccccccccc_1'\n"
        f"echo '16|RUNNING|None|n2|{elsewhere}|rule_train_wildcards_aaaaaaaaaa'\n"
        f"echo '17|RUNNING|None|n2|{elsewhere}|rule_predict_wildcards_dddddddddd'\n"
    )
    squeue.chmod(0o755)
    assert slurm_jobs(here, str(squeue)) == {
        ("train", "cccccccccc"): SlurmJob("15", "RUNNING", "None", "n1"),  # a halving search's rung
        ("train", "aaaaaaaaaa"): SlurmJob("11", "PENDING", "Resources", ""),
        ("predict", "bbbbbbbbbb"): SlurmJob("12", "RUNNING", "None", "n2"),
        ("packed_train", "14"): SlurmJob("14", "RUNNING", "None", "n1"),
    }
    assert slurm_jobs(elsewhere, str(squeue)) == {
        ("train", "aaaaaaaaaa"): SlurmJob("16", "RUNNING", "None", "n2"),
        ("predict", "dddddddddd"): SlurmJob("17", "RUNNING", "None", "n2"),
    }


def test_the_status_changes_nothing(tmp_path):
    grid_in_every_state(tmp_path)
    before = sorted((path, path.stat().st_mtime_ns) for path in tmp_path.rglob("*"))
    render(statuses_in(tmp_path))
    assert sorted((path, path.stat().st_mtime_ns) for path in tmp_path.rglob("*")) == before


def test_the_command_prints_every_run_and_a_total_line(tmp_path):
    grid_in_every_state(tmp_path)
    shown = subprocess.run([sys.executable, STATUS_SCRIPT, tmp_path], capture_output=True, text=True, check=True)
    lines = shown.stdout.splitlines()
    assert lines[-2].startswith("9 runs: 1 finished")
    assert lines[-1].startswith("spent so far: no Slurm accounting: GPU-hours not known, "), "the pieces' clocks"
    assert "log: logs/train/failed0000.log" in shown.stdout
    assert sum(line.startswith(("finished00", "paused0000", "waits00000")) for line in lines) == 3


def test_where_no_grid_exists_the_command_says_so_and_fails(tmp_path):
    with pytest.raises(NoPlan, match=r"results/plan\.json is missing"):
        statuses_in(tmp_path)
    shown = subprocess.run([sys.executable, STATUS_SCRIPT, tmp_path], capture_output=True, text=True)
    assert shown.returncode == 2
    assert f"no grid or search in {tmp_path}" in shown.stderr
    # A workflow's folder whose grid never started (a newcomer's first `make status`): not "elsewhere".
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("task: command\n")
    with pytest.raises(
        NoPlan, match=r"no grid or search has started in .* yet .* start it \(a lab's pipeline: make run"
    ):
        statuses_in(tmp_path)


def test_a_run_whose_program_reports_no_progress_is_told_by_its_newest_checkpoint(tmp_path):
    """A command task's program writes checkpoints but no progress lines: the status says what is
    known, how long the piece has run and its newest checkpoint's step and age, not a guess."""
    now = time.time()
    write_grid(tmp_path, {"command000": {}, "resumed000": {}}, "test_loss", "min", "local")
    me = {"host": os.uname().nodename, "pid": os.getpid(), "slurm_job_id": None}
    for run_id in ("command000", "resumed000"):
        folder = tmp_path / "checkpoints" / run_id
        write(folder / "pieces.json", [piece(1, "TrainingStopped: x", now - 3600), piece(2, "running", now - 600)])
        write(folder / "running.json", me)
        marker = checkpoint(folder / "checkpoint-1000") / MARKER
        os.utime(marker, (now - 700, now - 700))  # saved by piece 1
    saved = checkpoint(tmp_path / "checkpoints" / "command000" / "checkpoint-1100") / MARKER
    os.utime(saved, (now - 30, now - 30))
    # Not complete (no marker): copied or written now, not yet a checkpoint to tell of.
    (tmp_path / "checkpoints" / "command000" / "checkpoint-1200").mkdir()
    statuses = by_id(statuses_in(tmp_path))
    # The pieces' start is recorded to the second.
    running = r"piece 2, running for 10 min 0[01] s; "
    assert re.fullmatch(running + "newest checkpoint-1100, saved 30 s ago", statuses["command000"].detail)
    assert re.fullmatch(running + "resumed from checkpoint-1000, none saved since", statuses["resumed000"].detail)


def test_a_stopped_or_killed_piece_points_at_its_own_log(tmp_path):
    now = time.time()
    write_grid(tmp_path, {"paused0000": {}, "killed0000": {}}, "accuracy", "max", "local")
    stopped = {**piece(2, "TrainingStopped: stopped on SIGUSR1 at step 40 and paused; saved", now), "log": "L2"}
    write(tmp_path / "checkpoints" / "paused0000" / "pieces.json", [piece(1, "killed", now - 60), stopped])
    write(tmp_path / "checkpoints" / "killed0000" / "pieces.json", [{**piece(1, "running", now), "log": "L1"}])
    statuses = by_id(statuses_in(tmp_path))
    assert (statuses["paused0000"].state, statuses["paused0000"].log) == ("paused", "L2")
    assert (statuses["killed0000"].state, statuses["killed0000"].log) == ("interrupted", "L1")


@pytest.mark.parametrize("outcome", ["interrupted", "KeyboardInterrupt: "])  # the second: records before 0.4
def test_a_piece_that_ctrl_c_ended_is_interrupted_and_the_next_resumes_from_its_newest_checkpoint(tmp_path, outcome):
    """Ctrl-C on this machine reaches the training job too (one process group): its piece ends as
    interrupted, its checkpoints on shared storage stay, and the same command resumes."""
    write_grid(tmp_path, {"ctrlc00000": {}}, "accuracy", "max", "local")
    folder = tmp_path / "checkpoints" / "ctrlc00000"
    write(folder / "pieces.json", [{**piece(1, outcome, time.time() - 60), "log": "L1"}])
    checkpoint(folder / "checkpoint-80")
    (status,) = statuses_in(tmp_path)
    assert (status.state, status.log) == ("interrupted", "L1")
    assert status.detail == "piece 1 was interrupted by Ctrl-C; the next piece resumes from checkpoint-80"


def test_a_piece_whose_job_slurm_requeued_is_told_preempted_or_its_node_lost(tmp_path, monkeypatch):
    """A preempted job waits in the queue under its own id (sacct says why) until its next piece
    starts, whether its piece saved or was killed before it could (its record still says running,
    its job holds the run: before, that read "trains"); a job that lost its node is recorded so by
    its next piece."""
    causes = {"102": "preempted", "104": "preempted"}
    monkeypatch.setattr("scratchflow.status.requeue_cause", lambda job_id: causes[job_id])
    now = time.time()
    write_grid(tmp_path, {"preempted0": {}, "nodefail00": {}, "cutshort00": {}}, "accuracy", "max", "slurm")
    stopped = "TrainingStopped: stopped on SIGTERM at step 40 and paused; saved"
    write(tmp_path / "checkpoints" / "preempted0" / "pieces.json", [{**piece(1, stopped, now), "slurm_job_id": "102"}])
    checkpoint(tmp_path / "checkpoints" / "preempted0" / "checkpoint-40")
    lost = {**piece(1, "killed by SIGTERM", now), "slurm_job_id": "103", "requeued": "node failure"}
    write(tmp_path / "checkpoints" / "nodefail00" / "pieces.json", [lost])
    cut_short = tmp_path / "checkpoints" / "cutshort00"
    write(cut_short / "pieces.json", [{**piece(1, "running", now), "slurm_job_id": "104"}])
    write(cut_short / "running.json", {"slurm_job_id": "104", "host": "n1", "pid": 7})
    checkpoint(cut_short / "checkpoint-20")
    jobs = {
        ("train", "preempted0"): SlurmJob("102", "PENDING", "BeginTime", ""),
        ("train", "cutshort00"): SlurmJob("104", "PENDING", "BeginTime", ""),
    }
    statuses = by_id(statuses_in(tmp_path, jobs))
    assert (statuses["cutshort00"].state, statuses["cutshort00"].detail) == (
        "interrupted",
        "piece 1 was killed (preempted: Slurm requeued its job); the next piece resumes from checkpoint-20 "
        "(Slurm job 104 pending (BeginTime))",
    )
    assert statuses["preempted0"].detail == (
        "piece 1 stopped on SIGTERM at step 40 and paused (preempted: Slurm requeued its job); "
        "the next piece resumes from checkpoint-40 (Slurm job 102 pending (BeginTime))"
    )
    assert statuses["nodefail00"].detail == (
        "piece 1 was killed by SIGTERM (node failure: Slurm requeued its job); the next piece starts again from step 0"
    )


def test_a_damaged_checkpoint_is_shown_with_what_is_wrong_and_where_the_next_piece_resumes(tmp_path):
    """The newest checkpoint's file shorter than it was saved (a user's rm, a full disk, a filesystem
    fault), and one set aside by an earlier job: both named, and the next piece's resume point is
    the newest intact one."""
    now = time.time()
    write_grid(tmp_path, {"paused0000": {}}, "accuracy", "max", "local")
    folder = tmp_path / "checkpoints" / "paused0000"
    write(folder / "pieces.json", [piece(1, "TrainingStopped: stopped on SIGUSR1 at step 60 and paused; saved", now)])
    for step in (20, 40, 60):
        (checkpoint(folder / f"checkpoint-{step}") / "state.pt").write_text("weights")
        write_contents(folder / f"checkpoint-{step}")
    (folder / "checkpoint-60" / "state.pt").write_text("w")
    (folder / "checkpoint-40").rename(folder / "checkpoint-40.damaged")
    (folder / "checkpoint-40.damaged" / "damage.txt").write_text("state.pt is missing\n")
    (status,) = statuses_in(tmp_path)
    assert status.detail.endswith(
        "the next piece resumes from checkpoint-20 (checkpoint-40 is damaged: state.pt is missing; "
        "checkpoint-60 is damaged: state.pt has 1 bytes where 7 were saved)"
    ), status.detail


def test_the_spend_so_far_and_what_the_rest_will_cost_at_the_finished_runs_mean(tmp_path):
    """Two runs finished (an hour's training on 2 threads and a minute's prediction on 4 each: 2.07
    CPU-hours), one paused after half an hour with no checkpoint (1, lost) and one not started: 5.13
    CPU-hours spent so far, 19% lost; the two not finished at the finished runs' mean less the one
    spent: about 3.13 more. Without Slurm no GPU figure."""
    hour_ago = time.time() - 3600
    write_grid(
        tmp_path,
        {run_id: {"seed": 0} for run_id in ("done000000", "done111111", "half000000", "wait000000")},
        "macro_f1",
        "max",
        "local",
    )
    for run_id in ("done000000", "done111111"):
        trained = {
            **piece(1, "finished", hour_ago - 3600),
            "ended_at": time.strftime(STAMP, time.localtime(hour_ago)),
            "threads": 2,
        }
        write(tmp_path / f"results/runs/{run_id}/record.json", {"pieces": [trained]})
        write(tmp_path / f"results/runs/{run_id}/metrics.json", {"macro_f1": 0.8})
        finished = time.strftime(STAMP, time.localtime(hour_ago + 60))
        write(
            tmp_path / f"results/runs/{run_id}/predict_record.json",
            {"threads": 4, "timings_seconds": {"predict": 60}, "environment": {"finished_at": finished}},
        )
    half = {
        **piece(1, "TrainingStopped: stopped on SIGUSR1 at step 50; paused", hour_ago - 1800),
        "ended_at": time.strftime(STAMP, time.localtime(hour_ago)),
        "threads": 2,
    }
    write(tmp_path / "checkpoints/half000000/pieces.json", [half])
    spend = spend_shown(tmp_path)
    assert spend.startswith(
        "spent so far: no Slurm accounting: GPU-hours not known, 5.13 CPU-hours (19% lost to faults)"
    )
    assert spend.endswith("the 2 run(s) not finished: about 3.13 CPU-hours more, at the finished runs' mean")


def test_a_piece_a_newer_one_took_the_run_from_is_said_superseded_while_the_newer_trains(tmp_path):
    """The superseded piece's own note (scratchflow.lease) is what the status reads: pieces.json is
    the newer piece's, which closed the older as killed when it took the run."""
    write_grid(tmp_path, {"taken00000": {}}, "accuracy", "max", "local")
    folder, now = tmp_path / "checkpoints" / "taken00000", time.time()
    write(folder / "pieces.json", [{**piece(1, "killed", now - 600), "epoch": 1}, piece(2, "running", now - 60)])
    write(folder / "running.json", {"host": os.uname().nodename, "pid": os.getpid(), "slurm_job_id": None})
    (status,) = statuses_in(tmp_path)
    assert "superseded" not in status.detail, "killed, as far as anyone knows yet"
    write(folder / "lease" / "000001.superseded", {**piece(1, "superseded", now - 600), "epoch": 1})
    (status,) = statuses_in(tmp_path)
    assert status.state == "trains"
    assert status.detail.endswith("; piece 1 superseded (trained on after a newer piece took the run over)")


def test_the_spend_counts_a_superseded_piece_to_its_noted_end_not_as_killed(tmp_path):
    """An unfinished run whose piece 1 (started an hour ago) a newer piece took over 50 minutes ago,
    while piece 1 trained on for 30 more minutes (its end noted beside its term): the spend reads the
    pieces through the ledger, 40 + 50 minutes of 2 threads (3 CPU-hours, piece 1's 1.33 lost), not
    piece 1 closed as killed when piece 2 took the run (10 + 50 minutes: 2 CPU-hours)."""
    now = time.time()
    write_grid(tmp_path, {"taken00000": {}}, "accuracy", "max", "local")
    folder = tmp_path / "checkpoints" / "taken00000"
    old = {**piece(1, "killed", now - 3600), "threads": 2, "term": 1}
    newer = {**piece(2, "finished", now - 3000), "threads": 2, "term": 2, "ended_at": time.strftime(STAMP)}
    write(folder / "pieces.json", [old, newer])
    ended = time.strftime(STAMP, time.localtime(now - 1200))
    write(folder / "lease" / "000001.superseded", {**old, "outcome": "superseded", "ended_at": ended})
    spend = spend_shown(tmp_path)
    assert spend.startswith("spent so far: no Slurm accounting: GPU-hours not known, 3 CPU-hours (44% lost"), spend


def spend_shown(workdir: Path) -> str:
    """The spend line `scripts/status.py` shows last."""
    shown = subprocess.run([sys.executable, STATUS_SCRIPT, workdir], capture_output=True, text=True, check=True)
    return shown.stdout.splitlines()[-1]
