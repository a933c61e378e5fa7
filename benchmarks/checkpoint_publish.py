"""Publishing a checkpoint: what a copy that proves itself costs against a bare rsync.

A checkpoint of about MiniLM's size (273 MB: weights 91 MB, optimizer 182 MB, a few small files) on
scratch, published to another folder three ways, in turn, each into a fresh destination:
- baseline: `rsync --archive` of the folder, as a hand-written job copies it;
- copy: `staging.copy_whole` (rsync, the copy compared with its source, then renamed into place);
- publish: `CheckpointStore.mirror` (its files' sha256 into contents.json, then copy_whole, then the
  pruning), and, apart, the verification a resuming job makes (`checkpoint_damage`: every file's
  size and sha256).
Both folders are on the same local disk here; on a cluster the destination is a network filesystem,
where the copy costs more and the checksums (computed on scratch) the same.

    .venv/bin/python benchmarks/checkpoint_publish.py [--repeats 3]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from measure import arguments, fastest, print_table, save, time_call
from scratchflow.checkpoints import CheckpointStore, checkpoint_damage
from scratchflow.lease import RunFolder
from scratchflow.staging import copy_whole

MARKER = "trainer_state.json"
FILES = {"model.safetensors": 91_000_000, "optimizer.pt": 182_000_000, "scheduler.pt": 1_500, "rng_state.pth": 15_000}


def checkpoint(root: Path) -> Path:
    folder = root / "scratch" / "checkpoint-100"
    folder.mkdir(parents=True)
    for name, size in FILES.items():
        (folder / name).write_bytes(os.urandom(size))
    (folder / MARKER).write_text("{}")
    return folder


def main() -> None:
    options = arguments(__doc__.split("\n\n")[0]).parse_args()
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        source = checkpoint(root)
        attempts = iter(range(1_000_000))

        def fresh(name: str) -> Path:
            return root / f"{name}-{next(attempts)}"

        def bare_rsync() -> None:
            subprocess.run(["rsync", "--archive", f"{source}/", f"{fresh('rsync')}/"], check=True)

        def clean() -> None:
            for stale in root.iterdir():
                if stale.name != "scratch":
                    shutil.rmtree(stale)

        copy, baseline = fastest(
            lambda: time_call(lambda: (copy_whole(source, fresh("copy") / source.name), clean())),
            lambda: time_call(lambda: (bare_rsync(), clean())),
            options.repeats,
        )
        publish, _ = fastest(
            lambda: time_call(lambda: (CheckpointStore(RunFolder(fresh("run")), MARKER).mirror(source), clean())),
            lambda: time_call(lambda: (bare_rsync(), clean())),
            options.repeats,
        )
        published = CheckpointStore(RunFolder(root / "run"), MARKER).mirror(source)
        verify, _ = fastest(
            lambda: time_call(lambda: checkpoint_damage(published)),
            lambda: time_call(bare_rsync),
            options.repeats,
        )
    rows = [
        ["bare rsync --archive", baseline.seconds, 1.0],
        ["copy_whole (compared, renamed)", copy.seconds, copy.seconds / baseline.seconds],
        ["mirror (sha256 + copy_whole + prune)", publish.seconds, publish.seconds / baseline.seconds],
        ["verify before resuming (sizes + sha256)", verify.seconds, verify.seconds / baseline.seconds],
    ]
    print_table(
        f"Publishing a {sum(FILES.values()) / 1e6:.0f} MB checkpoint (fastest of {options.repeats})",
        ["what", "seconds", "x bare rsync"],
        rows,
    )
    save(options.json, "checkpoint_publish", {row[0]: {"seconds": row[1], "ratio": row[2]} for row in rows})


if __name__ == "__main__":
    main()
