"""Where a job's Python comes from, named when it lacks a module the job imports: a container
profile's image, or the environment of the interpreter that runs the job. Standard library only, so
that it can say so when nothing else imports."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

BUILD_IMAGE = 'scripts/build_image.sh builds one with requirements.txt (docs/clusters.md, "Containers")'


def missing_module_message(
    error: ModuleNotFoundError, environ: Mapping[str, str] = os.environ, executable: str = sys.executable
) -> str:
    """What a job that could not import `error.name` says instead of an import traceback."""
    image = environ.get("PYXIS_CONTAINER_IMAGE")
    if image:
        return (
            f"the image {image} has no Python module {error.name!r}, which this job imports "
            f"(its python: {executable}); {BUILD_IMAGE}"
        )
    return (
        f"the Python environment of {executable} has no module {error.name!r}, which this job imports; "
        'install requirements.txt into it (docs/clusters.md, "Notes per cluster")'
    )


def describe_failure(error: BaseException) -> str:
    """A job's failure in one line: a missing module with where it is missing, anything else as raised."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        return missing_module_message(error)
    return f"{type(error).__name__}: {error}"
