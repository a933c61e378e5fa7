"""What the Hugging Face tasks share: a Trainer that resumes exactly, hands each checkpoint it saves
to the piece, and stops at the end of the step at which the piece is asked to stop."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments
from transformers.integrations import TensorBoardCallback, WandbCallback
from transformers.utils import is_torch_tf32_available

from scratchflow.checkpoints import step_of
from scratchflow.classification import TRAINER_CHECKPOINT_MARKER, classification_metrics
from scratchflow.failures import Diverged
from scratchflow.tasks import TrainContext
from scratchflow.tracking import console_log, open_writer, progress_line, wandb_environment, wandb_run

log = logging.getLogger(__name__)


class CheckpointSaved(TrainerCallback):
    """After the trainer saves a checkpoint on scratch (each process its part), the piece copies it
    to shared storage."""

    def __init__(self, context: TrainContext) -> None:
        self.context = context

    def on_save(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.context.checkpoint_saved(Path(args.output_dir) / f"checkpoint-{state.global_step}")


class PrintLogsOnce(PrinterCallback):
    """The Trainer's metrics lines, printed by the job's first process. The Trainer's own printer
    prints on the first process of each node, and every node's output reaches the job's log: a job of
    two nodes logged each line twice."""

    def on_log(self, args: TrainingArguments, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            super().on_log(args, state, control, logs=logs, **kwargs)


# In a checkpoint, one per training process: the training loss summed since the last logged step.
LOSS_SINCE_LOGGED = "loss_since_logged_{rank}.pt"


class ExactlyResumableTrainer(Trainer):
    """A Trainer that a resume does not change, in its weights or its curves.

    - Its evaluations leave the global random state alone. A DataLoader draws each iterator's seed
      from the global generator unless it has its own; the evaluation at an epoch's end would then
      move the dropout of the next epoch in an uninterrupted run, but not in one resumed from a
      checkpoint of that epoch's last step (its random state is the one saved before the
      evaluation), and the two would end differently.
    - A checkpoint holds each process's loss summed since the last logged step, and a resume goes
      on from it: the first loss logged after a resume from a step between two logging steps then
      averages the same steps, summed in the same order, as the uninterrupted run's; it also holds
      the sum of the losses logged so far, so the summary `train_loss` as training ends covers every
      piece's steps, as the uninterrupted run's does.
    - Its losses are the model's: the mean over each process's batch, averaged over the processes.
      The Trainer takes a model whose `forward` accepts `**kwargs` to divide its loss by the items of
      the whole global batch (`num_items_in_batch`), and so multiplies it by the number of
      processes. A classification head returns the mean over its own batch and ignores that count:
      the logged training and validation losses, and the gradients, came out that many times too
      large.
    - Its validation loss is the mean cross-entropy over the validation examples, each counted once,
      computed from the gathered logits. The Trainer's own figure gives each example its batch's
      mean loss; with several processes the last batch is filled up with examples from the start of
      the split, so it was off whenever the processes' batches do not divide the split."""

    # The Trainer's own, set as training starts: the loss summed since the last logged step, that
    # step, and the sum of the losses logged so far.
    _tr_loss: torch.Tensor
    _globalstep_last_logged: int
    _total_loss_scalar: float

    def __init__(self, *arguments: Any, **keywords: Any) -> None:
        super().__init__(*arguments, **keywords)
        self.model_accepts_loss_kwargs = False
        self.remove_callback(PrinterCallback)
        self.add_callback(PrintLogsOnce)

    def evaluation_loop(self, *arguments: Any, **keywords: Any) -> Any:
        output = super().evaluation_loop(*arguments, **keywords)
        if output.predictions is not None and output.label_ids is not None:
            prefix = keywords.get("metric_key_prefix", "eval")
            output.metrics[f"{prefix}_loss"] = mean_cross_entropy(output.predictions, output.label_ids)
        return output

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        loader = super().get_eval_dataloader(eval_dataset)
        # accelerate's wrapper iterates the DataLoader it was prepared from.
        getattr(loader, "base_dataloader", loader).generator = torch.Generator().manual_seed(self.args.seed)
        return loader

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        torch.save(
            {
                "loss": self._tr_loss.detach().cpu(),
                "last_logged_step": self._globalstep_last_logged,
                "total_logged": self._total_loss_scalar,
            },
            Path(output_dir) / LOSS_SINCE_LOGGED.format(rank=self.args.process_index),
        )

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Called once as a resume starts training, after the loss was set to zero."""
        super()._load_rng_state(checkpoint)
        saved = Path(checkpoint or "") / LOSS_SINCE_LOGGED.format(rank=self.args.process_index)
        if checkpoint and saved.is_file():
            state = torch.load(saved)
            self._tr_loss = state["loss"].to(self._tr_loss.device)
            self._globalstep_last_logged = state["last_logged_step"]
            # Checkpoints written before this was saved resume with the piece's own summary.
            self._total_loss_scalar = state.get("total_logged", 0.0)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "train_loss" in logs:  # the summary as training ends: over every piece's steps, not this piece's
            logs["train_loss"] = self._total_loss_scalar / max(self.state.global_step, 1)
        super().log(logs, start_time)


def budget_step(max_steps: int, epochs: int, budget_epochs: int) -> int:
    """The step at which `budget_epochs` of a training of `epochs` epochs (`max_steps` steps) end."""
    return max_steps // epochs * budget_epochs


class StopWhenAsked(TrainerCallback):
    """Saves a checkpoint at the end of a step when the piece says one is due, and stops after
    saving one at the end of the step at which the piece is asked to stop; also saves one after the
    last step, so that a run whose job dies after training resumes from its end
    instead of from zero. With `budget_epochs` (a halving search's rung), it stops the same way at
    the end of that epoch, its evaluation done."""

    def __init__(self, context: TrainContext) -> None:
        self.context = context
        self.asked = False  # the piece was asked to stop
        self.stopping = False
        self.budget_step: int | None = None
        self.save_after_evaluation = False
        self.asked_save_at: int | None = None  # the last step whose checkpoint the piece asked for

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if self.context.budget_epochs is not None:
            self.budget_step = budget_step(state.max_steps, int(args.num_train_epochs), self.context.budget_epochs)

    @property
    def at_budget(self) -> bool:
        return self.budget_step is not None and not self.asked and self.stopping

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        stopping = self.asked = self.context.stop_requested()  # every process, every step: they agree
        due = self.context.checkpoint_due(state.global_step)  # the same
        if self.budget_step is not None and state.global_step >= self.budget_step:
            stopping = True  # the epoch's evaluation still runs: the Trainer stops after it
        if stopping or due or state.global_step >= state.max_steps:
            control.should_save = True
            self.asked_save_at = state.global_step
        if stopping:
            control.should_training_stop = True
            self.stopping = True
        if control.should_save and args.eval_strategy == "epoch" and float(state.epoch).is_integer():
            # An epoch's last step: its checkpoint waits for the epoch's evaluation (on_epoch_end),
            # so a piece killed during that evaluation resumes from the checkpoint before and
            # evaluates again, instead of resuming past an evaluation that never happened.
            control.should_save = False
            self.save_after_evaluation = True

    # A stop leaves the curves as if it had not happened: no evaluation at a step inside an epoch
    # (the Trainer ends the epoch early when it stops), and no summary of the piece.
    def on_epoch_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopping and not float(state.epoch).is_integer():
            control.should_evaluate = False
        if self.save_after_evaluation:
            control.should_save = True
            self.save_after_evaluation = False

    def on_log(self, args: TrainingArguments, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.stopping and logs is not None and "train_runtime" in logs:
            logs.clear()  # the same dict goes on to TensorBoard and W&B, which come after this callback


class StopOnDivergence(TrainerCallback):
    """Stops the training at the end of the first step after which the model's weights are no longer
    finite (its loss became NaN or infinite: the optimizer's step then makes every weight NaN),
    before any checkpoint of that step is saved or any evaluation run: `diverged_at` says the step.
    One small trainable parameter is looked at after each step; data-parallel processes hold the same
    weights, so they stop at the same step. (The loss alone would not do: the Trainer logs a window
    of NaN losses as 0.0, `logging_nan_inf_filter`.) Comes after every callback that asks for a
    save or an evaluation."""

    def __init__(self) -> None:
        self.watched: torch.Tensor | None = None
        self.diverged_at: int | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> None:
        trainable = [parameter for parameter in model.parameters() if parameter.requires_grad] if model else []
        self.watched = min(trainable, key=lambda parameter: parameter.numel()) if trainable else None

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        watched = self.watched
        if self.diverged_at is None and watched is not None and not bool(torch.isfinite(watched.detach()).all()):
            self.diverged_at = state.global_step
        self._stop(control)

    def on_epoch_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self._stop(control)

    def _stop(self, control: Any) -> None:
        if self.diverged_at is not None:
            control.should_training_stop = True
            control.should_save = control.should_evaluate = control.should_log = False

    def detail(self, state: Any) -> str:
        """What diverged, with the last loss the Trainer logged before it."""
        losses = [(entry["step"], entry["loss"]) for entry in state.log_history if "loss" in entry]
        before = f"; the last loss logged: {losses[-1][1]:.4g} at step {losses[-1][0]}" if losses else ""
        return f"its weights became NaN or infinite (the loss diverged){before}"


class ProgressLog(TrainerCallback):
    """Log lines (rank 0): the first step of a piece (how long the job took to start training), a
    line every `logging_steps` with step/N, loss, speed and time left (also on the console, with the
    run's id, and reported to the run's checkpoint folder, for the grid's status), and the piece's
    speed. N is where the job stops: a rung's job (`budget_epochs`) stops at its rung's end."""

    def __init__(self, context: TrainContext) -> None:
        self.context = context
        self.end_step = 0  # where this job stops: the training's last step, or its rung's
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.end_step = state.max_steps
        if self.context.budget_epochs is not None:
            self.end_step = budget_step(state.max_steps, int(args.num_train_epochs), self.context.budget_epochs)

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if self.first is None:
            self.first = self.last = (state.global_step, time.perf_counter())
            if state.is_world_process_zero:
                log.info("first training step of this piece done: step %d of %d", state.global_step, self.end_step)

    def on_log(self, args: TrainingArguments, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if "loss" not in (logs or {}) or self.last is None or not state.is_world_process_zero:
            return
        step, at = self.last
        now = time.perf_counter()
        if state.global_step <= step:
            return
        steps_per_second = (state.global_step - step) / (now - at)
        self.last = (state.global_step, now)
        progress = {
            "step": state.global_step,
            "max_steps": self.end_step,
            "loss": logs["loss"],
            "samples_per_second": round(steps_per_second * args.per_device_train_batch_size * args.world_size, 2),
            "seconds_left": round((self.end_step - state.global_step) / steps_per_second, 1),
            "at": time.time(),
        }
        line = progress_line(
            *(progress[key] for key in ("step", "max_steps", "loss", "samples_per_second", "seconds_left"))
        )
        log.info(line)
        console_log.info("run %s: %s", self.context.run_id, line)
        self.context.report_progress(progress)

    def on_train_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if self.first is None or state.global_step <= self.first[0] or not state.is_world_process_zero:
            return
        step, at = self.first
        examples = (state.global_step - step) * args.per_device_train_batch_size * args.world_size
        log.info(
            "steps %d to %d: %.1f samples/s (evaluations and checkpoints included) over %d process(es)",
            step,
            state.global_step,
            examples / (time.perf_counter() - at),
            args.world_size,
        )


def dataloader_workers(on_gpu: bool, cpus: int) -> int:
    """Batch-preparing processes of a training process that has `cpus` CPUs (the job's on its node,
    Slurm's --cpus-per-task, shared by the node's training processes: context.threads).

    On a GPU node, one CPU drives each GPU and the others prepare batches (at most 8 per GPU). On
    CPU, every CPU computes the model: a worker process would take a CPU from it
    (benchmarks/throughput.py)."""
    if not on_gpu:
        return 0
    return max(0, min(8, cpus - 1))


def mean_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """A classification head's loss over a whole split: the mean over its examples."""
    return torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels)).item()


def accuracy_and_macro_f1(evaluation: Any) -> dict[str, float]:
    """The validation split's figures that a test split's are ranked by (classification_metrics)."""
    logits, labels = evaluation
    classes = list(range(logits.shape[-1]))
    metrics = classification_metrics(list(labels), list(np.argmax(logits, axis=-1)), classes)
    return {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"]}


def training_arguments(context: TrainContext, has_validation: bool, **task_specific: Any) -> TrainingArguments:
    """The Trainer's settings from the run's parameters; checkpoints go to scratch."""
    params = context.params
    on_gpu = torch.cuda.is_available()
    if params.get("fsdp") and not on_gpu:
        raise ValueError(f"training.fsdp: {params['fsdp']!r} shards the model across GPUs, and this job has none")
    workers = dataloader_workers(on_gpu, context.threads)
    return TrainingArguments(
        output_dir=str(context.checkpoint_dir),
        learning_rate=params["learning_rate"],
        per_device_train_batch_size=params["batch_size"],
        per_device_eval_batch_size=params["batch_size"] * 2,
        num_train_epochs=params["epochs"],
        weight_decay=params["weight_decay"],
        warmup_steps=params["warmup_ratio"],  # a float below 1 is a ratio of all steps
        seed=params["seed"],
        bf16=params["bf16"],
        tf32=params["tf32"] and on_gpu and is_torch_tf32_available(),
        use_cpu=not on_gpu,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,
        dataloader_pin_memory=on_gpu,
        eval_strategy="epoch" if has_validation else "no",
        save_strategy="no",  # StopWhenAsked saves: when the piece says a checkpoint is due, or a stop
        save_total_limit=context.keep_checkpoints,
        logging_steps=10,
        disable_tqdm=True,
        report_to="none",
        # Not to find unused parameters (there are none), but because DDP then keeps its first
        # bucket layout: otherwise it rebuilds its gradient buckets after its first step, so the
        # first step of every resumed piece sums each gradient over the processes in another
        # order than the uninterrupted run's (with more than 2 processes, where the order of a sum
        # changes its last bits), and the weights drift apart (benchmarks/ddp_resume.py).
        ddp_find_unused_parameters=True,
        fsdp=params.get("fsdp", ""),
        fsdp_config=params.get("fsdp_config"),
        **task_specific,
    )


def train(
    context: TrainContext, args: TrainingArguments, **trainer_arguments: Any
) -> tuple[Trainer, dict[str, Any] | None]:
    """Build the Trainer (`args`, and model, datasets, collator: `trainer_arguments`), resume it from
    `context.resume_from`, train until done or asked to stop, and return it with the training
    figures; None for the figures when it stopped on request (its checkpoint saved). Diverged is
    raised where its weights stopped being finite (StopOnDivergence)."""
    stop, divergence = StopWhenAsked(context), StopOnDivergence()
    trainer = ExactlyResumableTrainer(
        args=args,
        compute_metrics=accuracy_and_macro_f1,
        # CheckpointSaved comes after StopWhenAsked has asked for the checkpoint it hands on, and
        # StopOnDivergence after it, to take a diverged step's back.
        callbacks=[stop, divergence, CheckpointSaved(context), ProgressLog(context)],
        **trainer_arguments,
    )
    resume_from = context.resume_from
    if resume_from and context.budget_epochs and reached_budget(resume_from, context.budget_epochs):
        # A rung job killed after its last checkpoint: evaluate that checkpoint, train no further.
        trainer._load_from_checkpoint(str(resume_from))
        evaluation = trainer.evaluate()
        return trainer, {"validation": validation_figures(evaluation)}
    with curves_logged(trainer, context, resume_from):
        result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if divergence.diverged_at is not None:
        raise Diverged(divergence.diverged_at, divergence.detail(trainer.state))
    if result.global_step < trainer.state.max_steps and not stop.at_budget:
        return trainer, None
    return trainer, training_figures(trainer, result)


@contextmanager
def curves_logged(trainer: Trainer, context: TrainContext, resume_from: Path | None) -> Iterator[None]:
    """The first rank logs the curves (on scratch: the piece publishes them to the run's folder with
    each checkpoint): to TensorBoard, continued from where this piece resumes, and with `tracking:
    wandb` to a W&B offline run of this piece as well (a piece stopped on request ends its training
    normally, so its W&B run ends as finished)."""
    if not trainer.is_world_process_zero():
        yield
        return
    writer = open_writer(context.tracking_dir, step_of(resume_from) if resume_from else None)
    trainer.add_callback(TensorBoardCallback(writer))
    if context.tracking != "wandb":
        yield
        return
    environment = wandb_environment(context.tracking_dir.parent, context.run_id, context.piece)
    with wandb_run(environment, {"run_id": context.run_id, **context.params}):
        trainer.add_callback(NeverFails(WandbCallback()))
        yield


class NeverFails(TrainerCallback):
    """Another callback, whose errors are logged once and then silence it: tracking must never stop
    training. (wandb's service process dies of the SIGTERM that Slurm sends every process of a job it
    cancels, and logging to it raises while the piece is saving its checkpoint to pause.)"""

    def __init__(self, callback: TrainerCallback) -> None:
        self.callback: TrainerCallback | None = callback

    def _forward(self, event: str, *arguments: Any, **keywords: Any) -> None:
        if self.callback is None:
            return
        try:
            getattr(self.callback, event)(*arguments, **keywords)
        except Exception as error:
            log.warning(
                "%s stopped logging (%s: %s); training goes on",
                type(self.callback).__name__,
                type(error).__name__,
                error,
            )
            self.callback = None


def _forwarding(event: str) -> Any:
    def forward(self: NeverFails, *arguments: Any, **keywords: Any) -> None:
        self._forward(event, *arguments, **keywords)

    forward.__name__ = event
    return forward


for event in (name for name in vars(TrainerCallback) if name.startswith("on_")):
    setattr(NeverFails, event, _forwarding(event))


def training_figures(trainer: Trainer, result: Any) -> dict[str, Any]:
    """The training's figures for the record (its piece adds the step figures)."""
    history = trainer.state.log_history
    logged_losses = [entry["loss"] for entry in history if "loss" in entry]
    figures: dict[str, Any] = {
        # Over all pieces of a resumed run (the trainer's own figure covers only the last piece).
        "train_loss": float(np.mean(logged_losses)) if logged_losses else result.training_loss,
        "train_examples": len(trainer.train_dataset),
        "validation_examples": len(trainer.eval_dataset) if trainer.eval_dataset is not None else 0,
    }
    evaluations = [entry for entry in history if "eval_loss" in entry]
    if evaluations:
        figures["validation"] = validation_figures(evaluations[-1])
    return figures


def validation_figures(evaluation: dict[str, Any]) -> dict[str, float]:
    """The metrics of an evaluation on the validation split, without the `eval_` prefix or timings."""
    timings = ("runtime", "samples_per_second", "steps_per_second", "model_preparation_time")
    return {
        name.removeprefix("eval_"): value
        for name, value in evaluation.items()
        if name.startswith("eval_") and name.removeprefix("eval_") not in timings
    }


def reached_budget(checkpoint: Path, budget_epochs: int) -> bool:
    """Whether `checkpoint` lies at or past the end of epoch `budget_epochs` (its trainer state's)."""
    state = json.loads((checkpoint / TRAINER_CHECKPOINT_MARKER).read_text())
    return state["global_step"] >= budget_step(state["max_steps"], int(state["num_train_epochs"]), budget_epochs)
