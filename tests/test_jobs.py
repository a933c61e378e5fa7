"""What every job does around its work: where its failure is told."""

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_a_failing_job_puts_its_traceback_in_its_log_and_one_line_first_on_the_console(tmp_path):
    log = tmp_path / "logs" / "train" / "run.log"
    job = f"""
from scratchflow.jobs import job_context

def tokenize(texts):
    return texts[0]

with job_context({str(log)!r}):
    print("loading the data")
    tokenize([])
"""
    script = tmp_path / "job.py"
    script.write_text(job)
    result = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": SCRIPTS}
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "scratchflow: job failed: IndexError: list index out of range",
        f"  its log, with the traceback: {log}",
    ]
    written = log.read_text()
    assert "loading the data" in written
    assert "ERROR scratchflow: job failed: IndexError: list index out of range\nTraceback" in written
    assert "in tokenize\n    return texts[0]" in written


def test_a_paused_piece_says_so_at_info_and_names_the_log_it_keeps(tmp_path):
    """A stop on request (TrainingStopped) is planned: no traceback, no ERROR, and the console names
    the piece's own log (the rule's log is the next piece's), as the job still exits non-zero for
    Snakemake's retry. Before, it read "job failed: TrainingStopped" with a traceback."""
    log = tmp_path / "logs" / "train" / "run.log"
    kept = tmp_path / "logs" / "train" / "run.piece-2.log"
    job = f"""
from pathlib import Path
from scratchflow.jobs import job_context
from scratchflow.piece import finished
from scratchflow.piece_spec import Paused

with job_context({str(log)!r}):
    finished(Paused("SIGUSR1", "training", 40, log=Path({str(kept)!r})))
"""
    script = tmp_path / "job.py"
    script.write_text(job)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SCRIPTS)}
    result = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "scratchflow: paused, not failed: stopped on SIGUSR1 at step 40 and paused; the next piece resumes from "
        f"checkpoint-40; this piece's log: {kept}"
    ]
    written = log.read_text()
    assert "INFO scratchflow: paused, not failed: stopped on SIGUSR1 at step 40" in written
    assert "Traceback" not in written and "ERROR" not in written


