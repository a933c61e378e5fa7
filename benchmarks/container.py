"""What a container adds to a job step: the same step, `python -c "import torch, transformers,
snakemake"` (what every job step of scratchflow does first), run by srun on the test Slurm cluster
of the tests (tests/local_slurm.py; root, about a minute to start) on the host and in the test
image through pyxis, as DFKI's and LRZ's profiles run every job step. pyxis here unpacks the image
for each step (`enroot create`, its default); its part of the cost, `enroot create` alone, is
measured beside it, into the test cluster's ENROOT_DATA_PATH (a tmpfs) and into a folder on disk.
Each in-image variant runs with the page cache dropped (a node that has not read the image yet)
and warm (the step before read it).

The image is the tests' (scratchflow_image in tests/conftest.py), built from the cached base image
by scripts/build_image.sh when missing (about a minute and a half).

    .venv/bin/python benchmarks/container.py [--repeats 3]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from measure import REPO, Timing, arguments, print_table, run_timed, save

sys.path.insert(0, str(REPO / "tests"))
from local_containers import container_runtime, scratchflow_image
from local_slurm import LocalSlurm
from scratchflow.containers import IMAGE_PYTHON

# As the plugin starts a job step: the workflow's interpreter by its path; in the image, that path
# runs the image's python (scratchflow.containers mounts scripts/image_python there).
STEP = [sys.executable, "-c", "import torch, transformers, snakemake"]


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def test_image(slurm: LocalSlurm, work: Path) -> Path:
    """The tests' image, built as the tests build it when it is not cached."""
    wheelhouse = work / "wheelhouse"
    tested = ["-c", REPO / "constraints.txt", "-r", REPO / "requirements.txt"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", *tested, "-d", wheelhouse],
        check=True,
    )
    return scratchflow_image(slurm, wheelhouse)


def main() -> None:
    parser = arguments(__doc__)
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with tempfile.TemporaryDirectory(prefix="scratchflow-container-") as temporary:
        work = Path(temporary)
        slurm = LocalSlurm(work / "slurm").start()
        try:
            image = test_image(slurm, work)
            env = {**slurm.env}
            in_image = {
                **env,
                "PYXIS_CONTAINER_IMAGE": str(image),
                "PYXIS_CONTAINER_MOUNTS": f"{IMAGE_PYTHON}:{STEP[0]}:ro",
            }
            srun = slurm.inside("srun", "--partition=batch", "--ntasks=1", *STEP)
            enroot = container_runtime().bin / "enroot"
            runs: dict[str, list[Timing]] = {}
            for _ in range(options.repeats):
                runs.setdefault("host", []).append(run_timed(srun, work, env))
                drop_page_cache()
                runs.setdefault("image, cold page cache", []).append(run_timed(srun, work, in_image))
                runs.setdefault("image, warm page cache", []).append(run_timed(srun, work, in_image))
                drop_page_cache()
                create = [str(enroot), "create", "--force", "--name", "benchmark", str(image)]
                runs.setdefault("enroot create alone, cold", []).append(run_timed(create, work))
                runs.setdefault("enroot create alone, warm", []).append(run_timed(create, work))
                on_disk = {"ENROOT_DATA_PATH": str(work / "enroot-data")}  # instead of the test cluster's tmpfs
                runs.setdefault("enroot create alone, warm, on disk", []).append(run_timed(create, work, on_disk))
                subprocess.run(
                    [str(enroot), "remove", "--force", "benchmark"],
                    env={**os.environ, **on_disk},
                    check=True,
                    capture_output=True,
                )
                subprocess.run([str(enroot), "remove", "--force", "benchmark"], check=True, capture_output=True)
        finally:
            slurm.stop()
    best = {name: min(timing.seconds for timing in timings) for name, timings in runs.items()}
    host = best["host"]
    print_table(
        f"one job step (srun, importing torch, transformers, snakemake) on the test cluster, image "
        f"{image.stat().st_size / 2**30:.2f} GiB, fastest of {options.repeats}",
        ["variant", "s", "x host", "+ s"],
        [[name, seconds, seconds / host, seconds - host] for name, seconds in best.items()],
    )
    save(options.json, "container", {"image_gib": image.stat().st_size / 2**30, "seconds": best})


if __name__ == "__main__":
    main()
