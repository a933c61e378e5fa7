"""The plan of a grid or a search: its runs, their settings and packs, and where each run writes, as one plain object.

Built once from the validated config (`Plan.from_config`) when the workflow is read, written to
`results/plan.json` when it starts, and read back from there by `scripts/status.py` (`Plan.read`).
The rules declare the paths named here (`RUN_PATHS`), so the rules, the status, the aggregation and
the benchmarks agree on them by construction.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from scratchflow.files import write_json_atomically
from scratchflow.grid import build_run_table, run_identity
from scratchflow.search import HALVING, REPLICATE_KEY

PLAN_FILE = Path("results/plan.json")
# A run's TensorBoard folder, in its results (RunPaths.tensorboard): every piece of the run continues it.
TENSORBOARD_FOLDER = "tensorboard"


@dataclass(frozen=True)
class RunPaths:
    """Every path of one run, relative to the directory Snakemake runs in. `RUN_PATHS` holds the
    templates (with `{run_id}`) that the rules declare; `RUN_PATHS.of(run_id)` a run's own."""

    checkpoints: str = "checkpoints/{run_id}"
    model: str = "results/runs/{run_id}/model"
    params: str = "results/runs/{run_id}/params.json"
    record: str = "results/runs/{run_id}/record.json"
    metrics: str = "results/runs/{run_id}/metrics.json"
    predict_record: str = "results/runs/{run_id}/predict_record.json"
    curves: str = "results/runs/{run_id}/curves.png"
    predictions: str = "results/runs/{run_id}/predictions.csv"
    figures: str = "results/runs/{run_id}/figures"  # the task's own, <name>.png (Predicted.figures)
    # The train job's prediction, until the predict job moves it into place (scratchflow.prediction).
    predicted_in_training: str = "results/runs/{run_id}/predicted-in-training"
    tensorboard: str = f"results/runs/{{run_id}}/{TENSORBOARD_FOLDER}"
    train_log: str = "logs/train/{run_id}.log"
    predict_log: str = "logs/predict/{run_id}.log"
    train_benchmark: str = "results/benchmarks/train/{run_id}.tsv"
    predict_benchmark: str = "results/benchmarks/predict/{run_id}.tsv"

    def of(self, run_id: str) -> RunPaths:
        return RunPaths(*(getattr(self, name).format(run_id=run_id) for name in _RUN_PATH_NAMES))


RUN_PATHS = RunPaths()
_RUN_PATH_NAMES = tuple(RunPaths.__dataclass_fields__)
# Beside a run's record: a note for each time its task failed in a way a retry cannot fix
# (scratchflow.failures), numbered from 1 and kept. The newest is an input of the run's train job
# (`newest_failure`): a new one makes Snakemake train the run again, once.
FAILURE_NOTE = "results/runs/{run_id}/failed-{number}.json"
FAILURE_NOTE_NAME = re.compile(r"failed-(\d+)\.json")
MANIFEST = "archives/{dataset}.manifest.json"
# A halving search's rungs: what a run's rung job writes (its validation metrics at the rung's
# epochs), and the decision after each rung but the last (the runs that go on).
RUNG_RECORD = "results/runs/{run_id}/rung-{rung}.json"
RUNG_LOG = "logs/train/{run_id}-rung-{rung}.log"
RUNG_BENCHMARK = "results/benchmarks/train/{run_id}-rung-{rung}.tsv"
RUNG_DECISION = "results/search/rung-{rung}.json"
SEARCH_OUTPUTS = {"rungs": "results/search/rungs.tsv", "rung_plot": "results/search/rungs.png"}
# The rules whose jobs train: train, and a halving search's rungs (rule train_rung, which takes
# train's resources).
TRAINING_RULES = ("train", "train_rung")
PACK_OUTPUT = "results/packs/{stage}-{pack}.json"
PACK_STAGES = ("train", "predict")
# What the aggregate rule writes, in the order the workflow's last message lists them.
COMPARISON_OUTPUTS = {
    "summary": "results/summary.tsv",
    "runs": "results/runs.tsv",
    "best": "results/best_run.json",
    "plot": "results/comparison.png",
    "curves": "results/curves.png",
    "page": "results/summary.html",
}
# The best run's confusion matrix is no declared output: whether the best run reports one is known
# only once it has predicted. The aggregate job draws it where the best run's metrics hold one, and
# removes it where not, so that one from an earlier best run never lingers.
BEST_CONFUSION_MATRIX = "results/best_confusion_matrix.png"


def best_run_figures(run_id: str) -> list[Path]:
    """The best run's figures there are, in the grid's directory: its confusion matrix, then the
    figures its task drew (Predicted.figures), by name."""
    confusion = Path(BEST_CONFUSION_MATRIX)
    return [confusion] * confusion.is_file() + sorted(Path(RUN_PATHS.of(run_id).figures).glob("*.png"))


