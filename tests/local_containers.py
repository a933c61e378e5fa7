"""enroot and pyxis for the test cluster, and the images its container jobs run.

Both are built from their unmodified release sources (`../shared/third_party` beside the clone, or
$SCRATCHFLOW_THIRD_PARTY), checked against SHA256SUMS, once per machine: the build is cached outside
the clone (/var/cache/scratchflow-tests, or $SCRATCHFLOW_TEST_CACHE) under the tarballs' sha256 and
built again only when missing. enroot's git submodules are not in its release tarball; Debian 12
stands in for them (../shared/reference/containers.md): its musl with enroot's static-pie change to
the gcc wrapper's specs, its makeself, its kernel headers. pyxis builds against Debian's
libslurm-dev, the same Slurm release as the test cluster's slurmd.

The base image is what a lab pulls from a registry (an NGC PyTorch image on DFKI or LRZ): here a
Debian 12 minbase root filesystem with python3, made by debootstrap and squashed as the test
cluster's enroot squashes (`SQUASH_OPTIONS`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THIRD_PARTY = Path(os.environ.get("SCRATCHFLOW_THIRD_PARTY", REPO.parent / "shared" / "third_party"))
CACHE = Path(os.environ.get("SCRATCHFLOW_TEST_CACHE", "/var/cache/scratchflow-tests"))
ENROOT, PYXIS = "enroot-4.1.2.tar.gz", "pyxis-0.24.0.tar.gz"
# To build enroot (musl, makeself, kernel headers stand in for its submodules) and pyxis; what
# `enroot create` and `--container-save` run; and debootstrap for the base image.
DEBIAN_PACKAGES = (
    "build-essential",
    "libslurm-dev",
    "musl-tools",
    "makeself",
    "libmd-dev",
    "squashfs-tools",
    "squashfuse",
    "fuse-overlayfs",
    "parallel",
    "jq",
    "curl",
    "gawk",
    "pigz",
    "zstd",
    "libcap2-bin",
    "debootstrap",
)
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What the base image holds besides Debian's minbase (an NGC PyTorch image holds its own Python).
BASE_PACKAGES = ("python3", "python3-venv", "rsync", "zstd")
MUSL_SPECS = Path("/usr/lib/x86_64-linux-musl/musl-gcc.specs")
# How the test cluster's images are squashed (its enroot's ENROOT_SQUASH_OPTIONS, and the base
# image's): nothing compressed. enroot's default, `-comp lzo -noD -exit-on-error`, compresses the
# inode table and the fragments, where a Python environment's 55,000 small files go: 66 s of CPU to
# save the 1.4 GB test image on this 2-core machine, against 1 s uncompressed (1.8 GB), on every new
# machine (CI's always is). A cluster's admins choose their own: there, a larger image read off
# shared storage in every job step may cost more than the CPU.
SQUASH_OPTIONS = ("-noI", "-noD", "-noF", "-noX", "-exit-on-error")


@dataclass(frozen=True)
class ContainerRuntime:
    prefix: Path  # enroot's installation: bin/enroot, etc/enroot/enroot.conf

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    @property
    def pyxis(self) -> Path:
        return self.prefix / "lib" / "slurm" / "spank_pyxis.so"

    @property
    def mounts(self) -> Path:
        """The test cluster's own mounts into every container (an fstab of enroot's)."""
        return self.prefix / "etc" / "enroot" / "mounts.d" / "50-test-cluster.fstab"

    @property
    def data(self) -> Path:
        """Where enroot unpacks the containers of running jobs (ENROOT_DATA_PATH, one per user)."""
        return Path("/dev/shm/scratchflow-enroot-data")


def install_packages() -> None:
    needed = ("musl-gcc", "makeself", "mksquashfs", "squashfuse", "fuse-overlayfs", "parallel", "debootstrap")
    if (
        all(shutil.which(tool) or Path("/usr/sbin", tool).exists() for tool in needed)
        and Path("/usr/include/slurm/spank.h").exists()
    ):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *DEBIAN_PACKAGES], check=True, env=env, stdout=subprocess.DEVNULL
    )


def checked_sources() -> dict[str, str]:
    """name -> sha256 of the two release tarballs, each checked against SHA256SUMS."""
    listed = THIRD_PARTY / "SHA256SUMS"
    if not listed.is_file():
        raise FileNotFoundError(
            f"the release sources of enroot and pyxis are not in {THIRD_PARTY} (set SCRATCHFLOW_THIRD_PARTY): "
            f"{ENROOT} and {PYXIS} as `git archive` of the tags v4.1.2 of github.com/NVIDIA/enroot and "
            "v0.24.0 of github.com/NVIDIA/pyxis, with their SHA256SUMS"
        )
    expected = dict(reversed(line.split()) for line in listed.read_text().splitlines() if line.strip())
    sums = {}
    for name in (ENROOT, PYXIS):
        digest = hashlib.sha256((THIRD_PARTY / name).read_bytes()).hexdigest()
        if digest != expected.get(name):
            raise ValueError(f"{THIRD_PARTY / name}: sha256 {digest}, SHA256SUMS says {expected.get(name)}")
        sums[name] = digest
    return sums


def container_runtime() -> ContainerRuntime:
    """enroot and pyxis, built once per machine (about 5 s) and kept under CACHE."""
    install_packages()
    sums = checked_sources()
    key = hashlib.sha256("".join(sums[name] for name in (ENROOT, PYXIS)).encode()).hexdigest()[:16]
    runtime = ContainerRuntime(CACHE / f"enroot-pyxis-{key}")
    complete = runtime.prefix / ".complete"
    if complete.is_file():
        configure_enroot(runtime)
        return runtime
    # enroot's installed scripts name their prefix (DESTDIR included): install at the final one.
    shutil.rmtree(runtime.prefix, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as build:
        _build_enroot(_unpack(ENROOT, Path(build)), runtime.prefix)
        _build_pyxis(_unpack(PYXIS, Path(build)), runtime.pyxis)
    configure_enroot(runtime)
    complete.touch()
    return runtime


def _unpack(name: str, into: Path) -> Path:
    with tarfile.open(THIRD_PARTY / name) as archive:
        archive.extractall(into, filter="data")
    return into / name.removesuffix(".tar.gz")


def _build_enroot(source: Path, prefix: Path) -> None:
    deps = source / "deps"
    # makeself: Debian's 2.4.5, the version enroot pins.
    (deps / "makeself").mkdir(exist_ok=True)
    shutil.copy("/usr/bin/makeself", deps / "makeself" / "makeself.sh")
    shutil.copy("/usr/share/makeself/makeself-header.sh", deps / "makeself")
    # Kernel headers: Debian's, where the submodule's build would have put its own.
    include = deps / "dist" / "linux" / "include"
    include.mkdir(parents=True)
    for name, target in (
        ("linux", "/usr/include/linux"),
        ("asm-generic", "/usr/include/asm-generic"),
        ("asm", "/usr/include/x86_64-linux-gnu/asm"),
    ):
        (include / name).symlink_to(target)
    # musl: Debian's gcc wrapper, with the static-pie change of enroot's deps/musl.patch in its specs.
    musl = deps / "dist" / "musl"
    (musl / "bin").mkdir(parents=True)
    (musl / "lib").mkdir()
    libdir = "/usr/lib/x86_64-linux-musl"
    specs = (
        MUSL_SPECS.read_text()
        .replace(
            f"%{{!shared: {libdir}/Scrt1.o}}",
            f"%{{static-pie: {libdir}/rcrt1.o}} %{{!static-pie: %{{!shared: {libdir}/Scrt1.o}}}}",
        )
        .replace(
            "-dynamic-linker /lib/ld-musl-x86_64.so.1 ",
            "%{static-pie:-no-dynamic-linker -static -pie} %{!static-pie:-dynamic-linker /lib/ld-musl-x86_64.so.1} ",
        )
    )
    if "rcrt1.o" not in specs or "-no-dynamic-linker" not in specs:
        raise RuntimeError(f"{MUSL_SPECS} is not the musl-gcc specs this build knows how to change")
    (musl / "lib" / "musl-gcc.specs").write_text(specs)
    wrapper = musl / "bin" / "musl-gcc"
    wrapper.write_text(f'#!/bin/sh\nexec "${{REALGCC:-gcc}}" "$@" -specs "{musl / "lib" / "musl-gcc.specs"}"\n')
    wrapper.chmod(0o755)
    for submodule in ("musl", "linux-headers"):
        (deps / submodule).mkdir(exist_ok=True)
        (deps / submodule / ".stamp").touch()
    for target in ("all", "install"):
        _make(source, target, f"prefix={prefix}")


def _build_pyxis(source: Path, plugin: Path) -> None:
    _make(source, "all")
    plugin.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "spank_pyxis.so", plugin)


def _make(source: Path, *arguments: str) -> None:
    done = subprocess.run(["make", "-C", str(source), *arguments], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"make {' '.join(arguments)} in {source.name} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def configure_enroot(runtime: ContainerRuntime) -> None:
    """The test cluster's enroot settings, a drop-in beside the installed enroot.conf (pyxis drops
    ENROOT_*_PATH from a job's environment). Unpacked containers live in RAM (/dev/shm), as on
    clusters that give enroot a tmpfs, and nothing of a job's is left on disk. As root, with
    ENROOT_ALLOW_SUPERUSER unset, enroot maps root to root in a user namespace, as it maps any user."""
    (runtime.prefix / "etc" / "enroot" / "enroot.conf.d" / "50-test-cluster.conf").write_text(
        "# scratchflow's test cluster (tests/local_containers.py)\n"
        f"ENROOT_CACHE_PATH {CACHE}/enroot-cache/user-$(id -u)\n"
        # Per node: the test cluster's two nodes share this machine, and pyxis names a job step's
        # container after the job and step alone (a several-node step's, the same on both). Each
        # node's slurmd has a folder named after the node first on its PATH
        # (local_slurm.LocalSlurm.node_env), the one variable slurmstepd hands to enroot.
        f'ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)-$(basename "${{PATH%%:*}}")\n'
        f'ENROOT_DATA_PATH {runtime.data}/user-$(id -u)-$(basename "${{PATH%%:*}}")\n'
        f"ENROOT_SQUASH_OPTIONS {' '.join(SQUASH_OPTIONS)}\n"
    )


def base_image() -> Path:
    """The Debian 12 minbase image with python3 (and its venv module) and the tools the lifecycle
    runs (rsync; zstd for compressed archives), as a squashfs file, made once per machine (about 1
    to 2 minutes: debootstrap fetches from Debian's mirror)."""
    install_packages()
    image = CACHE / f"debian-12-{'-'.join(BASE_PACKAGES)}.sqsh"
    if image.is_file():
        return image
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as build:
        rootfs = Path(build) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                rootfs,
                DEBIAN_MIRROR,
            ],
            check=True,
            capture_output=True,
        )
        # What a registry image leaves out: apt's lists and caches; enroot mounts the host's /dev.
        for leftover in ("var/lib/apt/lists", "var/cache/apt/archives", "dev"):
            for path in (rootfs / leftover).iterdir():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        partial = Path(build) / "image.sqsh"
        subprocess.run(
            ["mksquashfs", rootfs, partial, "-all-root", "-noappend", *SQUASH_OPTIONS, "-quiet"],
            check=True,
            capture_output=True,
        )
        partial.rename(image)
    return image


