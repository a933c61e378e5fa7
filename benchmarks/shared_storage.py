"""What one train job asks of a cluster's shared filesystem: its operations under the shared working
directory (where checkpoints/, results/ and logs/ live), counted by strace, by kind and by phase.

On Lustre, GPFS or NFS every create, rename, unlink, fsync, listing and stat is a round trip to a
metadata server that every user of the cluster shares; data written to a file already open is not
(the client caches it). This runs scratchflow's own train job (scratchflow.jobs.train_job, in a fresh
process as a cluster job would, its scratch on another disk) for each kind of task under
`strace -f`, and splits what it did in the shared folder into:

- start-up: before the task's training begins (claim, hold, the ledger's entry, stage-in's reads);
- publication: each checkpoint copied whole into checkpoints/<run>/ (its files, proportional to
  their number), published.jsonl, and the curves the task wrote on scratch since the last one;
- training: everything else while the task trains (progress, curves, the ledger, log lines), per
  minute of training: the budget is at most one write (a create, rename, unlink, mkdir or fsync) a
  run per 10 seconds of training, whatever the task calls;
- the end: sync back, record, release of the lease.

    python benchmarks/shared_storage.py [--tasks mlp,text,command,trainer-script] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from measure import REPO, arguments, bbc_articles, print_table, save

LAB = REPO / "tests" / "plain_pytorch_lab"
MLP_DATA = {"name": "numbers", "path": str(LAB / "data" / "numbers.csv"), "format": "csv"}


def mlp_setting(folder: Path, epochs: int) -> dict[str, Any]:
    """A lab's plain-PyTorch task (tests/plain_pytorch_lab, 0.4 ms a step), reporting its progress
    after every step (`context.report_progress(step, end, loss)`: the piece throttles the writes)."""
    return {"task": "ourlab.mlp", "dataset": MLP_DATA, "training": {"hidden": 8, "epochs": epochs, "seed": 0}}


def text_setting(folder: Path, epochs: int) -> dict[str, Any]:
    """The text task: a tiny BERT on 40 BBC articles a topic (TensorBoard curves, HF checkpoints)."""
    from scratchflow.dataset import load_examples
    from scratchflow.tiny_model import build_tiny_bert

    data = bbc_articles(folder / "articles")
    texts = [example.text for example in load_examples(data, "folder", "text", "label")]
    model = build_tiny_bert(texts, folder / "shared" / "models" / "tiny-bert", vocab_size=500)
    training = {"learning_rate": 1.0e-3, "batch_size": 16, "epochs": epochs, "max_length": 32, "seed": 0}
    dataset = {"name": "articles", "path": str(data), "format": "folder"}
    return {"task": "text-classification", "dataset": dataset, "training": training, "model": str(model)}


def image_setting(folder: Path, epochs: int) -> dict[str, Any]:
    """The image task: a tiny ResNet on 40 animal-mnist silhouettes of each of 4 animals."""
    from scratchflow.animal_mnist import write_pngs
    from scratchflow.tiny_model import build_tiny_resnet

    data = write_pngs(folder / "animals", per_label=40, labels=("bird", "cat", "cow", "dog"))
    model = build_tiny_resnet(folder / "shared" / "models" / "tiny-resnet")
    training = {"learning_rate": 3.0e-3, "batch_size": 16, "epochs": epochs, "seed": 0}
    dataset = {"name": "animals", "path": str(data), "format": "folder"}
    return {"task": "image-classification", "dataset": dataset, "training": training, "model": str(model)}


def command_setting(folder: Path, epochs: int) -> dict[str, Any]:
    """The command task: the lab's own program (config/examples/command/train.py), its checkpoints
    mirrored by the piece's watcher."""
    data = bbc_articles(folder / "articles")
    program = REPO / "config" / "examples" / "command" / "train.py"
    training = {"command": [sys.executable, str(program)], "hidden": 64, "features": 4096, "batch_size": 8}
    training |= {"epochs": epochs, "learning_rate": 1.0e-3, "seed": 0}
    dataset = {"name": "articles", "path": str(data), "format": "folder"}
    aggregate = {"metric": "test_loss", "goal": "min"}  # a command task's metrics are its own
    return {"task": "command", "dataset": dataset, "training": training, "aggregate": aggregate}