def test_a_jobs_console_lines_reach_the_console_and_not_its_log(tmp_path):
    """Progress lines (hf_trainer.ProgressLog) go to the log and, with the run's id, to the console:
    Snakemake's output, where a user waiting for the demo looks."""
    log = tmp_path / "run.log"
    script = tmp_path / "job.py"
    script.write_text(
        "import logging\n"
        "from scratchflow.jobs import job_context\n"
        "from scratchflow.tracking import console_log\n"
        f"with job_context({str(log)!r}):\n"
        "    logging.getLogger('scratchflow.hf_trainer').info('step 10/49 (20%)')\n"
        "    console_log.info('run 8ec4b8746c: %s', 'step 10/49 (20%)')\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SCRIPTS)}
    result = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["scratchflow: run 8ec4b8746c: step 10/49 (20%)"]
    written = log.read_text()
    assert "INFO scratchflow.hf_trainer: step 10/49 (20%)" in written
    assert "8ec4b8746c" not in written


def test_a_job_whose_python_lacks_a_module_names_the_module_and_the_image_or_environment(tmp_path):
    """An image (or venv) built without requirements.txt: the job fails at its first import of the
    missing package, saying which package and where it is missing, not with an import traceback."""
    log = tmp_path / "run.log"
    script = tmp_path / "job.py"
    script.write_text(
        f"from scratchflow.jobs import job_context\nwith job_context({str(log)!r}):\n    import transformers_absent\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SCRIPTS)}
    on_the_host = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env)
    assert on_the_host.returncode == 1
    assert on_the_host.stderr.splitlines()[0] == (
        f"scratchflow: job failed: the Python environment of {sys.executable} has no module "
        "'transformers_absent', which this job imports; install your pipeline's requirements.txt into it "
        '(docs/clusters.md, "Notes per cluster")'
    )
    image = {**env, "PYXIS_CONTAINER_IMAGE": "/images/cpu.sqsh"}
    in_an_image = subprocess.run([sys.executable, script], capture_output=True, text=True, env=image)
    said = in_an_image.stderr.splitlines()[0]
    assert said.startswith(
        "scratchflow: job failed: the image /images/cpu.sqsh has no Python module 'transformers_absent'"
    )
    assert "scripts/build_image.sh" in said and "Traceback" in log.read_text()


def test_the_stop_file_is_written_by_several_processes_at_once_without_failing(tmp_path):
    """Slurm signals every process of a job: the job and its node's launcher, which share a scratch
    folder, both write the stop file at the same moment (once, a scancel failed the job that way)."""
    writer = (
        "import sys; from pathlib import Path; from scratchflow.signals import write_stop_file\n"
        "for _ in range(300): write_stop_file(Path(sys.argv[1]), 'SIGTERM')\n"
    )
    writers = [
        subprocess.Popen([sys.executable, "-c", writer, tmp_path / "stop-requested"], env={"PYTHONPATH": SCRIPTS})
        for _ in range(3)
    ]
    assert [process.wait() for process in writers] == [0, 0, 0]
    assert [path.name for path in tmp_path.iterdir()] == ["stop-requested"]


def test_a_sigterm_while_the_model_is_copied_back_pauses_the_piece_and_the_stop_signal_does_not(tmp_path):
    """SIGTERM during the sync back (a scancel, a preemption, the time limit): the job is ending, and
    on Slurm the job step's Snakemake, which had it too, fails the job and removes its outputs; so
    the piece pauses instead of recording a run that would be removed. The stop signal (the warning
    before the wall time, with time left) does not end the job: the run is recorded."""
    from scratchflow.piece import Trained, _terminated_while_syncing
    from scratchflow.piece_spec import Paused
    from scratchflow.signals import STOP_FILE_NAME, write_stop_file

    trained = Trained(tmp_path / "model", {"global_steps": 60})
    assert _terminated_while_syncing(tmp_path, trained) is trained  # no stop at all
    write_stop_file(tmp_path / STOP_FILE_NAME, "SIGUSR1")
    assert _terminated_while_syncing(tmp_path, trained) is trained
    write_stop_file(tmp_path / STOP_FILE_NAME, "SIGTERM")
    paused = _terminated_while_syncing(tmp_path, trained)
    assert paused == Paused("SIGTERM", "syncing", 60)
    assert paused.line().startswith("stopped on SIGTERM while copying the trained model back, after")


def test_a_packed_run_marks_its_slurm_jobs_end_only_if_it_fails_and_its_pack_job_does(tmp_path):
    """A marker makes the submitting Snakemake check the grid's jobs within seconds. A packed run's
    Slurm job goes on with the pack's next run: its marker only made checks every 2 s for 2 minutes
    (18 squeue a minute on the test cluster, benchmarks/README.md section 20)."""
    job = """
import sys
from scratchflow.jobs import job_context

ends_its_slurm_job, fails = sys.argv[1] == "last", sys.argv[2] == "fails"
with job_context("log", ends_its_slurm_job=ends_its_slurm_job):
    if fails:
        raise RuntimeError("the loss is NaN")
"""
    (tmp_path / "job.py").write_text(job)
    marked = []
    for number, (role, outcome) in enumerate([("packed", "trains"), ("packed", "fails"), ("last", "trains")]):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SCRIPTS), "SLURM_JOB_ID": str(number)}
        subprocess.run([sys.executable, "job.py", role, outcome], cwd=tmp_path, capture_output=True, env=env)
        marked = sorted(path.name for path in (tmp_path / ".snakemake" / "scratchflow" / "job-ends").glob("*"))
    assert marked == ["1", "2"], "the failed packed run ends its Slurm job's group; the pack job ends the Slurm job"
