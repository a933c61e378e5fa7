"""What trained each run, beyond its settings: the code of its task that record.json names by sha256
(`code_record`: a lab's task module and its schema fragment, or a `command` task's program), and,
read from the records of a grid's runs, where they differ in what trained them (that code,
scratchflow's release, Python, torch, transformers), with the line that trains the odd ones again:
what the status, the aggregate's tables and the report's page say."""

from __future__ import annotations

import datetime
import hashlib
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchflow import SCRATCHFLOW_DIR
from scratchflow.files import file_sha256, read_json
from scratchflow.tasks import is_lab_task, module_root
from scratchflow.tasks.command import program_file


def code_record(task: str, module_file: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The code that trains a run beyond scratchflow's own (whose release and commit the record's
    `environment` names, and with them the built-in tasks): a lab's task module and its schema
    fragment, or a `command` task's program file. Each file's sha256 by its name in `folder` (the
    folder the lab's tasks are found in, or the working directory the program runs in), and one
    sha256 of them all; a built-in task, or a program on PATH, has no files and no sha256."""
    if is_lab_task(task):
        folder = module_root(task, module_file)
        files = [module_file, module_file.with_suffix(".schema.yaml")]
    elif task == "command":
        folder, files = Path.cwd(), [program] if (program := program_file(params["command"])) else []
    else:  # a built-in task: no code of its own
        return {"task": task, "folder": None, "files": {}, "sha256": None}
    hashes = {file_name(path, folder): file_sha256(path) for path in files if path.is_file()}
    return {
        "task": task,
        "folder": str(folder) if hashes else None,
        "files": hashes,
        "sha256": combined_sha256(hashes) if hashes else None,
    }


def file_name(path: Path, folder: Path) -> str:
    """A file's name in `folder`, or its absolute path where it lies outside."""
    resolved = path.resolve()
    return str(resolved.relative_to(folder.resolve())) if resolved.is_relative_to(folder.resolve()) else str(resolved)


def combined_sha256(hashes: dict[str, str]) -> str:
    """One sha256 of named files' sha256 (as `sha256sum` lists them, by name)."""
    listed = "".join(f"{sha256}  {name}\n" for name, sha256 in sorted(hashes.items()))
    return hashlib.sha256(listed.encode()).hexdigest()


# What trained a run besides its task's code, as the runs of one comparison are compared: the record's
# name for each (in `environment`) and the name it is told by.
TRAINED_BY = {
    "scratchflow_version": "scratchflow",
    "python": "Python",
    "torch": "torch",
    "transformers": "transformers",
}
SHORT = 8  # a sha256 as it is shown: its first characters
# What `make verify` found reproduces runs' results (scratchflow.verify), in the grid's folder.
VERIFIED_FILE = Path("results") / "verified.json"
MOST_RUNS_NAMED = 10  # in a sentence; the line that retrains them names them all


def trained_by(record: dict[str, Any]) -> dict[str, str] | None:
    """What trained a run, as text: TRAINED_BY's, and `code`, the sha256 of its task's code (or
    "scratchflow's" for a built-in task); None for a record that names no environment."""
    environment = record.get("environment")
    if not environment:
        return None
    packages = environment.get("packages") or {}
    facts = {}
    for name in TRAINED_BY:
        if name in ("scratchflow_version", "python"):
            facts[name] = str(environment.get(name) or "not recorded")
        else:
            facts[name] = str(packages.get(name) or "not installed")
    code = record.get("code")
    facts["code"] = "not recorded" if code is None else (code["sha256"] or "scratchflow's")
    return facts


@dataclass(frozen=True)
class Difference:
    """A way the runs of one comparison differ in what trained them, told in one line, and the runs
    to train again so that they no longer do."""

    line: str
    runs: list[str]
    # The verifications (`make verify`: run id, day) that found the difference reproduces its runs' results,
    # or, for one still flagged, that found it does not.
    verified: tuple[tuple[str, str], ...] = ()
    found_different: tuple[tuple[str, str], ...] = ()


def differences(records: dict[str, dict[str, Any]], folder: Path) -> list[Difference]:
    """How the runs (run id -> record, in grid order) differ in what trained them: each code file a
    run records against that file as it is now (in `folder`, the directory the grid runs in, or else
    where the run found it; each file hashed once), then scratchflow's release, Python, torch and
    transformers among the runs, where the runs that differ from the newest run are the odd ones."""
    facts = {run_id: run_facts for run_id, record in records.items() if (run_facts := trained_by(record))}
    verified = verified_changes(folder)
    found = _code_differences(records, folder, len(facts), verified)
    unknown = [
        run_id for run_id, fact in facts.items() if fact["code"] == "not recorded" and _own_code(records[run_id])
    ]
    if unknown:
        found.append(
            Difference(
                f"{_count(len(unknown), len(facts))} record no sha256 of their task's code (trained before "
                f"scratchflow recorded it; whether it has changed since is not known): {_named(unknown)}",
                [],
            )
        )
    newest = None
    for name, shown in TRAINED_BY.items():
        values = {run_id: fact[name] for run_id, fact in facts.items()}
        if len(set(values.values())) < 2:
            continue
        newest = newest or max(facts, key=lambda run_id: _finished_at(records[run_id]))
        by_value: dict[str, list[str]] = {}
        for run_id, value in values.items():
            if value != values[newest]:
                by_value.setdefault(value, []).append(run_id)
        for proven in (False, True):
            odd = [
                run_id
                for value, runs in by_value.items()
                for run_id in runs
                if _proven(verified, name, value, values[newest]) == proven
            ]
            if not odd:
                continue
            others = ", ".join(dict.fromkeys(values[run_id] for run_id in odd))
            line = (
                f"{shown} {others} trained {_count(len(odd), len(facts))}, {values[newest]} the newest: {_named(odd)}"
            )
            changes = [(name, values[run_id], values[newest]) for run_id in odd]
            found.append(Difference(line, odd, *_told(verified, changes, proven)))
    return found


def _proven(verified: dict[tuple[str, str, str], dict[str, Any]], what: str, was: str, now: str) -> bool:
    found = verified.get((what, was, now))
    return found is not None and not found["differs"]


def _verifications(
    verified: dict[tuple[str, str, str], dict[str, Any]], changes: list[tuple[str, str, str]], differing: bool = False
) -> tuple[tuple[str, str], ...]:
    """The verifications (run id, day) of these changes: those that found they reproduce runs'
    results, or those that found they do not (`differing`)."""
    found = {
        (entry["run"], entry["on"])
        for change in changes
        if (entry := verified.get(change)) and bool(entry["differs"]) == differing
    }
    return tuple(sorted(found, key=lambda verification: verification[1]))


def _told(
    verified: dict[tuple[str, str, str], dict[str, Any]], changes: list[tuple[str, str, str]], proven: bool
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """A difference's verifications: (those that proved it, those that found it changes results)."""
    if proven:
        return _verifications(verified, changes), ()
    return (), _verifications(verified, changes, differing=True)


def verified_line(difference: Difference) -> str:
    """How a difference was found to reproduce its runs' results: by which run, on which day."""
    runs = ", ".join(f"run {run} on {on}" for run, on in difference.verified)
    return f"verified: trained again with it, {runs} gave the same weights, metrics and predictions, byte for byte"


def flagged_line(difference: Difference) -> str:
    """A difference still to retrain, with the verification that found it changes results, if any."""
    if not difference.found_different:
        return difference.line
    runs = ", ".join(f"run {run} on {on}" for run, on in difference.found_different)
    return f"{difference.line}; make verify found it changes results ({runs})"


def verified_runs(records: dict[str, dict[str, Any]], folder: Path) -> dict[str, str]:
    """Run id -> the days `make verify` found what trained it differently reproduces its results (one
    verification for each way it differs), for the runs trained by other code or packages that
    nothing else flags; what runs.tsv's `verified` column says."""
    found = differences(records, folder)
    flagged = set(to_retrain(found, list(records)))
    days: dict[str, set[str]] = {}
    for difference in found:
        for run_id in difference.runs:
            days.setdefault(run_id, set()).update(on for _run, on in difference.verified)
    return {run_id: ", ".join(sorted(on)) for run_id, on in days.items() if run_id not in flagged and on}


def _own_code(record: dict[str, Any]) -> bool:
    """Whether the run's task is the lab's own code: a lab's task module, or a `command` task's program."""
    task = record.get("task", "")
    return is_lab_task(task) or task == "command"


def _code_differences(
    records: dict[str, dict[str, Any]],
    folder: Path,
    compared: int,
    verified: dict[tuple[str, str, str], dict[str, str]],
) -> list[Difference]:
    hashed: dict[Path, str | None] = {}  # each file as it is now, hashed once
    now: dict[str, str | None] = {}  # a file's name -> its sha256 now
    older: dict[str, dict[str, list[str]]] = {}  # a file's name -> a sha256 runs recorded -> those runs
    for run_id, record in records.items():
        code = record.get("code") or {}
        for name, recorded in code.get("files", {}).items():
            path = code_file_now(code, name, folder)
            if path not in hashed:
                hashed[path] = file_sha256(path) if path.is_file() else None
            now.setdefault(name, hashed[path])
            if hashed[path] != recorded:
                older.setdefault(name, {}).setdefault(recorded, []).append(run_id)
    found = []
    for name, all_by_sha256 in older.items():
        current = now[name]
        for proven in (False, True):
            by_sha256 = {
                sha256: runs
                for sha256, runs in all_by_sha256.items()
                if _proven(verified, name, sha256, current or "") == proven
            }
            if not by_sha256:
                continue
            runs = [run_id for run_id in records if any(run_id in listed for listed in by_sha256.values())]
            was = ", ".join(sha256[:SHORT] for sha256 in by_sha256)
            how = (
                f"as it was before (sha256 {was} ≠ now {current[:SHORT]})"
                if current
                else f"(sha256 {was}), not there now"
            )
            line = f"{name} {how} trained {_count(len(runs), compared)}: {_named(runs)}"
            changes = [(name, sha256, current or "") for sha256 in by_sha256]
            found.append(Difference(line, runs, *_told(verified, changes, proven)))
    return found


def code_file_now(code: dict[str, Any], name: str, folder: Path) -> Path:
    """Where a code file a record names (`code["files"]`) is now: in `folder`, the directory the grid
    runs in, or else where the run found it."""
    path = folder / name
    if not path.is_file() and code.get("folder"):
        return Path(code["folder"]) / name
    return path


def _finished_at(record: dict[str, Any]) -> float:
    stamp = (record.get("environment") or {}).get("finished_at")
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp() if stamp else 0.0


def _count(runs: int, of: int) -> str:
    return f"{runs} of {of} runs"


def _named(run_ids: list[str]) -> str:
    shown = ", ".join(run_ids[:MOST_RUNS_NAMED])
    return shown + (f" and {len(run_ids) - MOST_RUNS_NAMED} more" if len(run_ids) > MOST_RUNS_NAMED else "")


def to_retrain(found: list[Difference], run_ids: list[str]) -> list[str]:
    """The runs any difference names, in the grid's order (`run_ids`)."""
    named = {run_id for difference in found if not difference.verified for run_id in difference.runs}
    return [run_id for run_id in run_ids if run_id in named]


def difference_lines(records: dict[str, dict[str, Any]], workdir: Path, halving: bool) -> list[str]:
    """Where the runs of the grid in `workdir` (their records, in grid order) differ in what trained
    them, with the line that trains the odd ones again from zero (no such line for a halving
    search's runs); none where they do not differ: what the status and the report's page say."""
    found = differences(records, workdir)
    flagged = [difference for difference in found if not difference.verified]
    proven = [difference for difference in found if difference.verified]
    lines = []
    if flagged:
        lines += ["trained by other code or packages:", *(f"  {flagged_line(difference)}" for difference in flagged)]
    redo = to_retrain(found, list(records))
    if redo and halving:
        lines.append(
            "  a halving search's runs are not trained again one by one: run the search again in a new directory"
        )
    elif redo:
        these = "it" if len(redo) == 1 else f"these {len(redo)} runs"
        lines.append(f"  to train {these} again from zero, and nothing else: {command_line('retrain', redo, workdir)}")
        unverified = [run_id for difference in flagged if not difference.found_different for run_id in difference.runs]
        if unverified:
            lines.append(
                "  or, to show that what changed changes no result (the cheapest trained again and compared, byte "
                f"for byte): {command_line('verify', [run_id for run_id in redo if run_id in unverified], workdir)}"
            )
    if proven:
        lines += [
            "trained by other code or packages, verified (make verify) to give the same results:",
            *(f"  {difference.line}; {verified_line(difference)}" for difference in proven),
        ]
    return lines


def command_line(command: str, run_ids: list[str], workdir: Path) -> str:
    """The line that runs scripts/<command>.py (retrain, verify) on `run_ids` of the grid in `workdir`,
    run from here: `make <command>` where this folder's Makefile has that target (scratchflow's own
    folder, a lab's pipeline), else the script itself."""
    runs = " ".join(run_ids)
    elsewhere = workdir.resolve() != Path.cwd().resolve()
    if _has_target(Path("Makefile"), command):
        return f'make {command} RUNS="{runs}"' + (f" DIR={shlex.quote(str(workdir))}" if elsewhere else "")
    script = SCRATCHFLOW_DIR / "scripts" / f"{command}.py"
    return shlex.join([sys.executable, str(script), *run_ids, *(["--dir", str(workdir)] if elsewhere else [])])


def _has_target(makefile: Path, target: str) -> bool:
    try:
        return any(line.startswith(f"{target}:") for line in makefile.read_text().splitlines())
    except (FileNotFoundError, UnicodeDecodeError):
        return False


def verified_changes(workdir: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(what, was, now) -> the newest verification of the change, from the grid's
    results/verified.json (scratchflow.verify; none where it has none): {"run", "on", "differs"}, the
    run trained again, the day, and what of its results differed (none: the change reproduces them)."""
    path = workdir / VERIFIED_FILE
    try:
        verified = read_json(path)
    except (FileNotFoundError, ValueError):
        return {}
    return {
        (change["what"], change["was"], change["now"]): {
            "run": entry["run"],
            "on": entry["on"],
            "differs": entry.get("differs", []),
        }
        for entry in verified
        for change in entry["changes"]
    }
