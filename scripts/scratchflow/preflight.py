"""Preflight: every rule's Slurm request, as the profile and config resolve it, checked against the
live cluster once its jobs are known, before any job is submitted, by a dry run (-n) too; one
message lists every problem.

Read from the cluster (a few Slurm queries, whatever the grid's size): its partitions (`scontrol show
partition`), its nodes (`scontrol show node`) and the user's associations (`sacctmgr show assoc`).
Checked for each rule and attempt: the partition exists, the runtime fits its MaxTime, some node
of it has the GPUs (name and type), CPUs and memory asked for, and enough of them for the nodes
asked for; an account set by the profile or $SBATCH_ACCOUNT is one of the user's. Not checked:
whether the scratch root is writable on a compute node, which takes a job. A query the cluster does
not allow (sacctmgr locked down) is a warning, never a refusal.

A rule's request is read from its resources in every syntax the profiles use (`request_of`; its GPUs
per node, `requested_gpus_per_node`, which the config's start-up checks read too).

`cluster_overview` is what `make cluster` prints: idle and total GPUs by type and pending jobs, per
partition.
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scratchflow.profiles import layered

QUERY_SECONDS = 30
# The resources a request is read from (Snakemake's and the Slurm plugin's names).
RESOURCES = (
    *("slurm_partition", "slurm_account", "slurm_extra", "nodes", "tasks", "cpus_per_task"),
    *("mem_mb", "mem_mb_per_cpu", "gres", "gpu", "gpu_model"),
)
# name=value pairs of `scontrol show ... -o`; a value holds no space.
FIELD = re.compile(r"(\w+)=(\S*)")


class PreflightError(ValueError):
    """The cluster would refuse (or never start) a job of the workflow."""


@dataclass(frozen=True)
class Node:
    name: str
    partitions: frozenset[str]
    cpus: int
    memory_mb: int
    gpus: Counter  # GPU type ("" untyped) -> count
    allocated_gpus: Counter = field(default_factory=Counter)  # the same, in use by jobs
    state: str = ""

    def describe(self) -> str:
        gpus = ",".join(f"gpu:{kind}:{count}" if kind else f"gpu:{count}" for kind, count in sorted(self.gpus.items()))
        return f"{self.name} ({self.cpus} CPUs, {self.memory_mb} MB, {gpus or 'no GPU'})"


@dataclass(frozen=True)
class Partition:
    name: str
    max_minutes: int | None  # None: UNLIMITED
    default: bool
    state: str = "UP"
    max_time_text: str = ""


@dataclass
class Cluster:
    partitions: dict[str, Partition]
    nodes: list[Node]
    accounts: set[str] | None  # None: the cluster would not say
    warnings: list[str] = field(default_factory=list)

    def nodes_of(self, partition: str) -> list[Node]:
        return [node for node in self.nodes if partition in node.partitions]

    @property
    def default_partition(self) -> str | None:
        return next((name for name, partition in self.partitions.items() if partition.default), None)


@dataclass(frozen=True)
class Request:
    """What one rule's job asks Slurm for (the fields preflight checks)."""

    rule: str
    partition: str | None
    account: str | None
    runtimes: list[int]  # minutes, one per attempt
    nodes: int = 1
    cpus_per_node: int = 1
    memory_mb_per_node: int | None = None
    gpus_per_node: int = 0
    gpu_type: str | None = None


Run = Callable[[list[str]], str]


def slurm_query(command: list[str]) -> str:
    """A Slurm command's output; OSError or CalledProcessError where it fails."""
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=QUERY_SECONDS).stdout


def minutes_of(slurm_time: str) -> int | None:
    """Minutes of a Slurm time (minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds), rounded up; None for UNLIMITED."""
    if slurm_time.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    if "-" in slurm_time:
        days_text, clock = slurm_time.split("-", 1)
        days = int(days_text)
        hours, minutes, seconds = ([int(part) for part in clock.split(":")] + [0, 0])[:3]
    else:
        parts = [int(part) for part in slurm_time.split(":")]
        days = 0
        hours, minutes, seconds = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return (days * 24 + hours) * 60 + minutes + math.ceil(seconds / 60)


