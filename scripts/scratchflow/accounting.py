"""What a grid cost: the time and resources each of its Slurm jobs held, from Slurm's accounting (one
`sacct` query for every job the grid's records name), shared out to the runs that used them, with
the part faults threw away: what a piece that ended unfinished trained after its last published
checkpoint. Without Slurm, CPU-hours from the pieces' own clocks.

A figure the site does not record (GPUs where AccountingStorageTRES has no gres/gpu, energy without
an AcctGatherEnergyType, GPU utilisation without gres/gpuutil) is None, "not recorded by this
site", never 0.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from scratchflow.failures import DIVERGED
from scratchflow.ledger import FINISHED, RUNNING, piece_records, piece_time
from scratchflow.slurm_job import ask_slurm

SACCT_FIELDS = ("JobIDRaw", "State", "Start", "End", "ElapsedRaw", "AllocTRES", "ConsumedEnergyRaw", "TRESUsageInAve")
NOT_RECORDED = "not recorded by this site"
Ask = Callable[..., str | None]  # runs a Slurm command; its output, or None where it failed


def ask_slurm_patiently(*command: str) -> str | None:
    """slurm_job.ask_slurm, with time for one sacct of a large grid's jobs."""
    return ask_slurm(*command, timeout=120)


@dataclass(frozen=True)
class Site:
    """What this cluster's accounting records besides time, CPUs and memory."""

    gpus: bool  # AccountingStorageTRES has gres/gpu
    energy: bool  # an AcctGatherEnergyType other than none
    gpu_utilisation: bool  # AccountingStorageTRES has gres/gpuutil (and gres/gpumem)

    @classmethod
    def from_config(cls, shown: str) -> Site:
        """From `scontrol show config`."""
        settings = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        settings = {key.strip(): value.strip() for key, value in settings.items()}
        tracked = settings.get("AccountingStorageTRES", "").split(",")
        return cls(
            gpus=any(tres == "gres/gpu" or tres.startswith("gres/gpu:") for tres in tracked),
            energy=settings.get("AcctGatherEnergyType", "acct_gather_energy/none") != "acct_gather_energy/none",
            gpu_utilisation="gres/gpuutil" in tracked,
        )


@dataclass(frozen=True)
class JobRun:
    """One run of a Slurm job as sacct has it (a requeued job runs again under its id: one each)."""

    job_id: str
    state: str
    start: float
    end: float | None  # None: still running
    elapsed_seconds: float
    cpus: int
    gpus: int | None  # None: not recorded by this site
    energy_joules: float | None
    gpu_utilisation_percent: float | None  # of its longest step
    gpu_memory_mb: float | None


def tres(text: str) -> dict[str, str]:
    """`billing=2,cpu=2,gres/gpu:a100=1,gres/gpu=1,mem=8G` as a mapping."""
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def _megabytes(value: str) -> float:
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    return float(value[:-1]) * units[value[-1]] if value[-1:] in units else float(value) / 2**20


def _unix_time(stamp: str) -> float | None:
    """sacct's Start or End (local time, no zone) as seconds; None for Unknown (still running)."""
    if not stamp or stamp in ("Unknown", "None"):
        return None
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def parse_sacct(text: str, site: Site) -> dict[str, list[JobRun]]:
    """`sacct --duplicates -n -P -o SACCT_FIELDS` (job lines, each followed by its steps' lines):
    job id -> its runs, oldest first."""
    jobs: dict[str, list[JobRun]] = defaultdict(list)
    steps: list[tuple[float, dict[str, str]]] = []

    def close(job: dict[str, str] | None) -> None:
        if job is None:
            return
        allocated = tres(job["AllocTRES"])
        longest = max(steps, key=lambda step: step[0])[1] if steps else {}
        energy = float(job["ConsumedEnergyRaw"] or 0)
        used = site.gpu_utilisation
        jobs[job["JobIDRaw"]].append(
            JobRun(
                job_id=job["JobIDRaw"],
                state=job["State"].split()[0],
                start=_unix_time(job["Start"]) or 0.0,
                end=_unix_time(job["End"]),
                elapsed_seconds=float(job["ElapsedRaw"] or 0),
                cpus=int(allocated.get("cpu", 0)),
                gpus=int(allocated.get("gres/gpu", 0)) if site.gpus else None,
                # Without an energy plugin sacct says 0: that is "not recorded", not no energy.
                energy_joules=energy if site.energy and energy > 0 else None,
                gpu_utilisation_percent=float(longest["gres/gpuutil"]) if used and "gres/gpuutil" in longest else None,
                gpu_memory_mb=_megabytes(longest["gres/gpumem"]) if used and "gres/gpumem" in longest else None,
            )
        )
        steps.clear()

    job = None
    for line in text.splitlines():
        values = line.split("|")
        if len(values) != len(SACCT_FIELDS):
            continue
        row = dict(zip(SACCT_FIELDS, values, strict=True))
        if "." in row["JobIDRaw"]:  # a step of the job above: where sites record GPU utilisation
            steps.append((float(row["ElapsedRaw"] or 0), tres(row["TRESUsageInAve"])))
            continue
        close(job)
        job = row
    close(job)
    return dict(jobs)


