"""The command line as the tests launch it: ``mpiexec -n N python -m hpcopt ARGS`` from the
repository (``launch``), and the one-line error every rank agrees on (``assert_one_line_error``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.launcher import rank_lines
from tests.timeouts import scaled

#: The repository's root: where a launched job runs, and what it imports hpcopt from.
ROOT = Path(__file__).resolve().parents[1]


def launch(args, ranks=2, python_code=None, timeout=120):
    """Run ``mpiexec -n ranks python -m hpcopt ARGS`` (or python -c CODE) from the repository."""
    command = ["mpiexec", "-n", str(ranks), sys.executable]
    command += ["-c", python_code] if python_code else ["-m", "hpcopt", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT=str(int(scaled(timeout)) - 10))
    return subprocess.run(command, capture_output=True, text=True, timeout=scaled(timeout), env=env,
                          cwd=ROOT)


def assert_one_line_error(result, *fragments):
    """Exit 2, and one line on stderr (whichever rank wrote it) that begins ``hpcopt: error: ``
    and holds every fragment; no traceback anywhere."""
    lines = rank_lines(result.stderr)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hpcopt: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.stdout + result.stderr
