"""What DDP's bucket rebuild does to a resumed run, and what keeping the first layout costs.

Four processes (DDP over gloo on this CPU) train a small model on their own fixed batches, once
straight through and once in two pieces (a new DDP wrapper for the second, as a resumed job has),
with DDP as the Trainer gets it from scratchflow (`find_unused_parameters=True`: DDP keeps its first
bucket layout) and without (`False`: DDP rebuilds its buckets after its first step, in every
piece). Printed per setting: how many parameter tensors of the resumed run differ, bit for bit,
from the straight one's, and the time per step, as a ratio to `False` measured in the same run.
With more than 2 processes, a rebuilt layout sums a gradient's parts in another order in a
resumed piece's first step; 2 processes sum two numbers, in either order the same.

    .venv/bin/python benchmarks/ddp_resume.py [--steps 200] [--processes 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

SETTINGS = {"rebuilt (find_unused_parameters=False)": False, "kept (scratchflow)": True}


def new_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(1000, 64),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 16, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 5),
    )


def train(pieces: list[int], find_unused: bool) -> tuple[list[torch.Tensor], float]:
    """Train `pieces` steps in turn, each piece with a new DDP wrapper; the weights and the seconds
    per step."""
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    batches = [
        (torch.randint(0, 1000, (8, 16), generator=generator), torch.randint(0, 5, (8,), generator=generator))
        for _ in range(sum(pieces))
    ]
    model = new_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = iter(batches)
    started = time.perf_counter()
    for steps in pieces:
        wrapped = DistributedDataParallel(model, find_unused_parameters=find_unused)
        for _ in range(steps):
            inputs, labels = next(batch)
            loss = torch.nn.functional.cross_entropy(wrapped(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return [parameter.detach().clone() for parameter in model.parameters()], (time.perf_counter() - started) / sum(
        pieces
    )


def worker(steps: int) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    figures = {}
    for name, find_unused in SETTINGS.items():
        straight, seconds = train([steps], find_unused)
        resumed, _ = train([steps // 3, steps - steps // 3], find_unused)
        differing = sum(not torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))
        figures[name] = {"tensors_differing": differing, "tensors": len(straight), "seconds_per_step": seconds}
    if dist.get_rank() == 0:
        baseline = figures[next(iter(SETTINGS))]["seconds_per_step"]
        for name, figure in figures.items():
            figure["step_time_ratio"] = round(figure["seconds_per_step"] / baseline, 3)
            print(
                f"{name}: resumed run differs in {figure['tensors_differing']} of {figure['tensors']} tensors; "
                f"{1000 * figure['seconds_per_step']:.2f} ms a step, {figure['step_time_ratio']}x",
                flush=True,
            )
        print(json.dumps(figures))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.steps)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={arguments.processes}", __file__, "--worker", f"--steps={arguments.steps}"]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    main()