def slurm_accounting(
    job_ids: Iterable[str], ask: Ask = ask_slurm_patiently
) -> tuple[dict[str, list[JobRun]], Site] | None:
    """Every run of `job_ids` from one sacct query, and what the site records; None where there is
    no Slurm accounting to ask (a grid run without Slurm, sacct missing or failing)."""
    wanted = sorted(set(job_ids))
    if not wanted:
        return None
    shown = ask("scontrol", "show", "config")
    listed = ask("sacct", "--duplicates", "-n", "-P", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(wanted))
    if shown is None or listed is None:
        return None
    site = Site.from_config(shown)
    return parse_sacct(listed, site), site


@dataclass(frozen=True)
class Use:
    """A stretch of a job that one run used: a piece of its training, or its predict job."""

    run_id: str
    stage: str  # train, predict
    rung: int | None  # a halving search's rung the piece trained (None: the run's own training)
    job_id: str | None  # None: no Slurm
    start: float
    end: float | None  # None: killed (its Slurm job's end, or the next piece's start)
    lost_from: float | None  # ended unfinished: what it did after this is lost (None: nothing lost)
    cpus: int  # without Slurm: the threads it trained with, times its processes


def training_uses(run_id: str, listed: list[dict[str, Any]]) -> list[Use]:
    """A run's training pieces (record.json's `pieces`, a rung record's, pieces.json)."""
    uses = []
    pieces = piece_records(listed)
    for index, piece in enumerate(pieces):
        start = piece_time(piece.started_at)
        end = piece_time(piece.ended_at) if piece.ended_at else None
        if end is None and not piece.slurm_job_id and index + 1 < len(pieces):
            end = piece_time(pieces[index + 1].started_at)  # killed without Slurm: until the next one
        # A piece still running has lost nothing yet (or, killed, is said so by the next piece); one
        # that diverged ended the run with a result, trained again by nothing.
        unfinished = piece.outcome not in (FINISHED, RUNNING, DIVERGED)
        published = piece.last_checkpoint_at
        uses.append(
            Use(
                run_id=run_id,
                stage="train",
                rung=piece.rung,
                job_id=piece.slurm_job_id,
                start=start,
                end=end,
                lost_from=(piece_time(published) if published else start) if unfinished else None,
                cpus=(piece.threads or 1) * (piece.world_size or 1),
            )
        )
    return uses


def held_resources(predict_record: dict[str, Any]) -> bool:
    """Whether a run's predict job held resources of its own: a Slurm job (a packed one, which may
    only have moved its runs' predictions into place, too), or, without Slurm, one that predicted.
    Not one that ran in the workflow's own Snakemake to move the train job's prediction into place
    (`predicted_in_training`: that prediction is in the piece's time) or to say a run has no model
    (`outcome`): such a one costs nothing of the grid's."""
    if predict_record["environment"].get("slurm_job_id"):
        return True
    return "predicted_in_training" not in predict_record and "outcome" not in predict_record


def predict_use(run_id: str, predict_record: dict[str, Any], threads: int) -> Use:
    """A run's predict job (its record: results/runs/<run>/predict_record.json)."""
    environment = predict_record["environment"]
    end = piece_time(environment["finished_at"])
    return Use(
        run_id=run_id,
        stage="predict",
        rung=None,
        job_id=environment.get("slurm_job_id"),
        start=end - sum(predict_record.get("timings_seconds", {}).values()),
        end=end,
        lost_from=None,
        cpus=threads,
    )