def parse_gres(text: str) -> Counter:
    """`gpu:a100:2(S:0-1),gpu:v100:1` -> {"a100": 2, "v100": 1}; other GRES are left out."""
    gpus: Counter = Counter()
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        name, *rest = item.strip().split(":")
        if name != "gpu" or not rest:
            continue
        count = int(rest[-1]) if rest[-1].isdigit() else 1
        gpus[rest[0] if len(rest) > 1 else ""] += count
    return gpus


def read_cluster(user: str | None, run: Run = slurm_query) -> Cluster:
    """The partitions, nodes and (with a user) the user's accounts, as the controller tells them."""
    partitions = {}
    for line in run(["scontrol", "show", "partition", "--oneliner"]).splitlines():
        fields = dict(FIELD.findall(line))
        if "PartitionName" in fields:
            partitions[fields["PartitionName"]] = Partition(
                name=fields["PartitionName"],
                max_minutes=minutes_of(fields.get("MaxTime", "UNLIMITED")),
                default=fields.get("Default") == "YES",
                state=fields.get("State", "UP"),
                max_time_text=fields.get("MaxTime", "UNLIMITED"),
            )
    nodes = []
    # --details adds GresUsed: the GPUs in use, by type
    for line in run(["scontrol", "show", "node", "--oneliner", "--details"]).splitlines():
        fields = dict(FIELD.findall(line))
        if "NodeName" not in fields:
            continue
        nodes.append(
            Node(
                name=fields["NodeName"],
                partitions=frozenset(filter(None, fields.get("Partitions", "").split(","))),
                cpus=int(fields.get("CPUTot", 0)),
                memory_mb=int(fields.get("RealMemory", 0)),
                gpus=parse_gres(fields.get("Gres", "")),
                allocated_gpus=parse_gres(fields.get("GresUsed", "")),
                state=fields.get("State", ""),
            )
        )
    warnings: list[str] = []
    if user is None:
        return Cluster(partitions, nodes, None, warnings)
    try:
        listed = run(["sacctmgr", "--noheader", "--parsable2", "show", "assoc", f"user={user}", "format=account"])
        accounts: set[str] | None = {line.strip() for line in listed.splitlines() if line.strip()}
    except (OSError, subprocess.SubprocessError) as error:
        accounts = None
        warnings.append(f"your Slurm accounts could not be listed ({reason(error)}); the account is not checked")
    return Cluster(partitions, nodes, accounts, warnings)


def reason(error: BaseException) -> str:
    said = getattr(error, "stderr", None) or ""
    return said.strip().splitlines()[-1] if said.strip() else str(error)


def request_of(
    rule: str,
    resources: Mapping[str, Any],
    runtimes: list[int],
    account_from_environment: str | None,
    packed_runs: int = 1,
) -> Request:
    """A rule's request from its evaluated resources (the first attempt's), its runtime per attempt,
    and $SBATCH_ACCOUNT; a packed rule's job runs `packed_runs` runs one after another."""
    extra = str(resources.get("slurm_extra") or "")
    nodes = int(resources.get("nodes") or _option(extra, "nodes", "N") or 1)
    tasks_per_node_asked = _option(extra, "ntasks-per-node")
    tasks = int(resources.get("tasks") or 1)
    tasks_per_node = int(tasks_per_node_asked) if tasks_per_node_asked else math.ceil(tasks / nodes)
    cpus_per_task = int(resources.get("cpus_per_task") or _option(extra, "cpus-per-task", "c") or 1)
    memory = resources.get("mem_mb")
    if resources.get("mem_mb_per_cpu"):
        memory = int(resources["mem_mb_per_cpu"]) * cpus_per_task * tasks_per_node
    return Request(
        rule=rule,
        partition=resources.get("slurm_partition") or _option(extra, "partition", "p") or None,
        account=resources.get("slurm_account") or _option(extra, "account", "A") or account_from_environment or None,
        runtimes=[minutes * packed_runs for minutes in runtimes],
        nodes=nodes,
        cpus_per_node=cpus_per_task * tasks_per_node,
        memory_mb_per_node=int(memory) if memory else None,
        gpus_per_node=requested_gpus_per_node(resources) or 0,
        gpu_type=requested_gpu_type(resources),
    )


