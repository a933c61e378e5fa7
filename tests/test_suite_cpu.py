"""benchmarks/suite_cpu.py: a command's CPU time, by kind of process, read from /proc."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUSY = "import time\nend = time.process_time() + 2.5\nwhile time.process_time() < end: pass"


def test_the_cpu_a_command_spends_is_counted_under_its_kind(tmp_path):
    figures_file = tmp_path / "cpu.json"
    program = tmp_path / "busy_program.py"
    program.write_text(BUSY)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "suite_cpu.py"),
            "--json",
            str(figures_file),
            "--",
            sys.executable,
            str(program),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # as a test's job works in the test's pytest folder
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(figures_file.read_text())
    # A Python program the kinds do not name goes by its script (no other test's Python beside it).
    assert 1.5 / 60 < figures["cpu_minutes"].get("python busy_program.py", 0) < 4 / 60, result.stderr
    assert figures["wall_minutes"] >= 2.5 / 60
    # Counted under this test, by the pytest folder it worked in (the test's name, cut, and a number).
    test = tmp_path.name.rstrip("0123456789")
    assert figures["cpu_minutes_by_test"].get(test, 0) > 1.5 / 60, figures["cpu_minutes_by_test"]