def trainer_script_setting(folder: Path, epochs: int) -> dict[str, Any]:
    """A lab's Hugging Face Trainer script, unchanged, through scratchflow.trainer_script
    (tests/trainer_script_lab/train.py: the text setting's tiny BERT and articles, as one CSV)."""
    import csv

    text = text_setting(folder, epochs)
    table = folder / "articles.csv"
    with open(table, "w", newline="") as file:
        rows = csv.writer(file)
        rows.writerow(["text", "label"])
        for article in sorted(Path(text["dataset"]["path"]).rglob("*.txt")):
            rows.writerow([article.read_text(errors="replace"), article.parent.name])
    script = REPO / "tests" / "trainer_script_lab" / "train.py"
    launched = [sys.executable, "-m", "scratchflow.trainer_script", str(script)]
    command = [*launched, "--data", "${SCRATCHFLOW_DATA_FILE}", "--model", "${SCRATCHFLOW_MODEL_DIR}"]
    training = {"command": command, "num_train_epochs": epochs, "max_length": 32, "seed": 0}
    dataset = {"name": "articles", "path": str(table), "format": "csv"}
    aggregate = {"metric": "eval_accuracy", "goal": "max"}
    return {"task": "command", "dataset": dataset, "training": training, "aggregate": aggregate, "model": text["model"]}


# Each kind of task, with the epochs that train it for about a minute here.
SETTINGS: dict[str, tuple[Callable[[Path, int], dict[str, Any]], int]] = {
    "mlp": (mlp_setting, 12_000),
    "text": (text_setting, 60),
    "image": (image_setting, 150),
    "command": (command_setting, 40),
    "trainer-script": (trainer_script_setting, 40),
}
CHECKPOINTING = {"every_minutes": 10, "every_steps": 2000, "keep": 2, "stop_signal": "USR1", "stop_grace_seconds": 60}
# The system calls counted, and what each is.
KINDS = {
    "rename": "rename", "renameat": "rename", "renameat2": "rename",
    "unlink": "unlink", "unlinkat": "unlink", "rmdir": "unlink",
    "mkdir": "mkdir", "mkdirat": "mkdir", "link": "create", "linkat": "create", "symlink": "create",
    "fsync": "fsync", "fdatasync": "fsync",
    "getdents64": "listing",
    "stat": "stat", "lstat": "stat", "newfstatat": "stat", "statx": "stat", "access": "stat", "faccessat2": "stat",
    "write": "append", "pwrite64": "append", "writev": "append",
}  # fmt: skip
TRACED = ",".join(["openat", *KINDS])
# The kinds a metadata server serves (an append to an open file is not one), and those that write.
METADATA = ("create", "open", "rename", "unlink", "mkdir", "fsync", "listing", "stat")
WRITES = ("create", "rename", "unlink", "mkdir", "fsync")
CALL = re.compile(r"^(?P<time>\d+\.\d+) (?P<name>\w+)\((?P<arguments>.*)\) += (?P<result>-?\d+)(?P<path><[^>]*>)?")
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
FD_PATH = re.compile(r"^\d+<([^>]*)>")
AT_PATH = re.compile(r'(?:AT_FDCWD|-?\d+)<([^>]*)>, "((?:[^"\\]|\\.)*)"')
FD_CALLS = ("write", "pwrite64", "writev", "fsync", "fdatasync", "getdents64")


@dataclass
class Counts:
    """Operations in the shared folder of one job, by phase and kind."""

    by_phase: dict[str, Counter[str]] = field(default_factory=dict)
    training_seconds: float = 0.0
    checkpoints: int = 0
    checkpoint_files: int = 0

    def add(self, phase: str, kind: str) -> None:
        self.by_phase.setdefault(phase, Counter())[kind] += 1

    def writes(self, phase: str) -> int:
        return sum(self.by_phase.get(phase, Counter())[kind] for kind in WRITES)

    def metadata(self, phase: str) -> int:
        return sum(self.by_phase.get(phase, Counter())[kind] for kind in METADATA)


