"""Train a small MLP on a CSV of numbers in plain PyTorch: a lab's script of the usual shape (flags,
a loop, `torch.save` of a checkpoint dict, `--resume PATH`), written to be run by hand, and not for
scratchflow (tests/test_trainer_script.py changes a few lines of it to use scratchflow.program)."""

import argparse
import json

import pandas as pd
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="data/numbers.csv")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--save-every", type=int, default=100)
parser.add_argument("--checkpoint", default="checkpoint.pt")
parser.add_argument("--resume", default=None)
parser.add_argument("--out", default="model.pt")
parser.add_argument("--metrics", default="metrics.json")
args = parser.parse_args()
torch.set_num_threads(1)

torch.manual_seed(args.seed)
frame = pd.read_csv(args.data)
inputs = torch.tensor(frame.drop(columns="label").values, dtype=torch.float32)
targets = torch.tensor(frame["label"].values)
model = torch.nn.Sequential(
    torch.nn.Linear(inputs.shape[1], 32),
    torch.nn.ReLU(),
    torch.nn.Dropout(0.2),
    torch.nn.Linear(32, int(targets.max()) + 1),
)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
batch_size, step = 8, 0
steps_per_epoch = len(inputs) // batch_size
steps = args.epochs * steps_per_epoch
if args.resume:
    state = torch.load(args.resume)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
    torch.set_rng_state(state["rng"])

model.train()
while step < steps:
    epoch, batch = divmod(step, steps_per_epoch)
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(args.seed * 100_000 + epoch))
    rows = order[batch * batch_size : (batch + 1) * batch_size]
    loss = torch.nn.functional.cross_entropy(model(inputs[rows]), targets[rows])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if step % args.save_every == 0 or step == steps:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save({**state, "rng": torch.get_rng_state()}, args.checkpoint)

model.eval()
with torch.no_grad():
    logits = model(inputs)
metrics = {
    "train_loss": torch.nn.functional.cross_entropy(logits, targets).item(),
    "accuracy": (logits.argmax(dim=1) == targets).float().mean().item(),
}
torch.save(model.state_dict(), args.out)
with open(args.metrics, "w") as file:
    json.dump(metrics, file)
print(metrics)
