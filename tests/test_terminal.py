"""While Ray may print, what it prints goes to the run's log; the testbed's own lines reach the terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PROGRAM = """
import os, sys
from pathlib import Path
from testbed.actors.terminal import ray_output_to

print("before", flush=True)
with ray_output_to(Path(sys.argv[1])) as terminal:
    print("a python print, as Ray's error thread does it", flush=True)
    sys.stderr.write("a logger line\\n")
    sys.stderr.flush()
    os.write(1, b"the C++ core writing to fd 1\\n")
    os.write(2, b"the C++ core writing to fd 2\\n")
    os.system("echo a daemon it started")
    terminal.out.write("the testbed's own line\\n")
    terminal.err.write("the progress line\\n")
print("after", flush=True)
"""


def test_everything_written_to_the_standard_streams_inside_goes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "run" / "ray.log"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["before", "the testbed's own line", "after"]
    assert proc.stderr.splitlines() == ["the progress line"]
    kept = log.read_text()
    for line in ("a python print", "a logger line", "fd 1", "fd 2", "a daemon it started"):
        assert line in kept
    assert "testbed's own" not in kept