def job_process(spec_path: Path) -> None:
    """The train job of `spec_path`'s setting, in this process (run under strace)."""
    spec = json.loads(spec_path.read_text())
    sys.path.insert(0, str(LAB))
    from scratchflow import checkpoints, jobs, training_process

    marks: dict[str, float] = {}
    train = training_process.TrainingProcess.train

    def marked_train(self: training_process.TrainingProcess) -> training_process.PieceOutcome:
        marks["training"] = time.time()
        try:
            return train(self)
        finally:
            marks["end"] = time.time()

    training_process.TrainingProcess.train = marked_train  # type: ignore[method-assign]
    publications: list[tuple[float, float]] = []

    def timed(publishing: Callable[..., Any]) -> Callable[..., Any]:
        def publish(*arguments: Any, **keywords: Any) -> Any:
            started = time.time()
            try:
                return publishing(*arguments, **keywords)
            finally:
                publications.append((started, time.time()))

        return publish

    checkpoints.CheckpointStore.mirror = timed(checkpoints.CheckpointStore.mirror)  # type: ignore[method-assign]
    checkpoints.CheckpointStore.publish = timed(checkpoints.CheckpointStore.publish)  # type: ignore[method-assign]
    for publishing in ("_before_publishing", "_publish_curves"):  # before 0.3, neither: curves went straight there
        if hasattr(training_process.TrainingProcess, publishing):
            setattr(
                training_process.TrainingProcess,
                publishing,
                timed(getattr(training_process.TrainingProcess, publishing)),
            )
    work, run = Path(spec["work"]), "storage"
    runs = work / "results" / "runs" / run
    runs.mkdir(parents=True)  # Snakemake makes its outputs' folders before the job starts
    with jobs.job_context(str(work / "logs" / f"{run}.log")):
        jobs.train_job(
            jobs.TrainJob(
                run_id=run,
                task=spec["task"],
                identity=spec["identity"],
                resolved_config={},
                archive=Path(spec["archive"]),
                manifest=Path(spec["manifest"]),
                base_model=Path(spec["model"]) if spec.get("model") else None,
                scratch_root=spec["scratch_root"],
                shared_folder=work / "checkpoints" / run,
                checkpointing=CHECKPOINTING,
                threads=1,
                workflow_dir=REPO,
                tracking_dir=runs / "tensorboard",
                tracking="tensorboard",
                log=work / "logs" / f"{run}.log",
                ends_with=jobs.RunOutputs(runs / "model", runs / "params.json", runs / "record.json"),
            )
        )
    Path(spec["marks"]).write_text(json.dumps({**marks, "publications": publications}))


def traced_job(name: str, folder: Path, epochs: int | None = None) -> Counts:
    """The train job of setting `name` (trained for `epochs`, or the setting's) under strace, its
    shared working directory in `folder`."""
    from scratchflow.config import configured_task, validate_config
    from scratchflow.grid import run_identity
    from scratchflow.staging import archive_dataset

    build, default_epochs = SETTINGS[name]
    setting = build(folder, epochs or default_epochs)
    config = {"task": setting["task"], "dataset": setting["dataset"], "training": dict(setting["training"])}
    config["grid"] = {"seed": [config["training"]["seed"]]}
    if "model" in setting:
        config["model"] = {"name": "model", "source": setting["model"]}
    if "aggregate" in setting:
        config["aggregate"] = setting["aggregate"]
    sys.path.insert(0, str(LAB))
    validate_config(config)
    configured_task(config)  # the task's defaults filled in
    shared, scratch, archives = folder / "shared", folder / "node-scratch", folder / "archives"
    for made in (shared, scratch, archives):
        made.mkdir(parents=True, exist_ok=True)
    archive, manifest = archives / "data.tar", archives / "data.manifest.json"
    archive_dataset(config["dataset"], archive, manifest)
    spec = {
        "work": str(shared),
        "task": setting["task"],
        "identity": run_identity(config["training"], config["dataset"], "model", setting["task"]),
        "model": setting.get("model"),
        "archive": str(archive),
        "manifest": str(manifest),
        "scratch_root": str(scratch),
        "marks": str(folder / "marks.json"),
    }
    if "report_every_seconds" in setting:
        spec["report_every_seconds"] = setting["report_every_seconds"]
    (folder / "spec.json").write_text(json.dumps(spec))
    traces = folder / "trace"
    command = ["strace", "-f", "-ff", "-ttt", "-y", "-qq", "-e", f"trace={TRACED}", "-o", str(traces)]
    command += [sys.executable, __file__, "--job", str(folder / "spec.json")]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "scripts"), str(REPO / "benchmarks")])}
    subprocess.run(command, cwd=shared, env=environment, check=True, stdout=subprocess.DEVNULL)
    marks = json.loads((folder / "marks.json").read_text())
    lines = [line for trace in folder.glob("trace.*") for line in trace.read_text().splitlines()]
    return counted(lines, shared, marks)