@dataclass(frozen=True)
class Plan:
    """What the workflow will do for a validated config. `runs`: run id -> that run's complete
    training parameters, in grid order (the id is a hash of the run's identity, so it never depends
    on that order). With `pack_runs` > 1, train and predict jobs go to Slurm that many to a job."""

    runs: dict[str, dict[str, Any]]
    dataset: dict[str, Any]
    model_name: str | None
    task: str
    metric: str
    goal: str
    # The file the task writes last into a checkpoint (what makes it complete, `CheckpointStore`).
    checkpoint_marker: str
    pack_runs: int = 1
    # A halving search's rungs (the epochs each trains to) and the share of settings each keeps.
    rungs: list[int] = field(default_factory=list)
    keep: float | None = None
    executor: str | None = None  # Snakemake's executor, once the workflow starts
    # The config files given on its command line (--configfile), over config/config.yaml: what
    # trains the same grid again (scratchflow.retrain).
    configfiles: list[str] = field(default_factory=list)
    _packs: list[list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = list(self.runs)
        object.__setattr__(
            self, "_packs", [ids[first : first + self.pack_runs] for first in range(0, len(ids), self.pack_runs)]
        )

    @classmethod
    def from_config(cls, config: dict[str, Any], checkpoint_marker: str) -> Plan:
        """The plan of a config that has passed validation (the task's defaults filled in)."""
        model = config.get("model")
        search = config.get("search", {})
        return cls(
            runs=build_run_table(config),
            dataset=config["dataset"],
            model_name=model["name"] if model else None,
            task=config["task"],
            metric=config["aggregate"]["metric"],
            goal=config["aggregate"]["goal"],
            pack_runs=config["cluster"]["pack_runs"],
            checkpoint_marker=checkpoint_marker,
            rungs=search.get("rungs", []) if search.get("kind") == HALVING else [],
            keep=search.get("keep") if search.get("kind") == HALVING else None,
        )

    @property
    def run_ids(self) -> list[str]:
        return list(self.runs)

    @property
    def halving(self) -> bool:
        return bool(self.rungs)

    def rung_decisions(self) -> list[str]:
        """The decisions after every rung but the last (a halving search's; none otherwise)."""
        return [RUNG_DECISION.format(rung=rung) for rung in range(self.last_rung or 0)]

    def decisions(self, workdir: Path = Path()) -> list[dict[str, Any]]:
        """The decisions a halving search has made so far, rung by rung."""
        paths = (workdir / path for path in self.rung_decisions())
        return [json.loads(path.read_text()) for path in itertools.takewhile(Path.is_file, paths)]

    def stopped_runs(self, workdir: Path = Path()) -> list[str]:
        """The runs of a halving search that a decision did not send on: done, at their rung."""
        return [
            run_id
            for decision in self.decisions(workdir)
            for run_id in decision["values"]
            if run_id not in decision["promoted"]
        ]

    @property
    def last_rung(self) -> int | None:
        """A halving search's last rung, the one that trains its runs to their own epochs; None for a grid."""
        return len(self.rungs) - 1 if self.halving else None

    @property
    def archive_template(self) -> str:
        """The dataset's archive (its first part, when it has several), `{dataset}` for its name: .tar,
        or .tar.zst compressed."""
        from scratchflow.staging import archive_suffix  # not for the status, which reads no archive

        return f"archives/{{dataset}}{archive_suffix(self.dataset)}"

    @property
    def archive(self) -> str:
        return self.archive_template.format(dataset=self.dataset["name"])

    @property
    def manifest(self) -> str:
        return MANIFEST.format(dataset=self.dataset["name"])

    @property
    def model_cache(self) -> str | None:
        return f"models/{self.model_name}" if self.model_name else None

    def train_inputs(self) -> dict[str, str]:
        """What a training job reads: the archive and its manifest, and the model cache where the config
        names a model. The rules take such paths, which depend on the config alone, from the plan as
        constants, not through input functions: Snakemake calls an input function once per job, through
        inspect.signature, which costs seconds for 10,000 runs."""
        model_cache = self.model_cache
        return {
            "archive": self.archive,
            "manifest": self.manifest,
            **({"base_model": model_cache} if model_cache else {}),
        }

    def last_rung_input(self) -> dict[str, str]:
        """A halving search's last rung (rule train) resumes each run from its record of the rung before."""
        last_rung = self.last_rung
        if last_rung is None:  # a grid
            return {}
        return {"last_rung": RUNG_RECORD.format(run_id="{run_id}", rung=last_rung - 1)}

    @staticmethod
    def failure_notes(run_id: str) -> list[Path]:
        """The run's failure notes, oldest first (one listing of its results folder)."""
        folder = Path(RUN_PATHS.of(run_id).record).parent
        try:
            names = [
                (int(found[1]), name) for name in os.listdir(folder) if (found := FAILURE_NOTE_NAME.fullmatch(name))
            ]
        except FileNotFoundError:
            return []
        return [folder / name for _number, name in sorted(names)]

    @staticmethod
    def predict_outputs(writes_predictions: bool) -> dict[str, str]:
        """What a predict job writes (predictions.csv only for a task that makes them)."""
        return {
            "metrics": RUN_PATHS.metrics,
            "record": RUN_PATHS.predict_record,
            "curves": RUN_PATHS.curves,
            **({"predictions": RUN_PATHS.predictions} if writes_predictions else {}),
        }

    @property
    def packed(self) -> bool:
        return self.pack_runs > 1

    def pack_group(self, stage: str) -> str | None:
        """The Snakemake group that joins a pack's train (or predict) jobs into one Slurm job (rules/pack.smk);
        none when runs are not packed."""
        return f"packed_{stage}" if self.packed else None

    @property
    def packs(self) -> list[list[str]]:
        """The run ids of each pack, in grid order (one run each when runs are not packed)."""
        return self._packs

    def settings(self) -> dict[str, list[str]]:
        """Runs that differ only in their seed are one setting, replicated: a label of the setting's
        parameters (seed left out) -> its run ids, in grid order."""
        settings: dict[str, list[str]] = {}
        for run_id, params in self.runs.items():
            label = json.dumps({key: value for key, value in params.items() if key != REPLICATE_KEY}, sort_keys=True)
            settings.setdefault(label, []).append(run_id)
        return settings

    def identity(self, run_id: str) -> dict[str, Any]:
        """What determines the run's result (dataset settings, model, training parameters, task)."""
        return run_identity(self.runs[run_id], self.dataset, self.model_name, self.task)

    def paths(self, run_id: str) -> RunPaths:
        return RUN_PATHS.of(run_id)

    def pack_outputs(self) -> list[str]:
        """The pack jobs' outputs, when runs are packed."""
        if not self.packed:
            return []
        return [PACK_OUTPUT.format(stage=stage, pack=pack) for stage in PACK_STAGES for pack in range(len(self.packs))]

    def pack_inputs(self, stage: str, pack: int) -> list[str]:
        """What the jobs of a pack write last: each run's record (train) or metrics (predict)."""
        name = {"train": "record", "predict": "metrics"}[stage]
        return [getattr(RUN_PATHS, name).format(run_id=run_id) for run_id in self.packs[pack]]

    def run_results(self, run_ids: list[str] | None = None) -> dict[str, list[str]]:
        """The params, test metrics, records and predict records of every run (or of `run_ids`: those a
        halving search trained to the end), in grid order, for the comparison; and a halving search's
        decisions."""

        wanted = set(self.runs if run_ids is None else run_ids)

        def every_run(template: str) -> list[str]:
            return [template.format(run_id=run_id) for run_id in self.runs if run_id in wanted]

        return {
            "params": every_run(RUN_PATHS.params),
            "metrics": every_run(RUN_PATHS.metrics),
            "records": every_run(RUN_PATHS.record),
            "predict_records": every_run(RUN_PATHS.predict_record),  # what the predict jobs cost
            **({"decisions": self.rung_decisions()} if self.halving else {}),
        }

    def final_outputs(self) -> list[str]:
        search = list(SEARCH_OUTPUTS.values()) if self.halving else []
        return self.pack_outputs() + list(COMPARISON_OUTPUTS.values()) + search

    def started(self, executor: str, configfiles: Sequence[str] = ()) -> Plan:
        """The plan as the workflow runs it, with the executor that submits its jobs and the config
        files its command line gave."""
        return Plan(**{**self._fields(), "executor": executor, "configfiles": list(configfiles)})

    def write(self, workdir: Path) -> None:
        """`results/plan.json`: the plan, for the status (which knows the runs not started yet from it)."""
        # Unsorted: the runs stay in grid order, the order the status lists them in.
        write_json_atomically(self._fields(), workdir / PLAN_FILE, sort_keys=False)

    @classmethod
    def read(cls, workdir: Path) -> Plan:
        path = workdir / PLAN_FILE
        if not path.is_file():
            if (workdir / "config" / "config.yaml").is_file():  # a workflow's folder, never run yet
                raise NoPlan(
                    f"no grid or search has started in {workdir.resolve()} yet ({PLAN_FILE} is written when the "
                    "workflow starts): start it (a lab's pipeline: make run, or make submit on a cluster), "
                    "then ask again."
                )
            raise NoPlan(
                f"no grid or search in {workdir.resolve()}: {PLAN_FILE} is missing. The workflow writes it when "
                "it starts; run this in the directory you run snakemake in, or name that directory."
            )
        written = json.loads(path.read_text())
        # An earlier release's plan lacks what came later (configfiles, 0.5): read with its default. The
        # workflow writes the file anew only when it has jobs to run, not after an upgrade that retrains nothing.
        fields = {name: spec for name, spec in cls.__dataclass_fields__.items() if not name.startswith("_")}
        required = {
            name for name, spec in fields.items() if spec.default is MISSING and spec.default_factory is MISSING
        }
        if not required <= set(written) or not set(written) <= set(fields):
            raise NoPlan(
                f"{path.resolve()} was written by another version of scratchflow; run the workflow's command "
                "again (it writes the file anew when it starts)"
            )
        return cls(**written)

    def _fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if not name.startswith("_")}


class NoPlan(RuntimeError):
    """The directory holds no grid or search the workflow has started."""
