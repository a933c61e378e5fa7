"""A lab's own Hugging Face Trainer script under `task: command`, with checkpoints by time, pauses on
the stop signal and exact resume, in two depths (docs/tasks.md, "Your Hugging Face Trainer script"):

- **No line changed**: `command: [python, -m, scratchflow.trainer_script, train.py, ...]` runs the
  script as `__main__` with the Trainer patched before it starts (`launch`): the run's parameters
  that name `TrainingArguments` fields replace the script's values, its checkpoints go to the piece's
  scratch, the callbacks below join every Trainer, `train()` resumes from the piece's checkpoint,
  `save_model()` saves into the run's output folder, the last evaluation's and prediction's
  figures become its `metrics.json`, and the last prediction's rows its `predictions.csv` (a
  classifier's with its confusion matrix, which the report draws). Words `${SCRATCHFLOW_...}` in
  the command's arguments are the piece's variables (`--data ${SCRATCHFLOW_DATA_FILE}`).
- **A few lines**: the script imports this module and calls `training_arguments`, `callbacks`,
  `resume_from`, `output_dir`, `write_metrics`, `write_predictions` (and `data_file`, `model_dir`,
  `params`) itself.

Either way the callbacks end the program as a pause (exit 0, no metrics.json) when training ends after
a stop: the Trainer's `train()` would return normally, and the script go on to save and evaluate a
model half trained as if it had finished.

Outside scratchflow (no SCRATCHFLOW_RUN_ID: the script run by hand) each helper gives back what it
is given, and the launcher runs the script unpatched.

One training process: a script that starts several (torchrun, accelerate launch) is not driven."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import logging
import os
import random
import re
import runpy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The helpers a script calls at the few-lines depth, framework-free, are scratchflow.program's.
from scratchflow.program import (  # noqa: F401
    CHECKPOINT_MARKER,
    data_dir,
    data_file,
    end_as_diverged,
    end_if_stopped,
    flag_of,
    flag_words,
    model_dir,
    output_dir,
    params,
    piece,
    resume_from,
    under_scratchflow,
    write_metrics,
)

log = logging.getLogger("scratchflow.trainer_script")

MODULE = "scratchflow.trainer_script"
PREDICTIONS_FILE = "predictions.csv"  # in the run's model folder: the last `predict()`'s rows
VARIABLE = re.compile(r"\$\{(SCRATCHFLOW_[A-Z_]+)\}")


def argument_overrides(fields: set[str], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """What the run sets in `TrainingArguments`: its parameters that name a field (`fields`), and
    its checkpoints on scratch."""
    run = params()
    overrides = {key: value for key, value in run.items() if key in fields}
    overrides["output_dir"] = environ["SCRATCHFLOW_CHECKPOINT_DIR"]
    return overrides


def training_arguments(**fields: Any) -> Any:
    """`TrainingArguments(**fields)`, with the run's parameters that name a field instead of the
    script's values and its checkpoints on the piece's scratch."""
    from transformers import TrainingArguments

    if under_scratchflow():
        fields = {**fields, **argument_overrides(set(TrainingArguments.__dataclass_fields__))}
    return TrainingArguments(**fields)


def callbacks() -> list[Any]:
    """The Trainer callbacks that save by the piece's rules (by time and steps, after the last step,
    at a stop), mark each checkpoint complete once written whole, and stop at the end of the step at
    which the stop signal came; [] outside scratchflow."""
    if not under_scratchflow():
        return []
    from transformers import TrainerCallback

    from scratchflow.hf_trainer import StopOnDivergence, StopWhenAsked

    class MarkComplete(TrainerCallback):
        """After the Trainer has written a checkpoint the piece asked for (by its interval, at a stop,
        after the last step), its every file: COMPLETE, last, which has the piece publish it. The
        script's own saves (its save_strategy) stay on scratch unmarked: each publication costs shared
        storage a hundred or more operations, and the piece's interval bounds them. Never a second
        save of a step already saved: after a stop, the Trainer's epoch-end save (save_strategy
        "epoch") would write the checkpoint's files again while the piece copies it to shared storage."""

        def __init__(self, asking: StopWhenAsked) -> None:
            self.asking = asking
            self.saved_step: int | None = None

        def _once(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if control.should_save and state.global_step == self.saved_step:
                control.should_save = False

        on_step_end = on_epoch_end = _once

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.saved_step = state.global_step
            if state.global_step != self.asking.asked_save_at:
                return  # the script's own
            if state.is_world_process_zero:
                (Path(args.output_dir) / f"checkpoint-{state.global_step}" / CHECKPOINT_MARKER).touch()
            piece().saved(state.global_step)

    class EvaluationLeavesRandomStateAlone(TrainerCallback):
        """An evaluation draws from the global random generators (a DataLoader's iterator takes its
        seed from torch's), so the steps after it trained with other dropout than those of a run
        resumed from a checkpoint saved before it (at an epoch's last step, then the epoch's
        evaluation): the generators are put back as they were before each evaluation during
        training. (Comes after the Trainer's own callbacks, which ask for the evaluation.)"""

        def __init__(self) -> None:
            self.before: tuple[Any, ...] | None = None

        def _before_evaluation(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.before = random_states() if control.should_evaluate else None

        on_step_end = on_epoch_end = _before_evaluation

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.before is not None:
                restore_random_states(self.before)
                self.before = None

    class EndAsPause(TrainerCallback):
        """After a stop, `train()` would return as if done, and the script go on to save and evaluate
        a model half trained: the program ends here instead, its checkpoint saved. So it does after
        the training diverged (StopOnDivergence), the run ending diverged."""

        def __init__(self, divergence: StopOnDivergence) -> None:
            self.divergence = divergence

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.divergence.diverged_at is not None:
                end_as_diverged(self.divergence.diverged_at, self.divergence.detail(state))
            end_if_stopped()

    stop, divergence = StopWhenAsked(piece()), StopOnDivergence()  # type: ignore[arg-type]
    return [stop, EvaluationLeavesRandomStateAlone(), MarkComplete(stop), divergence, EndAsPause(divergence)]


def random_states() -> tuple[Any, ...]:
    """Python's, NumPy's and torch's global random states (every GPU's too)."""
    import numpy
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return random.getstate(), numpy.random.get_state(), torch.get_rng_state(), cuda


def restore_random_states(states: tuple[Any, ...]) -> None:
    import numpy
    import torch

    python, numpy_state, torch_state, cuda = states
    random.setstate(python)
    numpy.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


# The launcher: the script unchanged.


def training_argument_fields() -> set[str]:
    """The fields of transformers' TrainingArguments, read from its source without importing it (an
    import costs seconds: this runs where the workflow starts)."""
    spec = importlib.util.find_spec("transformers.training_args")
    if spec is None or spec.origin is None:
        raise ImportError("transformers is not installed in the workflow's environment")
    tree = ast.parse(Path(spec.origin).read_text())
    (arguments,) = (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments")
    return {
        node.target.id
        for node in arguments.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not node.target.id.startswith("_")
    }


def script_options(tree: ast.AST) -> set[str]:
    """The `--options` a script's argparse declares (`add_argument("--max-length", ...)`)."""
    return {
        str(argument.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
        for argument in node.args
        if isinstance(argument, ast.Constant) and str(argument.value).startswith("--")
    }


def makes_a_trainer(tree: ast.AST) -> bool:
    """Whether the script calls a Trainer (`Trainer(...)`, `SFTTrainer(...)`, a subclass of its own)."""
    called = (node.func for node in ast.walk(tree) if isinstance(node, ast.Call))
    return any(str(getattr(func, "id", None) or getattr(func, "attr", "")).endswith("Trainer") for func in called)


def launched_script(argv: list[str]) -> str | None:
    """The script `python -m scratchflow.trainer_script SCRIPT ...` runs; None for another command."""
    for index in range(len(argv) - 2):
        if argv[index : index + 2] == ["-m", MODULE]:
            return argv[index + 2]
    return None


def script_problem(script: Path, keys: list[str]) -> str | None:
    """Why the launcher cannot drive `script` with the run's parameters `keys`, in one line naming the
    config key; None if it can. Each key must name a TrainingArguments field or a flag of the script's."""
    try:
        tree = ast.parse(script.read_text(), str(script))
    except SyntaxError as error:
        return f"training.command: {script} does not parse ({error.msg}, line {error.lineno})"
    if not makes_a_trainer(tree):
        return (
            f"training.command: {script} makes no Trainer (no call of a class named *Trainer): use task: command "
            f"without {MODULE}"
        )
    fields, options = training_argument_fields(), script_options(tree)
    unknown = [key for key in keys if key not in fields and flag_of(key, options) is None]
    if unknown:
        flags = {option.lstrip("-").replace("-", "_") for option in options}
        near = difflib.get_close_matches(unknown[0], sorted(fields | flags), n=1)
        return (
            f"training.{unknown[0]}: {MODULE} gives a parameter to the Trainer's TrainingArguments field of "
            f"its name or to the script's --{unknown[0].replace('_', '-')} flag, and {script.name} has neither"
            + (f" (did you mean {near[0]!r}?)" if near else "")
        )
    return None


def expanded(words: list[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """`${SCRATCHFLOW_...}` in the command's words: the piece's variables."""
    return [VARIABLE.sub(lambda match: environ.get(match.group(1), ""), word) for word in words]


class Launched:
    """The Trainer patched for an unchanged script: see the module's docstring."""

    def __init__(self) -> None:
        self.evaluated: dict[str, Any] = {}
        self.predicted: Any = None  # the last PredictionOutput
        self.trainer: Any = None
        self.model_saved = False

    def patch(self) -> None:
        from transformers import Trainer, TrainingArguments

        overrides = argument_overrides(set(TrainingArguments.__dataclass_fields__))
        launched = self
        post_init, init = TrainingArguments.__post_init__, Trainer.__init__
        train, evaluate, predict, save_model = Trainer.train, Trainer.evaluate, Trainer.predict, Trainer.save_model

        def arguments_post_init(self: Any) -> None:
            for name, value in overrides.items():
                setattr(self, name, value)
            post_init(self)

        def trainer_init(self: Any, *arguments: Any, **keywords: Any) -> None:
            init(self, *arguments, **keywords)
            for callback in callbacks():
                self.add_callback(callback)
            launched.trainer = self

        def trainer_train(self: Any, resume_from_checkpoint: Any = None, *arguments: Any, **keywords: Any) -> Any:
            return train(self, resume_from(), *arguments, **keywords)

        def trainer_evaluate(self: Any, *arguments: Any, **keywords: Any) -> Any:
            metrics = evaluate(self, *arguments, **keywords)
            launched.evaluated = metrics
            return metrics

        def trainer_predict(self: Any, *arguments: Any, **keywords: Any) -> Any:
            output = predict(self, *arguments, **keywords)
            launched.predicted = output
            return output

        # The Trainer's own parameter names, `output_dir` (shadowing the helper's) included.
        def trainer_save_model(self: Any, output_dir: str | None = None, _internal_call: bool = False) -> None:  # noqa: F811
            if _internal_call:  # a checkpoint's model
                save_model(self, output_dir, _internal_call)
                return
            log.info("saving the model into the run's output folder, not %s", output_dir or self.args.output_dir)
            save_model(self, os.environ["SCRATCHFLOW_OUTPUT_DIR"], _internal_call)
            launched.model_saved = True

        TrainingArguments.__post_init__ = arguments_post_init
        Trainer.__init__, Trainer.train = trainer_init, trainer_train
        Trainer.evaluate, Trainer.predict, Trainer.save_model = trainer_evaluate, trainer_predict, trainer_save_model

    def finish(self) -> None:
        """After the script's end: the model saved if it saved none, and its figures as metrics.json."""
        if self.trainer is None:
            raise SystemExit(f"{MODULE}: the script made no Trainer, so there is nothing to record")
        if not self.model_saved:
            self.trainer.save_model()
        evaluated = self.evaluated or next(
            (entry for entry in reversed(self.trainer.state.log_history) if "eval_loss" in entry), {}
        )
        if not evaluated and self.predicted is None:
            raise SystemExit(f"{MODULE}: the script evaluated nothing, so the run has no metrics")
        write_metrics(evaluated)
        if self.predicted is not None:
            write_predictions(self.predicted, getattr(self.trainer.model.config, "id2label", None))


def write_predictions(output: Any, id2label: Mapping[int, str] | None = None) -> Any:
    """A `Trainer.predict()` output as the run's predictions.csv (`prediction_table`), and its figures
    and a classifier's confusion matrix added to metrics.json; nothing by hand. Returns `output`, so
    that it wraps the call: `scratchflow.write_predictions(trainer.predict(test))`."""
    folder = os.environ.get("SCRATCHFLOW_OUTPUT_DIR")
    if folder:
        table, confusion = prediction_table(output, id2label)
        table.to_csv(Path(folder) / PREDICTIONS_FILE, index=False)
        write_metrics(output.metrics or {}, detail=confusion)
    return output


def prediction_table(output: Any, id2label: Mapping[int, str] | None) -> tuple[Any, dict[str, Any]]:
    """A `Trainer.predict()` output as the rows of predictions.csv (`row`, `label`, `predicted`, and
    for a classifier's logits `confidence`, labels by the model's names) and, for a classifier with
    labels, its confusion matrix as metrics.json's detail (`{}` otherwise)."""
    import numpy as np
    import pandas as pd

    from scratchflow.classification import classification_metrics

    scores = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
    scores = np.asarray(scores)
    truth = None if output.label_ids is None else np.asarray(output.label_ids)
    table = pd.DataFrame({"row": np.arange(len(scores))})
    if scores.ndim == 2 and scores.shape[1] > 1:  # a classifier's logits
        names = [str((id2label or {}).get(index, index)) for index in range(scores.shape[1])]
        chosen = scores.argmax(axis=1)
        exponentials = np.exp(scores - scores.max(axis=1, keepdims=True))
        if truth is not None and truth.ndim == 1:
            table["label"] = [names[index] for index in truth]
        table["predicted"] = [names[index] for index in chosen]
        table["confidence"] = np.round(exponentials.max(axis=1) / exponentials.sum(axis=1), 6)
        if "label" in table:
            metrics = classification_metrics(list(table["label"]), list(table["predicted"]), names)
            return table, {"confusion_matrix": metrics["confusion_matrix"]}
        return table, {}
    values = scores.reshape(len(scores), -1)
    if truth is not None and truth.size == len(scores):
        table["label"] = truth.reshape(-1)
    for column in range(values.shape[1]):
        table["predicted" if values.shape[1] == 1 else f"predicted_{column}"] = values[:, column]
    return table, {}


def launch(argv: list[str]) -> None:
    """Run `argv[0]`, a Trainer script, as `__main__` with `argv[1:]` (and the run's flag
    parameters), patched under scratchflow."""
    if not argv:
        raise SystemExit(f"usage: python -m {MODULE} SCRIPT [ARGUMENTS ...]")
    script = Path(argv[0])
    words = expanded(argv[1:])
    launched = None
    if under_scratchflow():
        piece()  # its stop handlers, before the script's slow imports
        said = logging.StreamHandler()  # its own: the script's logging stays as the script sets it
        said.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(said)
        log.setLevel(logging.INFO)
        from transformers import TrainingArguments

        fields = set(TrainingArguments.__dataclass_fields__)  # a parameter that names one goes there, not to a flag
        run = {key: value for key, value in params().items() if key not in fields}
        words += flag_words(run, script_options(ast.parse(script.read_text())))
        launched = Launched()
        launched.patch()
    sys.argv = [str(script), *words]
    # The script's folder first, as `python script.py` has it, instead of the working directory that
    # `-m` put there: on a cluster that is the shared folder, and every import the script makes
    # would look into it first (1,295 stats in a minute of a tiny BERT's training, benchmarks 18).
    sys.path[0] = str(script.resolve().parent)
    runpy.run_path(str(script), run_name="__main__")
    if launched is not None:
        launched.finish()


if __name__ == "__main__":
    launch(sys.argv[1:])