def counted(lines: list[str], shared: Path, marks: dict[str, float]) -> Counts:
    """The operations of strace `lines` (-ttt -y) on paths under `shared`, by phase (from `marks`:
    when the task's training began and ended, and when each publication did) and kind."""
    counts = Counts(training_seconds=marks["end"] - marks["training"])
    published: set[str] = set()
    for line in lines:
        call = CALL.match(line)
        if call is None:  # a failed call counts: it asked the metadata server all the same
            continue
        name, at = call["name"], float(call["time"])
        path = _path_of(call, shared)
        if path is None or not path.is_relative_to(shared):
            continue
        kind = KINDS.get(name) or _open_kind(call["arguments"])
        if at < marks["training"]:
            phase = "start-up"
        elif at > marks["end"]:
            phase = "end"
        elif any(start <= at <= end for start, end in marks["publications"]):
            phase = "publication"
            if kind == "rename" and re.fullmatch(r"checkpoint-\d+", path.name):
                published.add(path.name)
        else:
            phase = "training"
        counts.add(phase, kind)
    counts.checkpoints = len(published)
    return counts


def _path_of(call: re.Match[str], shared: Path) -> Path | None:
    """The path a call touched: an fd's (strace -y), the result's (openat), a rename's target (what
    it publishes), or else its first path, relative to its directory's fd or to the job's working
    directory, `shared`."""
    arguments = call["arguments"]
    if call["name"] in FD_CALLS:
        named = FD_PATH.match(arguments)
        return Path(named.group(1)) if named else None
    if call["name"] == "openat" and call["path"]:
        return Path(call["path"][1:-1])
    relative = AT_PATH.findall(arguments) or [(str(shared), quoted) for quoted in QUOTED.findall(arguments)]
    if not relative:
        return None
    folder, name = relative[-1] if call["name"].startswith("rename") else relative[0]
    return Path(folder) / name if name else Path(folder)


def _open_kind(arguments: str) -> str:
    return "create" if re.search(r"O_CREAT|O_WRONLY|O_RDWR", arguments) else "open"


def main() -> None:
    parser = arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tasks", default=",".join(SETTINGS))
    parser.add_argument("--epochs", type=int, help="train each task for this many epochs (default: about a minute)")
    options = parser.parse_args()
    if options.job:
        job_process(options.job)
        return
    rows, results = [], {}
    for name in options.tasks.split(","):
        with tempfile.TemporaryDirectory(prefix=f"shared-storage-{name}-") as folder:
            counts = traced_job(name, Path(folder), options.epochs)
        minutes = counts.training_seconds / 60
        results[name] = {"training_seconds": counts.training_seconds, "checkpoints": counts.checkpoints}
        results[name] |= {phase: dict(kinds) for phase, kinds in counts.by_phase.items()}
        rows.append(
            [
                name,
                f"{counts.training_seconds:.1f}",
                str(counts.metadata("start-up")),
                f"{counts.writes('training') / minutes:.1f}" if minutes else "-",
                f"{counts.by_phase.get('training', Counter())['append'] / minutes:.1f}" if minutes else "-",
                f"{counts.metadata('publication') / max(counts.checkpoints, 1):.0f}",
                str(counts.metadata("end")),
            ]
        )
    print_table(
        "Operations in the shared working directory, one train job each",
        ["task", "training s", "start-up ops", "writes/min training", "appends/min", "ops/publication", "end ops"],
        rows,
    )
    save(options.json, "shared_storage", results)


if __name__ == "__main__":
    main()
