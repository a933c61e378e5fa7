"""Stage-in: how fast scratchflow moves a dataset from shared storage onto node-local scratch
(read the archive, verify its sha256, extract it), next to the physical floor and the naive ways.

Datasets: many small files (100,000 text files of about 3 KB) and a few large ones (1 GB in 16 MB
binary files). Variants, each from a cold page cache when this runs as root (else warm, and said):
- floor: `cat archive > /dev/null`, then a bare `tar -x` of it: reading one archive plus extracting;
- scratchflow: `scratchflow.staging.stage_in` of one archive, of the archive in parts (as
  `archive_parts: auto` or --parts splits it), and of the same parts compressed with zstd;
- the parallel variants: a bare `tar -x` of each of the same parts, all at once (no checksum), and
  the same with a `sha256sum` of each part beside it (what verifying costs, done by hand);
- copy, then extract: what stage_in did at first (hashing copy to scratch, tar -x);
- cp -r / rsync -a of the dataset folder: the naive ways;
- zstd / pigz compressed single archives, decompressed into tar (tools not installed are skipped).
"speed vs floor" is floor time / variant time: 1.0 is the floor. Goals: one archive >= 0.8 of the
floor; parts >= 0.9 of the bare parallel extraction of the same parts.

    .venv/bin/python benchmarks/stage_in.py [--small-files 100000] [--large-mb 1024] [--parts auto] [--repeats 3]
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from measure import Timing, arguments, print_table, save, time_call
from scratchflow.staging import COPY_BLOCK_BYTES, archive_dataset, archive_suffix, stage_in

SMALL_FILE_BYTES = 3000
LARGE_FILE_BYTES = 16 * 2**20
DATASET = {"name": "bench", "format": "folder"}


def make_small_files(root: Path, count: int) -> Path:
    """`count` text files of about 3 KB in 100 label folders; words drawn from a fixed vocabulary,
    so that they compress like text."""
    generator = random.Random(0)
    vocabulary = [
        "".join(generator.choices("abcdefghijklmnopqrstuvwxyz", k=generator.randint(2, 10))) for _ in range(5000)
    ]
    for index in range(count):
        folder = root / f"label{index % 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        words = generator.choices(vocabulary, k=SMALL_FILE_BYTES // 6)
        (folder / f"{index:06d}.txt").write_text(" ".join(words)[:SMALL_FILE_BYTES])
    return root


def make_large_files(root: Path, megabytes: int) -> Path:
    """Binary files of 16 MB (like images or arrays: they do not compress)."""
    generator = random.Random(1)
    folder = root / "arrays"
    folder.mkdir(parents=True)
    for index in range(max(1, megabytes * 2**20 // LARGE_FILE_BYTES)):
        (folder / f"{index:04d}.bin").write_bytes(generator.randbytes(LARGE_FILE_BYTES))
    return root


class Bench:
    """One dataset on 'shared storage', its archives (one, in parts, in compressed parts), and a
    scratch folder emptied between runs."""

    def __init__(self, work: Path, data: Path, parts: int | str):
        self.work, self.data = work, data
        self.layouts = {
            "one": {"archive_parts": 1},
            "parts": {"archive_parts": parts},
            "zstd parts": {"archive_parts": parts, "compression": "zstd"},
        }
        self.archives = {}
        for layout, keys in self.layouts.items():
            if keys.get("compression") and not shutil.which("zstd"):
                continue
            folder = work / layout.replace(" ", "-")
            first = folder / f"data{archive_suffix(keys)}"
            record = archive_dataset({**DATASET, **keys, "path": str(data)}, first, folder / "data.manifest.json")
            self.archives[layout] = (first, folder / "data.manifest.json", record)
        self.archive, _, self.record = self.archives["one"]
        self.scratch = work / "scratch"
        self.cold = _can_drop_caches()

    def parts(self, layout: str = "parts") -> list[Path]:
        first, _, record = self.archives[layout]
        return [first.with_name(part["file"]) for part in record["parts"]]

    def compressed(self, tool: list[str], suffix: str) -> Path:
        path = self.work / f"data.tar.{suffix}"
        if not path.exists():
            with open(self.archive, "rb") as source, open(path, "wb") as target:
                subprocess.run([*tool, "-c"], stdin=source, stdout=target, check=True)
        return path

    def measure(self, variant: Callable[[Path], object]) -> Timing:
        """Time `variant(scratch)` from an empty scratch folder and, where allowed, a cold cache."""
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch.mkdir()
        subprocess.run(["sync"], check=True)
        if self.cold:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return time_call(lambda: variant(self.scratch))


def _can_drop_caches() -> bool:
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def variants(bench: Bench) -> dict[str, Callable[[Path], object]]:
    def floor(scratch: Path) -> None:
        subprocess.run(["cat", str(bench.archive)], stdout=subprocess.DEVNULL, check=True)
        subprocess.run(["tar", "--extract", f"--file={bench.archive}", f"--directory={scratch}"], check=True)

    def copy_then_extract(scratch: Path) -> None:
        local, digest = scratch / "data.tar", hashlib.sha256()
        with open(bench.archive, "rb") as reader, open(local, "wb") as writer:
            while block := reader.read(COPY_BLOCK_BYTES):
                digest.update(block)
                writer.write(block)
        assert digest.hexdigest() == bench.record["sha256"]
        (scratch / "data").mkdir()
        subprocess.run(["tar", "--extract", f"--file={local}", f"--directory={scratch / 'data'}"], check=True)
        local.unlink()

    def decompressing(tool: str, suffix: str) -> Callable[[Path], object]:
        archive = bench.compressed([tool], suffix)
        return lambda scratch: subprocess.run(
            f'{tool} -dc "{archive}" | tar --extract --file=- --directory="{scratch}"', shell=True, check=True
        )

    parts = bench.parts()

    def parallel(scratch: Path) -> None:
        extracting = [
            subprocess.Popen(["tar", "--extract", f"--file={part}", f"--directory={scratch}"]) for part in parts
        ]
        assert all(process.wait() == 0 for process in extracting)

    def parallel_verified(scratch: Path) -> None:
        running = [
            subprocess.Popen(command, stdout=subprocess.DEVNULL)
            for part in parts
            for command in (["tar", "--extract", f"--file={part}", f"--directory={scratch}"], ["sha256sum", str(part)])
        ]
        assert all(process.wait() == 0 for process in running)

    def scratchflow(layout: str) -> Callable[[Path], object]:
        first, manifest, _ = bench.archives[layout]
        return lambda scratch: stage_in(first, manifest, scratch)

    found = {
        "floor (cat + tar -x)": floor,
        "scratchflow stage_in, one archive": scratchflow("one"),
        f"scratchflow stage_in, {len(parts)} parts": scratchflow("parts"),
        f"{len(parts)} parts, tar -x at once (no sha256)": parallel,
        f"{len(parts)} parts, tar -x and sha256sum at once": parallel_verified,
        "copy+sha256, then tar -x": copy_then_extract,
        "cp -r": lambda scratch: subprocess.run(["cp", "-r", str(bench.data), str(scratch)], check=True),
        "rsync -a": lambda scratch: subprocess.run(["rsync", "-a", f"{bench.data}/", f"{scratch}/"], check=True),
    }
    if "zstd parts" in bench.archives:
        found[f"scratchflow stage_in, {len(parts)} parts, zstd"] = scratchflow("zstd parts")
    for tool, suffix in (("zstd", "zst"), ("pigz", "gz")):
        if shutil.which(tool):
            found[f"{tool} -d | tar -x (no sha256)"] = decompressing(tool, suffix)
    return found


def run(bench: Bench, repeats: int) -> dict[str, dict[str, float]]:
    """Every variant `repeats` times, in turn; the fastest of each, and its speed relative to the floor."""
    timings: dict[str, list[Timing]] = {}
    todo = variants(bench)
    for _ in range(repeats):
        for name, variant in todo.items():
            timings.setdefault(name, []).append(bench.measure(variant))
    best = {name: min(runs, key=lambda t: t.seconds).seconds for name, runs in timings.items()}
    floor = best["floor (cat + tar -x)"]
    return {name: {"seconds": seconds, "speed_vs_floor": floor / seconds} for name, seconds in best.items()}


def _parts(value: str) -> int | str:
    return value if value == "auto" else int(value)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--small-files", type=int, default=100_000, help="0 to skip the small-file set")
    parser.add_argument("--large-mb", type=int, default=1024, help="0 to skip the large-file set")
    parser.add_argument("--parts", default="auto", help="how many parts the split archive has (default: auto)")
    parser.add_argument("--dir", type=Path, help="where to work (default: a temporary folder)")
    options = parser.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="scratchflow-stage-in-", dir=options.dir) as temporary:
        root = Path(temporary)
        sets = {
            f"{options.small_files} small files": (make_small_files, options.small_files),
            f"{options.large_mb} MB in large files": (make_large_files, options.large_mb),
        }
        for name, (make, size) in sets.items():
            if size <= 0:
                continue
            work = root / name.replace(" ", "-")
            bench = Bench(work, make(work / "dataset", size), _parts(options.parts))
            results = run(bench, options.repeats)
            sizes = {layout: record["archive_bytes"] / 1e6 for layout, (_, _, record) in bench.archives.items()}
            figures[name] = {
                "files": bench.record["files"],
                "mb": bench.record["bytes"] / 1e6,
                "archive_mb": sizes,
                "parts": len(bench.parts()),
                "cache": "cold" if bench.cold else "warm",
                "variants": results,
            }
            print_table(
                f"{name}: {bench.record['files']} files, {bench.record['bytes'] / 1e6:.0f} MB, "
                f"{'cold' if bench.cold else 'warm'} cache, fastest of {options.repeats}",
                ["variant", "seconds", "MB/s", "speed vs floor"],
                [
                    [
                        variant,
                        result["seconds"],
                        bench.record["bytes"] / 1e6 / result["seconds"],
                        result["speed_vs_floor"],
                    ]
                    for variant, result in results.items()
                ],
            )
            print("  archives (MB): " + ", ".join(f"{name} {size:.0f}" for name, size in sizes.items()))
    save(options.json, "stage_in", {"repeats": options.repeats, "datasets": figures})


if __name__ == "__main__":
    main()