@dataclass
class Cost:
    """GPU-hours and CPU-hours (and the part of each lost to faults), energy, and where the site
    records them the GPUs' use (GPU-hours times utilisation) and peak memory; None: not recorded."""

    gpu_hours: float | None = 0.0
    lost_gpu_hours: float | None = 0.0
    cpu_hours: float = 0.0
    lost_cpu_hours: float = 0.0
    energy_kwh: float | None = 0.0
    busy_gpu_hours: float | None = 0.0
    peak_gpu_memory_mb: float | None = 0.0

    def __add__(self, other: Cost) -> Cost:
        peak, other_peak = self.peak_gpu_memory_mb, other.peak_gpu_memory_mb
        return Cost(
            gpu_hours=_sum(self.gpu_hours, other.gpu_hours),
            lost_gpu_hours=_sum(self.lost_gpu_hours, other.lost_gpu_hours),
            cpu_hours=self.cpu_hours + other.cpu_hours,
            lost_cpu_hours=self.lost_cpu_hours + other.lost_cpu_hours,
            energy_kwh=_sum(self.energy_kwh, other.energy_kwh),
            busy_gpu_hours=_sum(self.busy_gpu_hours, other.busy_gpu_hours),
            peak_gpu_memory_mb=None if peak is None or other_peak is None else max(peak, other_peak),
        )

    def as_row(self) -> dict[str, float | None]:
        """The tables' columns (COLUMNS): the GPUs' mean utilisation in place of their busy hours."""
        row = {name.name: _rounded(getattr(self, name.name)) for name in fields(Cost)}
        del row["busy_gpu_hours"]
        busy, gpu_hours = self.busy_gpu_hours, self.gpu_hours
        row["gpu_utilisation_percent"] = round(100 * busy / gpu_hours, 1) if busy is not None and gpu_hours else None
        row["peak_gpu_memory_mb"] = row.pop("peak_gpu_memory_mb")
        return row


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def costs(uses: list[Use], jobs: dict[str, list[JobRun]], now: float | None = None) -> dict[Use, Cost]:
    """Each use's cost. A Slurm job's whole elapsed time (its start-up too) goes to the uses it held,
    shared by how long each ran (a packed job holds several runs); a use's lost part is the share of
    its own time after `lost_from`. Without Slurm: its time times its CPUs, no GPU figure."""
    now = time.time() if now is None else now
    held: dict[tuple[str, int], list[Use]] = defaultdict(list)
    result = {}
    for use in uses:
        job_id = use.job_id
        index = None if job_id is None else _job_run_of(use, jobs.get(job_id, []))
        if job_id is None or index is None:
            result[use] = _local_cost(use, now)
        else:
            held[job_id, index].append(use)
    for (job_id, index), sharing in held.items():
        job_run = jobs[job_id][index]
        ends = {use: min(use.end or job_run.end or now, job_run.end or now) for use in sharing}
        seconds = {use: max(ends[use] - use.start, 0.0) for use in sharing}
        total = sum(seconds.values())
        for use in sharing:
            share = seconds[use] / total if total else 1 / len(sharing)
            lost = _lost_fraction(use, ends[use])
            hours = share * job_run.elapsed_seconds / 3600
            gpu_hours = None if job_run.gpus is None else hours * job_run.gpus
            result[use] = Cost(
                gpu_hours=gpu_hours,
                lost_gpu_hours=None if gpu_hours is None else gpu_hours * lost,
                cpu_hours=hours * job_run.cpus,
                lost_cpu_hours=hours * job_run.cpus * lost,
                energy_kwh=None if job_run.energy_joules is None else share * job_run.energy_joules / 3.6e6,
                busy_gpu_hours=None
                if gpu_hours is None or job_run.gpu_utilisation_percent is None
                else gpu_hours * job_run.gpu_utilisation_percent / 100,
                peak_gpu_memory_mb=job_run.gpu_memory_mb,
            )
    return result


def _job_run_of(use: Use, job_runs: list[JobRun]) -> int | None:
    """Which of a job's runs held `use`: the last that started before it (sacct's times are whole
    seconds, the piece's too)."""
    started = [index for index, job_run in enumerate(job_runs) if job_run.start <= use.start + 1]
    return started[-1] if started else (0 if job_runs else None)


def _lost_fraction(use: Use, end: float) -> float:
    if use.lost_from is None or end <= use.start:
        return 0.0 if use.lost_from is None else 1.0
    return min(max((end - use.lost_from) / (end - use.start), 0.0), 1.0)


