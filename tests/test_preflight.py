"""The preflight's reading of a cluster and of a profile's requests, and what it refuses, on the
text Slurm 22.05 prints (as the test cluster printed it). Run against the live test cluster in
tests/test_slurm.py."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
from scratchflow.preflight import (
    Cluster,
    PreflightError,
    Request,
    check,
    cluster_overview,
    minutes_of,
    parse_gres,
    problems,
    profile_partitions,
    read_cluster,
    request_of,
)

REPO = Path(__file__).resolve().parents[1]

# What the test cluster's Slurm 22.05 printed (3 of its partitions; n1 running a job of one GPU).
OUTPUTS = Path(__file__).parent / "slurm_outputs"
PARTITIONS = (OUTPUTS / "scontrol-show-partition.txt").read_text()
NODES = (OUTPUTS / "scontrol-show-node.txt").read_text()


def slurm_answering(accounts: str | None = "def-lab\ndef-lab\n"):
    """The Slurm commands' outputs; `accounts` None: sacctmgr refused, as where it is locked down."""

    def run(command: list[str]) -> str:
        if command[:3] == ["scontrol", "show", "partition"]:
            return PARTITIONS
        if command[:3] == ["scontrol", "show", "node"]:
            return NODES
        if command[0] == "sacctmgr" and accounts is not None:
            return accounts
        raise subprocess.CalledProcessError(1, command, "", "sacctmgr: error: Access/permission denied\n")

    return run


@pytest.fixture
def cluster() -> Cluster:
    return read_cluster("root", slurm_answering())


def test_the_cluster_is_read_from_scontrol_and_sacctmgr(cluster):
    assert cluster.default_partition == "batch"
    assert {name: partition.max_minutes for name, partition in cluster.partitions.items()} == {
        "batch": 7 * 24 * 60,
        "debug": 60,
        "gpu": 7 * 24 * 60,
    }
    first, second = cluster.nodes
    assert (first.cpus, first.memory_mb, first.gpus) == (64, 512000, Counter(a100=2))
    assert first.allocated_gpus == Counter(a100=1)
    assert {"batch", "debug", "gpu"} <= first.partitions and second.allocated_gpus == Counter(a100=0)
    assert cluster.accounts == {"def-lab"} and cluster.warnings == []


def test_a_cluster_that_will_not_list_accounts_is_a_warning_and_the_account_goes_unchecked():
    cluster = read_cluster("root", slurm_answering(accounts=None))
    assert cluster.accounts is None
    assert cluster.warnings == [
        "your Slurm accounts could not be listed (sacctmgr: error: Access/permission denied); "
        "the account is not checked"
    ]
    assert problems([Request("train", "gpu", "def-anyone", [60])], cluster) == []


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("7-00:00:00", 10080), ("01:00:00", 60), ("30", 30), ("30:30", 31), ("1-12", 2160), ("UNLIMITED", None)],
)
def test_slurm_times_read_as_minutes(text, minutes):
    assert minutes_of(text) == minutes


def test_gres_lists_read_as_gpus_by_type():
    assert parse_gres("gpu:a100:2(S:0-1),gpu:v100:1,tmpdisk:100") == Counter(a100=2, v100=1)
    assert parse_gres("gpu:4") == Counter({"": 4}) and parse_gres("(null)") == Counter()


# The forms the profiles ask for GPUs, nodes, CPUs and memory in -> what one node must have.
REQUESTS = {
    "narval: gpu and gpu_model": (
        {"gpu": 1, "gpu_model": "a100", "cpus_per_task": 12, "mem_mb": 64000},
        dict(nodes=1, gpus_per_node=1, gpu_type="a100", cpus_per_node=12, memory_mb_per_node=64000),
    ),
    "edinburgh: gres without a type": (
        {"gres": "gpu:1", "slurm_partition": "PGR-Standard", "cpus_per_task": 4},
        dict(partition="PGR-Standard", gpus_per_node=1, gpu_type=None, cpus_per_node=4),
    ),
    "a gres with a type": ({"gres": "gpu:h100:2"}, dict(gpus_per_node=2, gpu_type="h100")),
    "narval's several nodes: --gpus-per-node in slurm_extra": (
        {"nodes": 2, "cpus_per_task": 48, "slurm_extra": "--ntasks-per-node=1 --gpus-per-node=a100:4"},
        dict(nodes=2, gpus_per_node=4, gpu_type="a100", cpus_per_node=48),
    ),
    "oscer's several nodes: tasks spread over them": (
        {"nodes": 2, "tasks": 4, "cpus_per_task": 8, "gres": "gpu:2"},
        dict(nodes=2, cpus_per_node=16, gpus_per_node=2),
    ),
    "memory per CPU": ({"cpus_per_task": 4, "mem_mb_per_cpu": 2000}, dict(cpus_per_node=4, memory_mb_per_node=8000)),
    "partition and account in slurm_extra": (
        {"slurm_extra": "-p debug --account=def-lab"},
        dict(partition="debug", account="def-lab"),
    ),
}


@pytest.mark.parametrize("case", REQUESTS)
def test_a_rules_request_is_read_from_its_resources_in_each_form_the_profiles_use(case):
    resources, expected = REQUESTS[case]
    request = request_of("train", resources, [60], None)
    for name, value in expected.items():
        assert getattr(request, name) == value, name


