"""A real Slurm cluster on one host for the tests: munge, MariaDB, slurmdbd, slurmctld and two slurmd
(two nodes, `slurmd -N`, Debian's Slurm is built for several slurmd per host) from Debian's packages,
configured under one directory and started directly (there is no systemd here).

Only the daemons started here are stopped here. Clients on the "login node" find the cluster through
$SLURM_CONF and clients inside jobs through slurmd's configless cache, so nothing under /etc/slurm
is touched. Partitions carry the real clusters' names, so that every
profile's own resource names are exercised, not replaced.

    python tests/local_slurm.py start [ROOT]   starts it and keeps it until Ctrl-C, kill or a closed
                                               terminal, then stops every daemon (the tests run this)
    python tests/local_slurm.py stop           stops the daemons a killed `start` left
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from local_containers import ContainerRuntime, container_runtime

# The daemons, plus what an Alliance login node offers the narval profile: Lmod and virtualenv.
DEBIAN_PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server", "lmod", "virtualenv")
CLUSTER = "scratchflow"
ACCOUNT = "def-lab"
DATABASE = "scratchflow_slurm_acct"
DB_USER, DB_PASSWORD = "slurm", "scratchflow-test-only"
MARIADB_SOCKET = Path("/run/mysqld/mysqld.sock")
NETWORK_NAMESPACE = "scratchflow-slurm"
# Four a node, so that the Slurm tests side by side fit: two two-node jobs of 2 GPUs a node at once.
FAKE_GPUS = 4
GPU_TYPE = "a100"
# Two nodes on this host, so that multi-node training runs for real (each its own slurmd and port),
# and two more in no partition but `fragile`, which the tests lose (LocalSlurm.lose_node,
# stop_answering) with no other test's job on them: a job of two nodes can lose both.
NODES = ("n1", "n2", "n3", "n4")
# `fragile` holds them and the others, where its jobs go while they are lost (a job of two nodes
# too, with no wait for them to come back); they are taken first (lower Weight).
FRAGILE_NODES, FRAGILE_NODE_WEIGHT = ("n3", "n4"), 1
FRAGILE = f"PartitionName=fragile Nodes=n1,n2,{','.join(FRAGILE_NODES)} State=UP PreemptMode=OFF"
# How soon Slurm declares a node whose slurmd stopped answering DOWN (real clusters: minutes).
SLURMD_TIMEOUT_SECONDS = 20
FIRST_SLURMD_PORT = 17001
# sinfo states of a node whose slurmd has registered and which Slurm may schedule on
ANSWERING = ("idle", "mixed", "allocated")
# Each node claims what the profiles ask of a real GPU node (SlurmdParameters=config_overrides keeps
# slurmd from draining it for lacking them), so each profile's own requests schedule as they are.
NODE_CPUS = 128
NODE_MEMORY_MB = 512_000
# The real clusters' partition names (docs/clusters.md, "Notes per cluster"); `batch` is the default, which
# is where a job without a partition (the Alliance's way) lands.
NODE_LIST = f"{NODES[0][0]}[1-{len(NODES)}]"
SHARED_NODES = "n[1-2]"  # the nodes of every partition but `fragile`
PARTITIONS = (
    "batch",
    "gpu",
    "normal",
    "debug",
    "A100-40GB",
    "A100-80GB",
    "H100",
    "RTXA6000",
    "V100-32GB",
    "PGR-Standard",
    "ILCC-Standard",
    "Teach-Standard",
    "lrz-v100x2",
    "lrz-hgx-h100-94x4",
    "lrz-dgx-a100-80x8",
)

# Every partition's MaxTime is 7 days but debug's, which is short, as debug partitions are, so that
# a runtime only a retry asks for can be refused (tests/test_slurm.py, the preflight's test).
MAX_TIMES = {"debug": "01:00:00"}
# Preemption as labs meet it on "preemptible"/"scavenger" partitions: a job there is requeued when
# a job of a higher tier needs its node, after a grace time (SIGTERM at once, SIGKILL when it ends),
# or with none (Slurm requeues it at once; SIGKILL follows KillWait after SIGTERM). The partitions
# above cannot be preempted, so that no other test's jobs are.
PREEMPTIBLE = (
    "PartitionName=preemptible PriorityTier=1 PreemptMode=REQUEUE GraceTime=120",
    "PartitionName=preemptible-nograce PriorityTier=1 PreemptMode=REQUEUE GraceTime=0",
)
PREEMPTING = "PartitionName=urgent PriorityTier=10 PreemptMode=OFF"


def install_packages() -> None:
    """apt-get the daemons if any is missing (about 30 s the first time)."""
    needed = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sacctmgr", "virtualenv")
    if all(shutil.which(tool) or Path("/usr/sbin", tool).exists() for tool in needed):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *DEBIAN_PACKAGES], check=True, env=env, stdout=subprocess.DEVNULL
    )


@dataclass
class LocalSlurm:
    root: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)
    # enroot and pyxis (tests/local_containers.py): jobs take --container-image as on DFKI and LRZ.
    containers: ContainerRuntime | None = None

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def scratch_root(self) -> Path:
        """Node-local scratch: each job gets root/job_<id> as $SLURM_TMPDIR, removed when it ends."""
        return self.root / "localscratch"

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if self.containers:  # pyxis runs `enroot` from slurmstepd's PATH
            env["PATH"] = f"{self.containers.bin}{os.pathsep}{env['PATH']}"
        return env

    def inside(self, *command: str) -> list[str]:
        """`command` run in the cluster's network namespace: only loopback, no route out. Login
        node and compute node alike live there, so every job proves it needs no network."""
        return ["nsenter", f"--net=/run/netns/{NETWORK_NAMESPACE}", *command]

    def run(self, *command: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.inside(*command), env={**self.env, **(env or {})}, capture_output=True, text=True, check=check
        )

    # -- configuration -------------------------------------------------------------------------

    def write_config(self) -> None:
        for folder in ("etc", "state", "spool", "log", "run", "gpus", "localscratch"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        for index in range(FAKE_GPUS):  # gres needs device files; slurmd rejects plain files
            device = self.root / "gpus" / f"nvidia{index}"
            if not device.is_symlink():
                device.symlink_to("/dev/null")
        etc, run, log = self.root / "etc", self.root / "run", self.root / "log"
        self._write_job_scripts(etc)
        partitions = "\n".join(
            [
                f"PartitionName={name} Nodes={SHARED_NODES} MaxTime={MAX_TIMES.get(name, '7-00:00:00')} State=UP"
                + " PreemptMode=OFF"
                + (" Default=YES" if name == "batch" else "")
                for name in PARTITIONS
            ]
            + [f"{partition} Nodes={SHARED_NODES} State=UP" for partition in (*PREEMPTIBLE, PREEMPTING)]
            + [FRAGILE]
        )
        self.conf.write_text(
            textwrap.dedent(f"""\
            ClusterName={CLUSTER}
            SlurmctldHost={self.host}(127.0.0.1)
            SlurmUser=root
            AuthType=auth/munge
            StateSaveLocation={self.root / "state"}
            SlurmdSpoolDir={self.root / "spool" / "%n"}
            SlurmctldPidFile={run / "slurmctld.pid"}
            SlurmdPidFile={run / "slurmd-%n.pid"}
            SlurmctldLogFile={log / "slurmctld.log"}
            SlurmdLogFile={log / "slurmd-%n.log"}
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core_Memory
            PreemptType=preempt/partition_prio
            PreemptMode=REQUEUE
            DefMemPerCPU=1000
            EnforcePartLimits=ALL
            ReturnToService=2
            SlurmdTimeout={SLURMD_TIMEOUT_SECONDS}
            MinJobAge=300
            AccountingStorageType=accounting_storage/slurmdbd
            AccountingStorageHost=localhost
            AccountingStorageEnforce=associations,limits
            AccountingStorageTRES=gres/gpu
            JobAcctGatherType=jobacct_gather/linux
            JobAcctGatherFrequency=5
            GresTypes=gpu
            PrologFlags=Alloc
            SlurmctldParameters=enable_configless
            SlurmdParameters=config_overrides
            Prolog={etc / "prolog.sh"}
            Epilog={etc / "epilog.sh"}
            TaskProlog={etc / "task_prolog.sh"}
            """)
            + "".join(
                f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={FIRST_SLURMD_PORT + index} "
                f"Weight={FRAGILE_NODE_WEIGHT if node in FRAGILE_NODES else 2} CPUs={NODE_CPUS} "
                f"RealMemory={NODE_MEMORY_MB} Gres=gpu:{GPU_TYPE}:{FAKE_GPUS} State=UNKNOWN\n"
                for index, node in enumerate(NODES)
            )
            + partitions
            + "\n"
        )
        (etc / "gres.conf").write_text(
            "AutoDetect=off\n"
            + "".join(
                f"NodeName={NODE_LIST} Name=gpu Type={GPU_TYPE} File={self.root / 'gpus' / f'nvidia{index}'}\n"
                for index in range(FAKE_GPUS)
            )
        )
        # Read by sbatch and srun (the --container-* options) and by slurmd (configless: with slurm.conf).
        # pyxis's defaults: each job step unpacks the image (enroot create). Not use_squashfuse=1,
        # which mounts it instead: its squashfuse process belongs to the job step, and the signals
        # Slurm sends the step (the wall-time warning, scancel's TERM) end it, taking the image's
        # files away from the running trainer (docs/clusters.md, "Containers").
        (etc / "plugstack.conf").write_text(
            f"required {self.containers.pyxis} runtime_path={self.root / 'pyxis'}\n" if self.containers else ""
        )
        if self.containers:
            # What this cluster's admin mounts into every container (enroot's system mounts.d): the
            # task prolog runs inside the container (pyxis enters it first), and $SLURM_TMPDIR is there.
            self.containers.mounts.write_text(
                "".join(f"{path} {path} none x-create=dir,bind,rw,nosuid\n" for path in (etc, self.scratch_root))
            )
        dbd = etc / "slurmdbd.conf"
        dbd.write_text(
            textwrap.dedent(f"""\
            DbdHost=localhost
            SlurmUser=root
            AuthType=auth/munge
            PidFile={run / "slurmdbd.pid"}
            LogFile={log / "slurmdbd.log"}
            StorageType=accounting_storage/mysql
            StorageHost=localhost
            StorageUser={DB_USER}
            StoragePass={DB_PASSWORD}
            StorageLoc={DATABASE}
            """)
        )
        dbd.chmod(0o600)

    def _write_job_scripts(self, etc: Path) -> None:
        """Job-private node-local scratch, like the Alliance's $SLURM_TMPDIR."""
        job_dir = f"{self.scratch_root}/job_$SLURM_JOB_ID"
        scripts = {
            "prolog.sh": f'mkdir -p "{job_dir}"\n',
            "epilog.sh": f'rm -rf "{job_dir}"\n',
            "task_prolog.sh": f'echo "export SLURM_TMPDIR={job_dir}"\n',
        }
        for name, body in scripts.items():
            path = etc / name
            path.write_text("#!/bin/sh\n" + body)
            path.chmod(0o755)

    # -- daemons -------------------------------------------------------------------------------

    def _start(self, name: str, command: list[str], user: str | None = None, env: dict[str, str] | None = None) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (lives as long as the daemon)
        if user:
            command = ["runuser", "-u", user, "--", *command]
        self.daemons[name] = subprocess.Popen(
            self.inside(*command), env=env or self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def node_env(self, node: str) -> dict[str, str]:
        """A node's slurmd: first on its PATH, a folder named after the node. slurmstepd hands its
        PATH, and no other variable of its own, to the enroot that pyxis runs, whose settings read
        the node's name from it (local_containers.configure_enroot): both nodes share this machine."""
        marker = self.root / "nodes" / node
        marker.mkdir(parents=True, exist_ok=True)
        return {**self.env, "PATH": f"{marker}{os.pathsep}{self.env['PATH']}"}

    def _wait(self, what: str, ready, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.daemons.items():
                lost = name.startswith("slurmd-") and self.is_lost(name.removeprefix("slurmd-"))
                if process.poll() is not None and not lost:
                    raise RuntimeError(f"{name} exited ({process.returncode}); see {self.root / 'log'}")
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready after {timeout} s; see {self.root / 'log'}")

    def _sql(self, statement: str) -> None:
        done = subprocess.run(
            ["mariadb", f"--socket={MARIADB_SOCKET}", "-e", statement], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"MariaDB refused {statement!r}: {done.stderr.strip()}")

    @staticmethod
    def _mariadb_answers() -> bool:
        ping = ["mariadb-admin", f"--socket={MARIADB_SOCKET}", "--connect-timeout=2", "ping"]
        return subprocess.run(ping, capture_output=True).returncode == 0

    def _clear_leftovers(self) -> None:
        """Stop the daemons of an earlier test cluster that was killed instead of stopped (they
        still run in the old namespace) and remove the socket a killed MariaDB leaves behind:
        a stale socket would pass for a running server."""
        stop_namespace()
        if MARIADB_SOCKET.is_socket() and not self._mariadb_answers():
            MARIADB_SOCKET.unlink()

    def start(self) -> LocalSlurm:
        install_packages()
        self.containers = container_runtime()
        self.write_config()
        self._clear_leftovers()
        subprocess.run(["ip", "netns", "add", NETWORK_NAMESPACE], check=True)
        # Daemons resolve their listening address with AI_ADDRCONFIG, which discounts 127.0.0.1:
        # give loopback a second address (TEST-NET-1; nothing routes anywhere from here).
        for command in (["link", "set", "lo", "up"], ["address", "add", "192.0.2.1/32", "dev", "lo"]):
            subprocess.run(["ip", "-n", NETWORK_NAMESPACE, *command], check=True)
        for folder, owner in ((Path("/run/munge"), "munge"), (MARIADB_SOCKET.parent, "mysql")):
            folder.mkdir(exist_ok=True)
            shutil.chown(folder, owner, owner)
        self._start("munged", ["munged", "--foreground"], user="munge")
        self._wait("munge", lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0)
        # slurmdbd's client library finds MariaDB at its default socket only; no TCP port is opened.
        self._start("mariadbd", ["mariadbd", "--user=mysql", f"--socket={MARIADB_SOCKET}", "--skip-networking"])
        self._wait("MariaDB", self._mariadb_answers)
        # A clean accounting database every time (with SQL: deleting its folder breaks MariaDB).
        self._sql(
            f"DROP DATABASE IF EXISTS {DATABASE}; "
            f"CREATE OR REPLACE USER '{DB_USER}'@'localhost' IDENTIFIED BY '{DB_PASSWORD}'; "
            f"GRANT ALL ON {DATABASE}.* TO '{DB_USER}'@'localhost';"
        )
        self._start("slurmdbd", ["slurmdbd", "-D"])  # reads slurmdbd.conf beside $SLURM_CONF
        self._wait("slurmdbd", lambda: self.run("sacctmgr", "-n", "list", "cluster", check=False).returncode == 0)
        user = os.environ.get("USER") or "root"
        self.run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        self.run("sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={CLUSTER}")
        self.run("sacctmgr", "-i", "add", "user", user, f"account={ACCOUNT}", f"cluster={CLUSTER}")
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0)
        # Configless, like many real clusters: the node fetches its config from slurmctld and links
        # its cache as /run/slurm/conf, where clients inside jobs find it (the jobstep plugin strips
        # every SLURM_* variable, $SLURM_CONF included, before its nested srun). Each slurmd has a
        # mount namespace and a /run/slurm of its own, which its jobs inherit: on the host, that
        # link sent every Slurm client outside the cluster's network to a controller it cannot
        # reach, ten tries a second apart; the slurm plugin's `scontrol show config` when Snakemake
        # loads it made every snakemake started beside the Slurm tests wait 9 s for nothing.
        for node in NODES:
            self._start_node(node)
        self._wait("the nodes", self._nodes_idle)
        return self

    def _start_node(self, node: str) -> None:
        (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        private_run = 'mkdir -p /run/slurm && mount -t tmpfs slurm-run /run/slurm && exec "$@"'
        command = [
            *("unshare", "--mount", "--propagation", "slave", "sh", "-c", private_run, "sh"),
            *("slurmd", "-D", "-N", node, "--conf-server", "127.0.0.1"),
        ]
        self._start(f"slurmd-{node}", command, env=self.node_env(node))

    def lose_node(self, node: str) -> None:
        """`node` powers off: its slurmd and every process of its jobs (their slurmstepd, which
        carries the node's PATH, and what they run, which carries SLURMD_NODENAME) SIGKILLed at
        once (its slurmd may be gone already: stop_answering). Slurm declares it DOWN after SlurmdTimeout."""
        pid_file = self._slurmd_pid_file(node)
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # started by the process that keeps the cluster
            pid_file.unlink()
        while self._kill_processes_of(node):  # again: one killed late may have started another meanwhile
            time.sleep(0.1)

    def stop_answering(self, node: str) -> list[int]:
        """`node`'s slurmd dies (a crash, an upgrade, its OOM) while the node and its jobs' processes
        live on: Slurm declares it DOWN after SlurmdTimeout and requeues its jobs, and nothing tells
        those processes to stop. Their pids."""
        pid_file = self._slurmd_pid_file(node)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # started by the process that keeps the cluster
        pid_file.unlink()
        return self.processes_of(node)

    def _kill_processes_of(self, node: str) -> int:
        """SIGKILL every process of `node`'s jobs now running, and return how many there were."""
        killed = 0
        for pid in self.processes_of(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed

    def processes_of(self, node: str) -> list[int]:
        """The processes of `node`'s jobs now running: their slurmstepd, which carries the node's
        PATH, and what they run, which carries SLURMD_NODENAME."""
        marker = f"PATH={self.root / 'nodes' / node}{os.pathsep}".encode()
        found = []
        for pid in [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # ended meanwhile
                continue
            if f"SLURMD_NODENAME={node}".encode() in environ or any(v.startswith(marker) for v in environ):
                found.append(pid)
        return found

    def restart_node(self, node: str) -> None:
        """`node` back: its slurmd starts again and registers, and the node returns by itself
        (ReturnToService=2): it answers, and Slurm may schedule on it. (Not necessarily idle: under
        load, CI once saw it not idle for 90 s after its return, as if a lost job's allocation
        were still held there; the tests ask nothing of that allocation.)"""
        self._start_node(node)
        try:
            self._wait(f"{node} back", lambda: self.node_state(node) in ANSWERING, timeout=90)
        except TimeoutError as error:
            raise TimeoutError(f"{error}; sinfo says {self.node_state(node)!r}") from None

    def node_state(self, node: str) -> str:
        """sinfo's state of `node` (`idle`, `mixed*`, `down*`, ...: `*` where it does not respond)."""
        return self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T", check=False).stdout.split("\n")[0].strip()

    def is_lost(self, node: str) -> bool:
        """Whether `node` was lost (lose_node) and not brought back since."""
        return not self._slurmd_pid_file(node).exists()

    def _slurmd_pid_file(self, node: str) -> Path:
        return self.root / "run" / f"slurmd-{node}.pid"  # SlurmdPidFile

    def restart_controller(self, down_seconds: float) -> None:
        """Stop slurmctld, as a crash or an upgrade does, and start it again from its saved state."""
        pid = int((self.root / "run" / "slurmctld.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        _wait_until_gone([pid], timeout=30)
        self.daemons.pop("slurmctld", None)
        time.sleep(down_seconds)
        self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0)

    def _nodes_idle(self) -> bool:
        listed = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split("\n")
        states = dict(line.split() for line in listed if line.strip())  # a node is listed per partition
        return set(states) == set(NODES) and all(state.rstrip("*") in ANSWERING for state in states.values())

    def stop(self) -> None:
        """Stop the daemons started here, newest first, then anything else still running in the
        cluster's namespace (a slurmctld restarted by another process, a job's leftovers), and
        remove the namespace."""
        for name, process in reversed(list(self.daemons.items())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            del self.daemons[name]
        stop_namespace()


def namespace_pids() -> list[int]:
    """The processes running in the test cluster's network namespace (none once it is gone)."""
    listed = subprocess.run(["ip", "netns", "pids", NETWORK_NAMESPACE], capture_output=True, text=True)
    return [int(pid) for pid in listed.stdout.split()]


def _wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    """Those of `pids` still running after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not is_zombie(pid)]
        time.sleep(0.2)
    return pids


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def stop_namespace() -> None:
    """Every process in the cluster's namespace gets SIGTERM, then SIGKILL after 30 s; then the
    namespace goes."""
    pids = namespace_pids()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in _wait_until_gone(pids, timeout=30):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "netns", "delete", NETWORK_NAMESPACE], capture_output=True)


# The signals that end `start`: Ctrl-C, kill (SIGTERM), a closed terminal (SIGHUP).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def main(arguments: list[str]) -> None:
    """`start [ROOT]`: start the cluster and keep it until one of STOP_SIGNALS, then stop every
    daemon, also when the start fails half-way. `stop`: stop a cluster a killed `start` left."""
    if arguments[:1] == ["stop"]:
        stop_namespace()
        return
    if arguments[:1] != ["start"]:
        sys.exit(__doc__)

    def leave(number: int, _frame: object) -> None:
        raise SystemExit(128 + number)

    for number in STOP_SIGNALS:  # handlers, not a blocked mask: the daemons inherit a mask
        signal.signal(number, leave)
    cluster = LocalSlurm(Path(arguments[1] if len(arguments) > 1 else "/tmp/scratchflow-slurm"))
    try:
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
        print(" ".join(f"{name}={process.pid}" for name, process in cluster.daemons.items()), flush=True)
        while True:
            signal.pause()
    finally:
        for number in STOP_SIGNALS:  # a second Ctrl-C does not cut the stop short
            signal.signal(number, signal.SIG_IGN)
        cluster.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