def _local_cost(use: Use, now: float) -> Cost:
    end = use.end if use.end is not None else now  # still running
    hours = max(end - use.start, 0.0) / 3600 * use.cpus
    return Cost(
        gpu_hours=None,
        lost_gpu_hours=None,
        cpu_hours=hours,
        lost_cpu_hours=hours * _lost_fraction(use, end),
        energy_kwh=None,
        busy_gpu_hours=None,
        peak_gpu_memory_mb=None,
    )


def total(cost_of: dict[Use, Cost], keep: Callable[[Use], bool] = lambda _: True) -> Cost:
    """The sum of the costs of the uses `keep` selects."""
    summed = Cost()
    for use, cost in cost_of.items():
        if keep(use):
            summed = summed + cost
    return summed


def lost_share(cost: Cost) -> float | None:
    """The share of the cost that faults threw away: of the GPU-hours where recorded, else the CPU-hours."""
    if cost.gpu_hours:
        return cost.lost_gpu_hours / cost.gpu_hours if cost.lost_gpu_hours is not None else None
    return cost.lost_cpu_hours / cost.cpu_hours if cost.cpu_hours else None


def described(cost: Cost, site: Site | None) -> str:
    """One line: '1.25 GPU-hours (3% lost to faults), 10.0 CPU-hours, energy not recorded by this site'."""
    parts = []
    if site is None:
        parts.append("no Slurm accounting: GPU-hours not known")
    elif cost.gpu_hours is None:
        parts.append(f"GPU-hours {NOT_RECORDED} (AccountingStorageTRES has no gres/gpu)")
    else:
        parts.append(f"{cost.gpu_hours:.3g} GPU-hours")
    parts.append(f"{cost.cpu_hours:.3g} CPU-hours")
    share = lost_share(cost)
    if share is not None:
        parts[-1 if cost.gpu_hours is None else 0] += f" ({100 * share:.0f}% lost to faults)"
    if site is not None:
        parts.append(f"energy {NOT_RECORDED}" if cost.energy_kwh is None else f"{cost.energy_kwh:.3g} kWh")
    return ", ".join(parts)


COLUMNS = (
    "gpu_hours",
    "lost_gpu_hours",
    "cpu_hours",
    "lost_cpu_hours",
    "energy_kwh",
    "gpu_utilisation_percent",
    "peak_gpu_memory_mb",
)


@dataclass
class GridCost:
    """What the grid's runs cost: each run's, each rung's of a halving search, and the whole."""

    by_run: dict[str, Cost]
    by_rung: dict[int, Cost]
    total: Cost
    site: Site | None  # None: no Slurm accounting was asked (or none answered)

    def line(self) -> str:
        return described(self.total, self.site)


def grid_cost(
    pieces: dict[str, list[dict[str, Any]]],
    predictions: dict[str, tuple[dict[str, Any], int]],
    last_rung: int | None = None,
    ask: Ask = ask_slurm_patiently,
    now: float | None = None,
) -> GridCost:
    """`pieces`: each run's training pieces (its record's, or its last rung record's); `predictions`:
    each run's predict record and the threads it ran with (those that `held_resources`); `last_rung`:
    a halving search's last rung, where the pieces of the run's own training (after the decisions)
    go."""
    uses = [use for run_id, listed in pieces.items() for use in training_uses(run_id, listed)]
    uses += [
        predict_use(run_id, record, threads)
        for run_id, (record, threads) in predictions.items()
        if held_resources(record)
    ]
    accounting = slurm_accounting([use.job_id for use in uses if use.job_id], ask)
    jobs, site = accounting if accounting else ({}, None)
    cost_of = costs(uses, jobs, now)
    by_rung = {}
    if last_rung is not None:
        for rung in range(last_rung + 1):
            by_rung[rung] = total(cost_of, _trained_in_rung(rung, last_rung))
    return GridCost(
        by_run={run_id: total(cost_of, _of_run(run_id)) for run_id in pieces},
        by_rung=by_rung,
        total=total(cost_of),
        site=site,
    )


def _trained_in_rung(rung: int, last_rung: int) -> Callable[[Use], bool]:
    """Selects the training pieces of a halving search's `rung`."""
    return lambda use: use.stage == "train" and _rung_of(use, last_rung) == rung


def _of_run(run_id: str) -> Callable[[Use], bool]:
    """Selects the uses of one run."""
    return lambda use: use.run_id == run_id


def _rung_of(use: Use, last_rung: int) -> int:
    """A piece's rung: its own, or the last (the run's training after the last decision)."""
    return last_rung if use.rung is None else use.rung