def test_the_account_comes_from_the_profile_else_sbatch_account_and_a_pack_runs_its_runs_in_turn():
    assert request_of("train", {"slurm_account": "def-a"}, [60], "def-b").account == "def-a"
    assert request_of("train", {}, [60], "def-b").account == "def-b"
    assert request_of("train", {}, [60, 120], None, packed_runs=3).runtimes == [180, 360]


def test_a_request_the_cluster_can_run_has_no_problem(cluster):
    requests = [
        Request("archive_dataset", None, None, [60, 60, 60], cpus_per_node=2, memory_mb_per_node=8000),
        Request("train", "gpu", "def-lab", [720, 1440, 2880], nodes=2, cpus_per_node=8, gpus_per_node=2),
        Request("predict", "debug", None, [30, 60], gpus_per_node=1, gpu_type="a100"),
    ]
    assert problems(requests, cluster) == []
    check(requests, cluster)


def test_every_problem_of_every_rule_is_named_in_one_error(cluster):
    requests = [
        Request("archive_dataset", "debug", "def-nobody", [25, 50, 75]),
        Request("train", "gpu", None, [720], nodes=3, gpus_per_node=2, cpus_per_node=8),
        Request("predict", "gpus", None, [30]),
        Request("evaluate", "batch", None, [30], gpus_per_node=1, gpu_type="h100"),
        Request("big", "batch", None, [30], cpus_per_node=128),
        Request("heavy", "batch", None, [30], memory_mb_per_node=1_000_000),
    ]
    with pytest.raises(PreflightError) as refused:
        check(requests, cluster)
    said = str(refused.value)
    assert said.startswith("preflight: the cluster would refuse these jobs (nothing was submitted;")
    assert "`--config preflight=False` skips this check" in said
    for line in (
        "rule archive_dataset: attempt 3 (a retry) asks for 75 minutes, above partition 'debug''s MaxTime of 60",
        "rule archive_dataset: account 'def-nobody' is not one of your Slurm associations (def-lab)",
        "rule train: 3 nodes of 2 GPU(s), 8 CPU(s) asked for; partition 'gpu' has 2 such node(s) of 2",
        "rule predict: partition 'gpus' does not exist; the cluster has: batch, debug, gpu",
        "rule evaluate: no node of partition 'batch' has 1 GPU(s) of type h100, 1 CPU(s) (its nodes: "
        "n1 (64 CPUs, 512000 MB, gpu:a100:2); n2 (64 CPUs, 512000 MB, gpu:a100:2))",
        "rule big: no node of partition 'batch' has 128 CPU(s)",
        "rule heavy: no node of partition 'batch' has 1 CPU(s), 1000000 MB",
    ):
        assert f"  - {line}" in said, line
    assert said.count("  - rule ") == 7


def test_a_misspelt_partition_hides_none_of_the_rules_other_problems(cluster):
    """Checked against the whole cluster: before, the memory above every node's appeared only once the
    partition was fixed, and the message grew as mistakes were fixed."""
    requests = [Request("predict", "gpus", None, [30], memory_mb_per_node=1_000_000)]
    assert problems(requests, cluster) == [
        "rule predict: partition 'gpus' does not exist; the cluster has: batch, debug, gpu",
        "rule predict: no node of any partition has 1 CPU(s), 1000000 MB (its nodes: "
        "n1 (64 CPUs, 512000 MB, gpu:a100:2); n2 (64 CPUs, 512000 MB, gpu:a100:2))",
    ]
    assert problems([Request("predict", "gpus", None, [30])], cluster) == [
        "rule predict: partition 'gpus' does not exist; the cluster has: batch, debug, gpu"
    ]
    too_long = problems([Request("predict", "gpus", None, [20_000])], cluster)[1]
    assert too_long.startswith("rule predict: its first attempt asks for 20000 minutes, above any partition's MaxTime")


def test_a_first_attempt_above_maxtime_is_said_so(cluster):
    (problem,) = problems([Request("predict", "debug", None, [90, 180])], cluster)
    assert problem.startswith("rule predict: its first attempt asks for 90 minutes, above partition 'debug''s")


def test_the_overview_counts_idle_gpus_by_type_and_pending_jobs_per_partition(cluster):
    shown = cluster_overview(cluster, ["gpu", "debug", "nowhere"], Counter(gpu=3))
    rows = {line.split()[0]: line.split()[1:] for line in shown.splitlines()[1:]}
    assert rows["gpu"] == ["2", "a100", "3/4", "3"]  # one GPU of n1 taken
    assert rows["debug"] == ["2", "a100", "3/4", "0"]
    assert rows["nowhere"] == ["(no", "such", "partition)"]


@pytest.mark.parametrize(
    ("profile", "partitions"),
    [
        ("oscer", ["normal", "gpu"]),
        ("narval", [None]),  # the Alliance routes jobs by their requests: the default partition
        ("edinburgh", ["PGR-Standard"]),
        ("dfki", ["batch", "A100-80GB"]),
        ("lrz", ["lrz-v100x2", "lrz-hgx-h100-94x4"]),
    ],
)
def test_a_profiles_partitions_are_those_its_rules_name(profile, partitions):
    assert profile_partitions(REPO / "profiles" / profile) == partitions
