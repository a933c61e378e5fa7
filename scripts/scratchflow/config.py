"""The checks on a configuration that a JSON schema cannot express, made before any job starts."""

from __future__ import annotations

from typing import Any

from scratchflow.dataset import DatasetError, resolve_location
from scratchflow.models import is_local_source


class ConfigError(ValueError):
    """The configuration names something that does not exist or does not fit; the message names the key."""


def explain_schema_error(error: Exception) -> str | None:
    """One line naming the offending key, for the jsonschema error inside Snakemake's validation
    error (whose own message prints the whole schema); None if there is no such error inside."""
    import jsonschema

    cause = error.__cause__ or error.__context__  # Snakemake raises its error while handling this one
    if not isinstance(cause, jsonschema.ValidationError):
        return None
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in cause.absolute_path)
    key = key.lstrip(".") or "(top level)"
    message = f"config key {key}: {cause.message}"
    if cause.validator == "additionalProperties":
        allowed = sorted(cause.schema.get("properties", {}))
        message += f"; the keys allowed there are: {', '.join(allowed)}"
    if cause.validator == "type" and isinstance(cause.instance, str):
        try:
            float(cause.instance)
        except ValueError:
            pass
        else:
            message += f" (YAML reads {cause.instance} as text: write it with a decimal point, e.g. 1.0e-4)"
    return message


def check_paths(config: dict[str, Any]) -> None:
    """The dataset and a local model source must exist here, in the form the config says."""
    dataset = config["dataset"]
    try:
        data = resolve_location(dataset["path"])
    except DatasetError as error:
        raise ConfigError(f"dataset.path: {error}") from None
    if not data.exists():
        raise ConfigError(f"dataset.path: {dataset['path']!r} does not exist (resolved to {data})")
    if dataset["format"] == "folder" and not data.is_dir():
        raise ConfigError(f"dataset.path: format 'folder' needs a directory with one sub-folder per label, got {data}")
    if dataset["format"] != "folder" and not data.is_file():
        raise ConfigError(f"dataset.path: format {dataset['format']!r} needs a file, got {data}")

    source = config["model"]["source"]
    if is_local_source(source):
        try:
            model = resolve_location(source)
        except DatasetError as error:
            raise ConfigError(f"model.source: {error}") from None
        if not (model / "config.json").is_file():
            raise ConfigError(
                f"model.source: {source!r} looks like a local model, but {model} has no config.json "
                "(a hub name looks like 'org/model'; a local model is a directory saved with save_pretrained)"
            )
