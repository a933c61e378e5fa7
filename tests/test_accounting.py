"""What a grid cost (scratchflow.accounting): sacct's answer read as the Slurm 22.05 of the test
cluster writes it, each job's time shared out to the runs that held it, and the part faults threw
away; figures a site does not record are None, never 0. The same on the test Slurm, against sacct's
own figures: tests/test_slurm_faults.py (packed runs, a halving search, a stopped and resumed run)."""

from __future__ import annotations

import time

import pytest
from scratchflow.accounting import (
    Cost,
    Site,
    Use,
    costs,
    described,
    grid_cost,
    parse_sacct,
    training_uses,
)
from scratchflow.ledger import TIME_FORMAT

TRACKING_GPUS = Site(gpus=True, energy=False, gpu_utilisation=False)


def stamp(seconds: float) -> str:
    return time.strftime(TIME_FORMAT, time.localtime(seconds))


def sacct_time(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


T0 = time.mktime((2026, 11, 26, 12, 0, 0, 0, 0, -1))


def sacct_lines(*jobs: tuple[str, str, float, float | None, str, str]) -> str:
    """sacct --duplicates -n -P -o JobIDRaw,State,Start,End,ElapsedRaw,AllocTRES,ConsumedEnergyRaw,
    TRESUsageInAve: each job's line, then its batch step's."""
    lines = []
    for job_id, state, start, end, allocated, usage in jobs:
        elapsed = int((end or T0 + 10_000) - start)
        ended = sacct_time(end) if end else "Unknown"
        lines.append(f"{job_id}|{state}|{sacct_time(start)}|{ended}|{elapsed}|{allocated}|0|")
        lines.append(f"{job_id}.batch|{state}|{sacct_time(start)}|{ended}|{elapsed}|{allocated}|0|{usage}")
    return "\n".join(lines) + "\n"


def test_sacct_is_read_with_gpus_where_the_site_tracks_them_and_none_where_it_does_not():
    listed = sacct_lines(
        ("41", "COMPLETED", T0, T0 + 3600, "billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64G,node=1", "energy=0"),
    )
    (job,) = parse_sacct(listed, TRACKING_GPUS)["41"]
    assert (job.cpus, job.gpus, job.elapsed_seconds, job.end - job.start) == (8, 2, 3600, 3600)
    assert job.energy_joules is None, "sacct's 0 without an energy plugin is not recorded, not no energy"
    (untracked,) = parse_sacct(listed, Site(gpus=False, energy=False, gpu_utilisation=False))["41"]
    assert untracked.gpus is None


def test_the_site_says_what_it_records_in_its_configuration():
    shown = (
        "AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,gres/gpumem,gres/gpuutil\n"
        "AcctGatherEnergyType    = acct_gather_energy/ipmi\n"
    )
    assert Site.from_config(shown) == Site(gpus=True, energy=True, gpu_utilisation=True)
    bare = "AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages\n"
    assert Site.from_config(bare) == Site(gpus=False, energy=False, gpu_utilisation=False)


def test_gpu_utilisation_and_memory_come_from_the_longest_step_where_recorded():
    site = Site(gpus=True, energy=True, gpu_utilisation=True)
    listed = (
        f"7|COMPLETED|{sacct_time(T0)}|{sacct_time(T0 + 100)}|100|cpu=4,gres/gpu=1,mem=8G|360000|\n"
        f"7.batch|COMPLETED|{sacct_time(T0)}|{sacct_time(T0 + 100)}|100|cpu=4|0|cpu=00:00:01,gres/gpuutil=3\n"
        f"7.0|COMPLETED|{sacct_time(T0)}|{sacct_time(T0 + 90)}|90|cpu=4|0|gres/gpumem=2048M,gres/gpuutil=87\n"
    )
    (job,) = parse_sacct(listed, site)["7"]
    assert (job.gpu_utilisation_percent, job.gpu_memory_mb, job.energy_joules) == (3.0, None, 360000.0)


def piece(number: int, job: str | None, start: float, end: float | None, outcome: str, checkpoint_at=None, **more):
    return {
        "piece": number,
        "slurm_job_id": job,
        "started_at": stamp(start),
        "ended_at": stamp(end) if end else None,
        "outcome": outcome,
        "last_checkpoint_at": stamp(checkpoint_at) if checkpoint_at else None,
        "threads": more.pop("threads", 1),
        "world_size": more.pop("world_size", 1),
        **more,
    }


def test_a_requeued_jobs_two_runs_each_go_to_the_piece_they_held_and_a_kill_loses_what_followed_its_checkpoint():
    """Job 12 preempted without grace (Slurm requeued it, one sacct record each run): its first run,
    an hour on 2 GPUs, published its last checkpoint after 45 minutes, so a quarter of it was lost;
    its second run, 30 minutes, finished."""
    listed = sacct_lines(
        ("12", "PREEMPTED", T0, T0 + 3600, "cpu=4,gres/gpu=2,mem=8G,node=1", ""),
        ("12", "COMPLETED", T0 + 3700, T0 + 5500, "cpu=4,gres/gpu=2,mem=8G,node=1", ""),
    )
    jobs = parse_sacct(listed, TRACKING_GPUS)
    pieces = [
        piece(1, "12", T0 + 5, None, "killed", checkpoint_at=T0 + 5 + (3600 - 5) * 0.75),
        piece(2, "12", T0 + 3705, T0 + 5495, "finished"),
    ]
    cost_of = costs(training_uses("r1", pieces), jobs)
    first, second = cost_of.values()
    assert first.gpu_hours == pytest.approx(2.0) and first.cpu_hours == pytest.approx(4.0)
    assert first.lost_gpu_hours == pytest.approx(0.5, rel=0.01)
    assert second.gpu_hours == pytest.approx(1.0) and second.lost_gpu_hours == 0


def test_a_superseded_piece_loses_what_followed_its_last_checkpoint_and_leaves_the_next_run_of_its_job_alone():
    """Job 12's node stopped answering after an hour on 2 GPUs (NODE_FAIL), its piece having published
    its last checkpoint at 45 minutes; it trained on, unbilled, past the requeued run's start, and
    ended superseded. Slurm's hour is its (a quarter lost); the requeued run's half hour is the next
    piece's alone."""
    listed = sacct_lines(
        ("12", "NODE_FAIL", T0, T0 + 3600, "cpu=4,gres/gpu=2,mem=8G,node=1", ""),
        ("12", "COMPLETED", T0 + 3700, T0 + 5500, "cpu=4,gres/gpu=2,mem=8G,node=1", ""),
    )
    pieces = [
        piece(1, "12", T0 + 5, T0 + 3900, "superseded", checkpoint_at=T0 + 5 + (3600 - 5) * 0.75),
        piece(2, "12", T0 + 3705, T0 + 5495, "finished"),
    ]
    superseded, resumed = costs(training_uses("r1", pieces), parse_sacct(listed, TRACKING_GPUS)).values()
    assert superseded.gpu_hours == pytest.approx(2.0) and superseded.lost_gpu_hours == pytest.approx(0.5, rel=0.01)
    assert resumed.gpu_hours == pytest.approx(1.0) and resumed.lost_gpu_hours == 0


def test_a_packed_jobs_time_is_shared_among_its_runs_by_the_time_each_ran():
    listed = sacct_lines(("30", "COMPLETED", T0, T0 + 3600, "cpu=8,gres/gpu=1,mem=8G,node=1", ""))
    uses = training_uses("a", [piece(1, "30", T0, T0 + 1200, "finished")])
    uses += training_uses("b", [piece(1, "30", T0 + 1200, T0 + 3600, "finished")])
    cost_of = costs(uses, parse_sacct(listed, TRACKING_GPUS))
    a, b = cost_of.values()
    assert a.gpu_hours == pytest.approx(1 / 3) and b.gpu_hours == pytest.approx(2 / 3), "b ran twice as long"
    assert (a + b).gpu_hours == pytest.approx(1.0), "the whole job, and no more"


def test_without_slurm_a_run_costs_its_pieces_clocks_times_their_cpus_and_a_killed_piece_lasts_to_the_next():
    pieces = [
        piece(1, None, T0, None, "killed", checkpoint_at=T0 + 1800, threads=2),
        piece(2, None, T0 + 3600, T0 + 5400, "finished", threads=2),
    ]
    killed, finished = costs(training_uses("r", pieces), {}).values()
    assert killed.cpu_hours == pytest.approx(2.0) and killed.lost_cpu_hours == pytest.approx(1.0)
    assert finished.cpu_hours == pytest.approx(1.0) and finished.gpu_hours is None


def test_a_paused_piece_loses_only_what_followed_the_checkpoint_it_saved_on_the_stop():
    listed = sacct_lines(("5", "FAILED", T0, T0 + 1000, "cpu=1,gres/gpu=1,mem=1G,node=1", ""))
    paused = piece(1, "5", T0, T0 + 1000, "TrainingStopped: stopped on SIGUSR1 at step 40", checkpoint_at=T0 + 990)
    (cost,) = costs(training_uses("r", [paused]), parse_sacct(listed, TRACKING_GPUS)).values()
    assert cost.lost_gpu_hours == pytest.approx(cost.gpu_hours * 0.01)
    nothing_saved = piece(1, "5", T0, T0 + 1000, "NoSpace: no space in checkpoints/r")
    (cost,) = costs(training_uses("r", [nothing_saved]), parse_sacct(listed, TRACKING_GPUS)).values()
    assert cost.lost_gpu_hours == cost.gpu_hours > 0, "no checkpoint published: all of it lost"


def test_the_grid_asks_sacct_once_for_every_job_and_says_what_the_site_does_not_record():
    asked = []

    def ask(*command: str) -> str:
        asked.append(command)
        if command[0] == "scontrol":
            return (
                "AccountingStorageTRES = cpu,mem,energy,node,billing\nAcctGatherEnergyType = acct_gather_energy/none\n"
            )
        return sacct_lines(
            ("1", "COMPLETED", T0, T0 + 3600, "cpu=2,mem=1G,node=1", ""),
            ("2", "COMPLETED", T0 + 3600, T0 + 3700, "cpu=2,mem=1G,node=1", ""),
        )

    predicted = {"environment": {"slurm_job_id": "2", "finished_at": stamp(T0 + 3700)}, "timings_seconds": {"a": 90}}
    cost = grid_cost({"r": [piece(1, "1", T0 + 2, T0 + 3598, "finished")]}, {"r": (predicted, 4)}, ask=ask)
    (sacct,) = [command for command in asked if command[0] == "sacct"]
    assert sacct[-1] == "1,2"
    assert cost.by_run["r"].cpu_hours == pytest.approx(2 + 2 * 100 / 3600)
    assert cost.by_run["r"].gpu_hours is None and cost.total.energy_kwh is None
    line = cost.line()
    assert "GPU-hours not recorded by this site" in line and "energy not recorded by this site" in line
    assert "0 GPU-hours" not in line


def test_a_prediction_the_train_job_made_costs_its_piece_and_no_job_of_its_own():
    """The run's train job (job 5: an hour on 2 GPUs) predicted as it ended; its predict job, run where
    the workflow runs, moved that into place. The run's GPU-hours are the train job's, known."""

    def ask(*command: str) -> str:
        if command[0] == "scontrol":
            return "AccountingStorageTRES = cpu,mem,gres/gpu\nAcctGatherEnergyType = acct_gather_energy/none\n"
        return sacct_lines(("5", "COMPLETED", T0, T0 + 3600, "cpu=4,gres/gpu=2,mem=8G,node=1", ""))

    moved = {
        "environment": {"slurm_job_id": None, "finished_at": stamp(T0 + 3602)},
        "timings_seconds": {"place": 0.01, "curves": 1.2},
        "predicted_in_training": {"piece": 1, "timings_seconds": {"predict": 30.0}},
    }
    cost = grid_cost({"r": [piece(1, "5", T0 + 2, T0 + 3598, "finished")]}, {"r": (moved, 4)}, ask=ask)
    assert cost.by_run["r"].gpu_hours == pytest.approx(2.0) and cost.total.gpu_hours == pytest.approx(2.0)
    assert cost.by_run["r"].cpu_hours == pytest.approx(4.0)


def test_a_packed_predict_job_that_moved_its_runs_predictions_into_place_is_still_a_job_they_share():
    """Two packed runs trained in job 5 (an hour on 1 GPU, half each) and predicted there; their packed
    predict job, job 6 (100 s), moved both predictions into place: its time is theirs, shared."""

    def ask(*command: str) -> str:
        if command[0] == "scontrol":
            return "AccountingStorageTRES = cpu,mem,gres/gpu\nAcctGatherEnergyType = acct_gather_energy/none\n"
        return sacct_lines(
            ("5", "COMPLETED", T0, T0 + 3600, "cpu=1,gres/gpu=1,mem=8G,node=1", ""),
            ("6", "COMPLETED", T0 + 3600, T0 + 3700, "cpu=1,gres/gpu=1,mem=8G,node=1", ""),
        )

    def moved(end: float) -> dict:
        return {
            "environment": {"slurm_job_id": "6", "finished_at": stamp(end)},
            "timings_seconds": {"place": 1.0},
            "predicted_in_training": {"piece": 1},
        }

    pieces = {
        "a": [piece(1, "5", T0 + 1, T0 + 1800, "finished")],
        "b": [piece(1, "5", T0 + 1800, T0 + 3599, "finished")],
    }
    cost = grid_cost(pieces, {"a": (moved(T0 + 3650), 1), "b": (moved(T0 + 3651), 1)}, ask=ask)
    assert cost.total.gpu_hours == pytest.approx(3700 / 3600), "every GPU-second sacct has, shared out"
    assert cost.by_run["a"].gpu_hours == pytest.approx(cost.by_run["b"].gpu_hours, rel=1e-3)


def test_a_cost_unknown_in_one_part_is_unknown_in_the_sum_and_described_without_slurm():
    assert (Cost(gpu_hours=None) + Cost(gpu_hours=1.0)).gpu_hours is None
    line = described(Cost(gpu_hours=None, lost_gpu_hours=None, cpu_hours=2.0, lost_cpu_hours=0.5), None)
    assert line == "no Slurm accounting: GPU-hours not known, 2 CPU-hours (25% lost to faults)"


def test_a_halving_searchs_pieces_are_counted_in_their_rung_and_the_last_rungs_own_training_in_the_last():
    pieces = {
        "kept": [piece(1, None, T0, T0 + 600, "finished", rung=0), piece(2, None, T0 + 600, T0 + 1800, "finished")],
        "stopped": [piece(1, None, T0, T0 + 600, "finished", rung=0)],
    }
    cost = grid_cost(pieces, {}, last_rung=1)
    assert cost.by_rung[0].cpu_hours == pytest.approx(2 * 600 / 3600)
    assert cost.by_rung[1].cpu_hours == pytest.approx(1200 / 3600)
    assert isinstance(training_uses("kept", pieces["kept"])[0], Use)


def test_a_runs_gpu_utilisation_is_its_jobs_weighted_by_their_gpu_hours_and_its_memory_their_peak():
    site = Site(gpus=True, energy=False, gpu_utilisation=True)

    def job(job_id: str, start: float, seconds: int, utilisation: int, memory: str) -> str:
        span = f"{sacct_time(start)}|{sacct_time(start + seconds)}|{seconds}"
        return (
            f"{job_id}|COMPLETED|{span}|cpu=2,gres/gpu=1,mem=8G|0|\n"
            f"{job_id}.0|COMPLETED|{span}|cpu=2|0|gres/gpumem={memory},gres/gpuutil={utilisation}\n"
        )

    jobs = parse_sacct(job("1", T0, 3600, 90, "1G") + job("2", T0 + 4000, 1800, 30, "3072M"), site)
    pieces = [
        piece(1, "1", T0, T0 + 3600, "Stopped: x", checkpoint_at=T0 + 3600),
        piece(2, "2", T0 + 4000, T0 + 5800, "finished"),
    ]
    row = sum(costs(training_uses("r", pieces), jobs).values(), Cost()).as_row()
    assert row["gpu_hours"] == pytest.approx(1.5)
    assert row["gpu_utilisation_percent"] == pytest.approx((90 * 1 + 30 * 0.5) / 1.5, abs=0.1)
    assert row["peak_gpu_memory_mb"] == 3072
    untracked = parse_sacct(job("1", T0, 3600, 90, "1G"), TRACKING_GPUS)  # no gres/gpuutil in AccountingStorageTRES
    (unrecorded,) = costs(training_uses("r", pieces[:1]), untracked).values()
    assert unrecorded.gpu_hours == pytest.approx(1.0)
    assert unrecorded.as_row()["gpu_utilisation_percent"] is None and unrecorded.peak_gpu_memory_mb is None
