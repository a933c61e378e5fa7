"""The one gate to a run's shared folders (scratchflow.lease.RunFolder): every write a train job makes
under checkpoints/<run_id>/ and results/runs/<run_id>/ is made through it, traced by Python's audit
hooks (each file opened for writing, renamed, removed or made, each program started on such a path)."""

from __future__ import annotations

import contextlib
import sys
import traceback
from pathlib import Path

import pytest
from scratchflow import lease
from scratchflow.files import write_json_atomically
from scratchflow.jobs import RunOutputs, TrainJob, archive_job, train_job

# Audit events that change a file or folder, and which of their arguments are paths.
WRITING_EVENTS = {
    "os.rename": (0, 1),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.link": (0, 1),
    "os.symlink": (0, 1),
    "os.truncate": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
    "shutil.copytree": (1,),
}
GATE_FILE = Path(lease.__file__).resolve()

# A program that trains as a command task's does: a checkpoint every 10 steps on scratch (its
# marker written last), then the model and its metrics.
PROGRAM = """
import json, os, pathlib
checkpoints = pathlib.Path(os.environ["SCRATCHFLOW_CHECKPOINT_DIR"])
for step in (10, 20, 30):
    checkpoint = checkpoints / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "weights.txt").write_text(str(step))
    (checkpoint / "COMPLETE").touch()
output = pathlib.Path(os.environ["SCRATCHFLOW_OUTPUT_DIR"])
(output / "model.txt").write_text("trained")
(output / "metrics.json").write_text(json.dumps({"accuracy": 0.5}))
"""


class WriteTracer:
    """Records each write under `folders` whose Python stack holds no frame of the gate's module."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = [str(folder.resolve()) for folder in folders]
        self.on = False
        self.bypassing: list[str] = []
        self.traced = 0

    def __call__(self, event: str, args: tuple) -> None:
        if not self.on:
            return
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(letter in mode for letter in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & 0o3  # os.open's O_WRONLY or O_RDWR
            )
            paths = [path] if writing else []
        elif event == "subprocess.Popen":
            paths = [word for word in args[1] if isinstance(word, str | bytes | Path)]
        else:
            paths = [args[index] for index in WRITING_EVENTS.get(event, ())]
        for path in paths:
            if isinstance(path, int) or not any(str(path).startswith(folder) for folder in self.folders):
                continue
            self.traced += 1
            stack = traceback.extract_stack(sys._getframe(1))
            if not any(Path(frame.filename).resolve() == GATE_FILE for frame in stack):
                caller = next(
                    f"{frame.filename}:{frame.lineno}" for frame in reversed(stack) if "audit" not in frame.name
                )
                self.bypassing.append(f"{event} {path} from {caller}")

    @contextlib.contextmanager
    def tracing(self):
        self.on = True
        try:
            yield self
        finally:
            self.on = False


@pytest.fixture(scope="module")
def tracer(tmp_path_factory) -> WriteTracer:
    """One audit hook for the module (a hook cannot be removed), on only while a test traces."""
    root = tmp_path_factory.mktemp("traced")
    hook = WriteTracer([root / "checkpoints", root / "results" / "runs"])
    sys.addaudithook(hook)
    hook.root = root
    return hook


def a_train_job(root: Path) -> TrainJob:
    data = root / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "example.txt").write_text("an example")
    dataset = {"name": "toy", "format": "folder", "path": str(data)}
    archive, manifest = root / "archives" / "toy.tar", root / "archives" / "toy.manifest.json"
    archive_job(dataset=dataset, archive=archive, manifest=manifest)
    (root / "program.py").write_text(PROGRAM)
    run = root / "results" / "runs" / "r1"
    return TrainJob(
        run_id="r1",
        task="command",
        identity={"dataset": dataset, "training": {"command": [sys.executable, str(root / "program.py")]}},
        resolved_config={},
        archive=archive,
        manifest=manifest,
        base_model=None,
        scratch_root=str(root / "scratch"),
        shared_folder=root / "checkpoints" / "r1",
        checkpointing={
            "keep": 1,
            "every_steps": 10,
            "every_minutes": 10,
            "stop_signal": "USR1",
            "stop_grace_seconds": 5,
        },
        threads=1,
        workflow_dir=root,
        tracking_dir=run / "tensorboard",
        tracking="tensorboard",
        log=root / "logs" / "r1.log",
        ends_with=RunOutputs(run / "model", run / "params.json", run / "record.json"),
        prediction_at_end=run / "predicted-in-training",
    )


def test_every_write_of_a_train_job_to_its_runs_folders_goes_through_the_gate(tracer, monkeypatch):
    """A whole train job in this process (the lease, the ledger, each checkpoint published and pruned,
    the progress, the model synced back, its prediction, the records): each of its writes under the
    run's folders is made from the gate's module. The tracer itself is tried on a write that bypasses the gate."""
    for variable in ("SCRATCHFLOW_STOP_SIGNAL", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # the job sets them
        monkeypatch.setenv(variable, "")
    job = a_train_job(tracer.root)
    job.log.parent.mkdir(parents=True)
    with tracer.tracing():
        train_job(job)
    assert tracer.traced > 20, "the job's writes were seen"
    assert tracer.bypassing == [], "\n".join(tracer.bypassing)
    assert (job.shared_folder / "checkpoint-30" / "COMPLETE").is_file() and job.ends_with.record.is_file()
    assert (job.prediction_at_end / "made.json").is_file(), "its prediction, published through the gate"

    with tracer.tracing():  # a writer that forgets the gate
        write_json_atomically({}, job.shared_folder / "notes.json")
    assert {line.split()[0] for line in tracer.bypassing} >= {"open", "os.rename"}, tracer.bypassing