def scratchflow_image(slurm, wheelhouse: Path, requirements: Path = REPO / "requirements.txt") -> Path:
    """The image the container profiles run every job step in, built on the test cluster `slurm`
    the way their users build theirs (scripts/build_image.sh: pyxis starts the base image,
    `requirements` go in from `wheelhouse`, --container-save writes the .sqsh). Cached per machine
    by what goes into it; about a minute to build (requirements-cpu.txt: 20 s)."""
    base = base_image()
    inputs = [requirements, REPO / "scripts" / "install_into_image.sh", REPO / "scripts" / "build_image.sh"]
    key = hashlib.sha256(b"".join(path.read_bytes() for path in inputs) + base.name.encode()).hexdigest()[:16]
    image = CACHE / f"scratchflow-{requirements.stem}-{key}.sqsh"
    with open(image.with_name(f"{image.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # tests side by side: the first builds it, the others wait
        if not image.is_file():
            partial = image.with_name(f"{image.name}.partial")
            built = slurm.run(
                str(REPO / "scripts" / "build_image.sh"),
                str(base),
                str(partial),
                "--partition=batch",
                check=False,
                env={"SCRATCHFLOW_WHEELHOUSE": str(wheelhouse), "SCRATCHFLOW_REQUIREMENTS": str(requirements)},
            )
            if built.returncode != 0:
                raise RuntimeError(f"building the test image failed:\n{built.stdout[-3000:]}{built.stderr[-3000:]}")
            partial.rename(image)
    return image
