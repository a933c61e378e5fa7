"""What every figure shares: matplotlib without a display (cluster nodes have none), and a PNG
that appears whole or not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scratchflow.files import written_whole


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, imported only by the jobs that draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(figure: Any, path: Path, dpi: int) -> None:
    with written_whole(path) as partial:
        figure.savefig(partial, dpi=dpi, format="png")
    pyplot().close(figure)
