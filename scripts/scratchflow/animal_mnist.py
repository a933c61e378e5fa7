"""Real images for the image task's example and tests, offline: the 10,000 28x28 silhouettes of 10
animals shipped in the PyPI package animal-mnist (MIT), written out as a folder of PNGs per label."""

from __future__ import annotations

import gzip
import pickle
import warnings
from pathlib import Path

from scratchflow.dataset import resolve_location

PACKAGE_DATA = "package:animal_mnist/data/Animal_MNIST"
# The package's label numbers, in the order its description lists the classes.
LABELS = ("bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep", "zebra")


def load_arrays():
    """(images uint8 [N, 28, 28], labels int [N]) as the package ships them (numpy pickles)."""
    folder = resolve_location(PACKAGE_DATA)
    with warnings.catch_warnings():  # pickled with numpy 1 (numpy.core)
        warnings.simplefilter("ignore", DeprecationWarning)
        with gzip.open(folder / "animal_data_version_3.gz") as source:
            images = pickle.load(source)
        with gzip.open(folder / "animal_label_version_3.gz") as source:
            labels = pickle.load(source)
    return images, labels


def write_pngs(destination: Path, per_label: int | None = None, labels: tuple[str, ...] = LABELS) -> Path:
    """`destination/<label>/<index>.png` for the first `per_label` images of each of `labels` (all
    if None); returns `destination`. Written once: an existing folder is kept as it is."""
    from PIL import Image

    if destination.is_dir():
        return destination
    images, numbers = load_arrays()
    partial = destination.with_name(f".{destination.name}.partial")
    counts = dict.fromkeys(labels, 0)
    for index, (pixels, number) in enumerate(zip(images, numbers, strict=True)):
        label = LABELS[int(number)]
        if label not in counts or (per_label is not None and counts[label] >= per_label):
            continue
        counts[label] += 1
        (partial / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.astype("uint8"), mode="L").save(partial / label / f"{index:05d}.png")
    partial.rename(destination)
    return destination
