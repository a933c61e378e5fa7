"""A lab's own training program in plain PyTorch, run by scratchflow's `command` task: a bag-of-words
classifier for a folder-per-label text dataset (BBC News in the example config).

What makes it fit the lifecycle (docs/tasks.md, "Your own training code"):
- it reads its data from $SCRATCHFLOW_DATA_DIR and its parameters from the JSON file $SCRATCHFLOW_PARAMS;
- every $SCRATCHFLOW_SAVE_EVERY_SECONDS seconds of training (and every $SCRATCHFLOW_SAVE_EVERY_STEPS
  steps, where set), and when asked to stop ($SCRATCHFLOW_STOP_SIGNAL, USR1 unless the config says
  otherwise, or SIGTERM), it saves
  checkpoint-<step>/ under $SCRATCHFLOW_CHECKPOINT_DIR with everything that determines the rest of
  the run (weights, optimizer, step), and writes the file COMPLETE into it last;
- it resumes from $SCRATCHFLOW_RESUME_FROM, and because batches depend only on (seed, epoch), a
  resumed run ends with exactly the metrics of an uninterrupted one;
- it logs its curves to TensorBoard in $SCRATCHFLOW_TRACKING_DIR, from the step it resumes at on
  (purge_step drops what an interrupted piece logged after its last checkpoint);
- it writes its model and metrics.json (name -> number) into $SCRATCHFLOW_OUTPUT_DIR;
- in a halving search's rung ($SCRATCHFLOW_BUDGET_EPOCHS set), it stops when that many epochs are
  done, with a checkpoint, and writes validation.json (its validation split's metrics) instead.
"""

import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

environment = os.environ
params = json.loads(Path(environment["SCRATCHFLOW_PARAMS"]).read_text())
checkpoints = Path(environment["SCRATCHFLOW_CHECKPOINT_DIR"])
output = Path(environment["SCRATCHFLOW_OUTPUT_DIR"])
save_every_seconds = float(environment["SCRATCHFLOW_SAVE_EVERY_SECONDS"])
save_every_steps = int(environment.get("SCRATCHFLOW_SAVE_EVERY_STEPS") or 0)  # 0: by time alone
# One thread, whatever the job has ($OMP_NUM_THREADS): this model's matrices are small, so one thread
# is faster (13 s against 60 s for two epochs on a busy 2-core machine), and a CPU reduction split
# over several threads may split differently from one run to the next (the math libraries may use
# fewer threads than asked for when the machine is busy), which changes the last bits of the sums
# and so a resumed run's weights.
torch.set_num_threads(1)

stop_requested = False


def request_stop(signum, _frame):
    global stop_requested
    stop_requested = True


signal.signal(signal.Signals["SIG" + environment.get("SCRATCHFLOW_STOP_SIGNAL", "USR1")], request_stop)
signal.signal(signal.SIGTERM, request_stop)

# The data: one sub-folder per label, one text file per article. A fixed fifth of each label (by a
# hash of the file's name) is the test split, a tenth the validation split.
data = Path(environment["SCRATCHFLOW_DATA_DIR"])
files = sorted(path for path in data.rglob("*") if path.is_file() and len(path.relative_to(data).parts) == 2)
labels = sorted({path.parent.name for path in files})
features = params["features"]


def bag_of_words(text):
    vector = torch.zeros(features)
    for word in re.findall(r"[a-z]+", text.lower()):
        vector[int(hashlib.md5(word.encode()).hexdigest()[:8], 16) % features] += 1.0
    return torch.log1p(vector)


def split_of(path):
    tenth = int(hashlib.sha256(path.name.encode()).hexdigest()[:8], 16) % 10
    return "test" if tenth in (0, 5) else "validation" if tenth == 1 else "train"


inputs = torch.stack([bag_of_words(path.read_text(errors="replace")) for path in files])
targets = torch.tensor([labels.index(path.parent.name) for path in files])
splits = [split_of(path) for path in files]
train, validation, test = (
    torch.tensor([split == name for split in splits]) for name in ("train", "validation", "test")
)
train_x, train_y = inputs[train], targets[train]

torch.manual_seed(params["seed"])
model = torch.nn.Sequential(
    torch.nn.Linear(features, params["hidden"]), torch.nn.ReLU(), torch.nn.Linear(params["hidden"], len(labels))
)
optimizer = torch.optim.Adam(model.parameters(), lr=params["learning_rate"])
batch_size = params["batch_size"]
steps_per_epoch = -(-len(train_y) // batch_size)
total_steps = params["epochs"] * steps_per_epoch
# A halving search's rung trains only its share of the run's epochs (the schedule is the run's).
budget = environment.get("SCRATCHFLOW_BUDGET_EPOCHS")
stop_at = int(budget) * steps_per_epoch if budget else total_steps
step = 0

if environment["SCRATCHFLOW_RESUME_FROM"]:
    state = torch.load(Path(environment["SCRATCHFLOW_RESUME_FROM"]) / "state.pt")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"resumed at step {step} of {total_steps}", flush=True)
curves = SummaryWriter(environment["SCRATCHFLOW_TRACKING_DIR"], purge_step=step + 1)


def save_checkpoint():
    curves.flush()  # the curves up to this checkpoint are kept whatever happens next
    folder = checkpoints / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, folder / "state.pt")
    (folder / "COMPLETE").touch()  # last: the checkpoint is whole
    for old in sorted(checkpoints.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))[:-2]:
        for file in old.iterdir():
            file.unlink()
        old.rmdir()


last_saved = time.monotonic()
while step < stop_at:
    epoch, position = divmod(step, steps_per_epoch)
    order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(params["seed"] * 10_000 + epoch))
    batch = order[position * batch_size : (position + 1) * batch_size]
    loss = torch.nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if step % 20 == 0:
        print(f"step {step}/{total_steps} loss {loss.item():.4f}", flush=True)
        curves.add_scalar("train/loss", loss.item(), step)
    due = time.monotonic() - last_saved >= save_every_seconds or (save_every_steps and step % save_every_steps == 0)
    if due or step == stop_at or stop_requested:
        save_checkpoint()
        last_saved = time.monotonic()
    if stop_requested:
        print(f"stopping at step {step}: checkpoint saved", flush=True)
        sys.exit(0)

curves.close()


def evaluate(part):
    with torch.no_grad():
        logits = model(inputs[part])
    truth = targets[part]
    predicted = logits.argmax(dim=1)
    f1 = []
    for index in range(len(labels)):
        hits = ((predicted == index) & (truth == index)).sum().item()
        precision = hits / max((predicted == index).sum().item(), 1)
        recall = hits / max((truth == index).sum().item(), 1)
        f1.append(2 * precision * recall / (precision + recall) if hits else 0.0)
    return {
        "accuracy": (predicted == truth).float().mean().item(),
        "macro_f1": sum(f1) / len(f1),
        "loss": torch.nn.functional.cross_entropy(logits, truth).item(),
    }


output.mkdir(parents=True, exist_ok=True)
if budget:
    (output / "validation.json").write_text(json.dumps(evaluate(validation), indent=2))
    print(f"{budget} epoch(s) done: validation metrics written", flush=True)
    sys.exit(0)
tested = evaluate(test)
metrics = {
    "accuracy": tested["accuracy"],
    "macro_f1": tested["macro_f1"],
    "test_loss": tested["loss"],
    "steps": step,
}
torch.save(model.state_dict(), output / "model.pt")
(output / "metrics.json").write_text(json.dumps(metrics, indent=2))
print(f"test accuracy {metrics['accuracy']:.4f}", flush=True)
