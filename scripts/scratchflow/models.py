"""The model cache: every model the compute jobs load, resolved on shared storage beforehand.

Compute nodes of some clusters (the Alliance's) have no internet, so jobs load models only from this
cache, with the hub switched off. Resolving a model (the one step that may download) runs on the
login node, as a local rule.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from scratchflow.dataset import PACKAGE_PREFIX, resolve_location
from scratchflow.staging import copy_whole

LOCAL_PATH_STARTS = ("/", "./", "../", "~")
# Hub repositories often carry the same weights for other frameworks too; PyTorch needs none of them.
OTHER_FRAMEWORK_FILES = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "onnx/*", "openvino/*", "coreml/*", "tf_model*"]


class ModelSourceError(ValueError):
    """The configured model source cannot be resolved."""


def is_local_source(source: str) -> bool:
    """A path or packaged model (must exist here), as opposed to a hub name like 'org/model'."""
    return source.startswith((PACKAGE_PREFIX, *LOCAL_PATH_STARTS)) or Path(source).exists()


def switch_hub_off() -> None:
    """No download from here on: a job that would need one fails at once instead of hanging."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def read_token(token_file: str | None) -> str | None:
    """The hub token in `token_file`; None leaves huggingface_hub to its own sources (HF_TOKEN, the
    file `huggingface-cli login` writes). Never logged, never written anywhere."""
    return Path(token_file).expanduser().read_text().strip() if token_file else None


def prefetch(
    source: str, destination: Path, token_file: str | None = None, check_loadable: Callable[[Path], None] | None = None
) -> None:
    """Resolve `source` (a local path, 'package:NAME/path', or a hub name) into `destination`, a
    directory that loads with `local_files_only=True` (`check_loadable`, the task's own loading, proves
    it). The directory appears whole or not at all."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    if is_local_source(source):
        location = resolve_location(source)
        if not (location / "config.json").is_file():
            raise ModelSourceError(f"model source {source!r} -> {location}: no config.json there")
        copy_whole(location, destination)
    else:
        from huggingface_hub import snapshot_download

        with tempfile.TemporaryDirectory(dir=destination.parent) as download:
            snapshot_download(
                repo_id=source,
                local_dir=download,
                ignore_patterns=OTHER_FRAMEWORK_FILES,
                token=read_token(token_file),
            )
            copy_whole(Path(download), destination)
    switch_hub_off()
    if check_loadable is not None:
        # Prove now, on the login node, that the cache is complete for offline loading.
        check_loadable(destination)