def _option(extra: str, long: str, short: str | None = None) -> str | None:
    """The value of --long=V / --long V / -s V in a slurm_extra string."""
    words = shlex.split(extra)
    for index, word in enumerate(words):
        if word.startswith(f"--{long}="):
            return word.split("=", 1)[1]
        if word in (f"--{long}", *([f"-{short}"] if short else [])) and index + 1 < len(words):
            return words[index + 1]
    return None


def requested_gpus_per_node(resources: Mapping[str, Any]) -> int | None:
    """The GPUs a rule's resources ask for on each node, in any of the syntaxes the profiles use
    (`gres: gpu[:type]:N`, `gpu: N` with `gpu_model`, `--gpus-per-node=[type:]N` in slurm_extra);
    None when it asks for none."""
    for request in str(resources.get("gres") or "").split(","):
        name, *rest = request.strip().split(":")
        if name == "gpu":
            return int(rest[-1]) if rest and rest[-1].isdigit() else 1
    per_node = re.search(r"--gpus-per-node[= ](?:[\w.-]+:)?(\d+)", str(resources.get("slurm_extra") or ""))
    if per_node:
        return int(per_node.group(1))
    if resources.get("gpu"):
        return -(-int(resources["gpu"]) // int(resources.get("nodes") or 1))
    return None


def requested_gpu_type(resources: Mapping[str, Any]) -> str | None:
    """The GPU type a rule asks for, in any of the syntaxes `requested_gpus_per_node` reads."""
    extra = str(resources.get("slurm_extra") or "")
    gres = [str(resources.get("gres") or ""), _option(extra, "gres") or ""]
    gres += [f"gpu:{value}" for value in (_option(extra, "gpus-per-node"), _option(extra, "gpus")) if value]
    for kind in (kind for text in gres for kind in parse_gres(text)):
        if kind:
            return kind
    return resources.get("gpu_model") or None


def problems(requests: list[Request], cluster: Cluster) -> list[str]:
    """Everything the cluster would refuse, or never start, of these requests: one line each. A
    request whose partition does not exist is still checked against the whole cluster (its longest
    MaxTime, every node), so that fixing the partition brings no new problem to light."""
    found = []
    for request in requests:
        name = request.partition or cluster.default_partition
        partition = cluster.partitions.get(name) if name else None
        if name is None:
            found.append(f"rule {request.rule}: no partition asked for, and the cluster has no default partition")
        elif partition is None:
            known = ", ".join(sorted(cluster.partitions))
            found.append(f"rule {request.rule}: partition {name!r} does not exist; the cluster has: {known}")
        if partition is None:
            where, nodes, partition = "any partition", cluster.nodes, longest_partition(cluster)
        else:
            where, nodes = f"partition {name!r}", cluster.nodes_of(partition.name)
        for attempt, minutes in enumerate(request.runtimes, start=1):
            if partition and partition.max_minutes is not None and minutes > partition.max_minutes:
                first = "its first attempt" if attempt == 1 else f"attempt {attempt} (a retry)"
                found.append(
                    f"rule {request.rule}: {first} asks for {minutes} minutes, above {where}'s "
                    f"MaxTime of {partition.max_minutes} ({partition.max_time_text}); Slurm would refuse it"
                )
                break
        found += _node_problems(request, where, nodes)
        if request.account and cluster.accounts is not None and request.account not in cluster.accounts:
            yours = ", ".join(sorted(cluster.accounts)) or "none"
            found.append(
                f"rule {request.rule}: account {request.account!r} is not one of your Slurm associations ({yours})"
            )
    return found


def longest_partition(cluster: Cluster) -> Partition | None:
    """The partition of the longest MaxTime (UNLIMITED first); None on a cluster without partitions."""
    return max(cluster.partitions.values(), key=lambda partition: partition.max_minutes or float("inf"), default=None)


def _node_problems(request: Request, where: str, nodes: list[Node]) -> list[str]:
    if not nodes:
        return [f"rule {request.rule}: {where} has no nodes"]
    asked = []
    fitting = nodes
    if request.gpus_per_node:
        kind = request.gpu_type
        fitting = [node for node in fitting if _gpus_of(node, kind) >= request.gpus_per_node]
        asked.append(f"{request.gpus_per_node} GPU(s){f' of type {kind}' if kind else ''}")
    fitting = [node for node in fitting if node.cpus >= request.cpus_per_node]
    asked.append(f"{request.cpus_per_node} CPU(s)")
    if request.memory_mb_per_node:
        fitting = [node for node in fitting if node.memory_mb >= request.memory_mb_per_node]
        asked.append(f"{request.memory_mb_per_node} MB")
    if not fitting:
        has = "; ".join(node.describe() for node in nodes[:4]) + (" ..." if len(nodes) > 4 else "")
        return [f"rule {request.rule}: no node of {where} has {', '.join(asked)} (its nodes: {has})"]
    if len(fitting) < request.nodes:
        return [
            f"rule {request.rule}: {request.nodes} nodes of {', '.join(asked)} asked for; {where} "
            f"has {len(fitting)} such node(s) of {len(nodes)}"
        ]
    return []


def _gpus_of(node: Node, kind: str | None) -> int:
    if kind is None:
        return sum(node.gpus.values())
    return node.gpus.get(kind, 0)


def check(requests: list[Request], cluster: Cluster) -> None:
    found = problems(requests, cluster)
    if found:
        raise PreflightError(
            "preflight: the cluster would refuse these jobs (nothing was submitted; "
            "`--config preflight=False` skips this check):\n" + "\n".join(f"  - {line}" for line in found)
        )


def cluster_overview(cluster: Cluster, partitions: list[str], pending: Counter) -> str:
    """Per partition: its nodes, idle and total GPUs by type, pending jobs; for `make cluster`."""
    lines = [f"{'partition':<20} {'nodes':>5} {'GPUs idle/total by type':<32} {'pending jobs':>12}"]
    for name in partitions:
        nodes = cluster.nodes_of(name)
        if name not in cluster.partitions:
            lines.append(f"{name:<20} (no such partition)")
            continue
        total: Counter = Counter()
        idle: Counter = Counter()
        for node in nodes:
            usable = not any(state in node.state for state in ("DOWN", "DRAIN", "FAIL"))
            for kind, count in node.gpus.items():
                total[kind or "gpu"] += count
                idle[kind or "gpu"] += max(0, count - node.allocated_gpus.get(kind, 0)) if usable else 0
        gpus = ", ".join(f"{kind} {idle[kind]}/{total[kind]}" for kind in sorted(total)) or "no GPUs"
        lines.append(f"{name:<20} {len(nodes):>5} {gpus:<32} {pending.get(name, 0):>12}")
    return "\n".join(lines)


def pending_jobs(run: Run = slurm_query) -> Counter:
    """Pending jobs of every user, by partition (a job pending on several counts in each)."""
    counted: Counter = Counter()
    for line in run(["squeue", "--noheader", "--states=PENDING", "--format=%P"]).splitlines():
        for partition in line.strip().split(","):
            if partition:
                counted[partition] += 1
    return counted


def profile_partitions(*profiles: Path) -> list[str | None]:
    """The partitions the rules of `profiles` name (their default-resources' and set-resources'), in
    order; None stands for the cluster's default partition, where the default resources name none.
    A later profile's key replaces an earlier one's whole, as Snakemake's --workflow-profile does."""
    settings = layered(*(yaml.safe_load((profile / "config.v8+.yaml").read_text()) or {} for profile in profiles))
    named = [str((settings.get("default-resources") or {}).get("slurm_partition") or "").strip("'\"") or None]
    for resources in (settings.get("set-resources") or {}).values():
        named.append(str(resources.get("slurm_partition") or "").strip("'\"") or named[0])
    return list(dict.fromkeys(named))
