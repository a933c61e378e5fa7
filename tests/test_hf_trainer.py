"""How the trainer uses the job's CPUs, and what keeps a resumed run on the uninterrupted one's path."""

import pytest
import torch
from scratchflow import hf_trainer
from transformers import TrainingArguments


@pytest.mark.parametrize(("cpus", "workers"), [(1, 0), (2, 1), (12, 8), (64, 8)])
def test_on_a_gpu_node_every_cpu_but_one_prepares_batches_at_most_8(cpus, workers):
    assert hf_trainer.dataloader_workers(on_gpu=True, cpus=cpus) == workers


def test_on_cpu_every_cpu_computes_the_model_and_none_prepares_batches():
    assert hf_trainer.dataloader_workers(on_gpu=False, cpus=16) == 0


class Doubler(torch.nn.Module):
    def forward(self, x, labels=None):
        return {"loss": ((2 * x - labels) ** 2).mean(), "logits": 2 * x}


def test_an_evaluation_leaves_the_random_state_that_a_checkpoint_saves_alone(tmp_path):
    """The evaluation at an epoch's end runs after the checkpoint of that epoch's last step is saved:
    if it drew from the global generator, a run resumed there would train the next epochs with
    other dropout than the uninterrupted run."""
    examples = [{"x": torch.tensor([float(i)]), "labels": torch.tensor([2.0 * i])} for i in range(8)]
    arguments = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_eval_batch_size=4
    )
    trainer = hf_trainer.ExactlyResumableTrainer(model=Doubler(), args=arguments, eval_dataset=examples)
    before = torch.get_rng_state()
    trainer.evaluate()
    assert torch.equal(torch.get_rng_state(), before)
