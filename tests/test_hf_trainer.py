"""How the trainer uses the job's CPUs."""

import pytest
from scratchflow import hf_trainer


@pytest.mark.parametrize(("cpus", "workers"), [(1, 0), (2, 1), (12, 8), (64, 8)])
def test_on_a_gpu_node_every_cpu_but_one_prepares_batches_at_most_8(monkeypatch, cpus, workers):
    monkeypatch.setattr(hf_trainer.os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    assert hf_trainer.dataloader_workers(on_gpu=True) == workers


def test_on_cpu_every_cpu_computes_the_model_and_none_prepares_batches(monkeypatch):
    monkeypatch.setattr(hf_trainer.os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert hf_trainer.dataloader_workers(on_gpu=False) == 0


def test_the_cpus_of_a_node_are_shared_by_its_training_processes(monkeypatch):
    monkeypatch.setattr(hf_trainer.os, "sched_getaffinity", lambda _pid: set(range(48)))
    assert hf_trainer.dataloader_workers(on_gpu=True, processes_on_node=4) == 8  # 12 CPUs each, at most 8
    assert hf_trainer.dataloader_workers(on_gpu=True, processes_on_node=8) == 5  # 6 CPUs each
