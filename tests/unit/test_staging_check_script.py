"""benchmarks/speed/gpu_check.sh: it must parse, and refuse to start without its result directory."""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "gpu_check.sh"


def test_gpu_check_script_is_valid_bash():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_gpu_check_script_needs_a_directory():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip() == "usage: bash benchmarks/speed/gpu_check.sh DIR"
