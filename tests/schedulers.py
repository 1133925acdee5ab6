"""Stand-ins for ``sbatch`` and ``qsub`` that run a job array's tasks on this machine.

    python -m tests.schedulers sbatch|qsub SCRIPT

Reads the script's ``#SBATCH`` lines (``--array``, ``--ntasks``, ``--output``) or ``#PBS``
lines (``-J``, ``-o``, ``-W max_run_subjobs``) and runs the script once per array index, K at a
time (the throttle, else one), from the current directory, with the array variable set
(``SLURM_ARRAY_TASK_ID`` or ``PBS_ARRAY_INDEX``, and ``SLURM_NTASKS`` or ``PBS_O_WORKDIR``) and
its output in the log file the directives name. Under ``sbatch`` the script's ``srun`` is a
stand-in that starts ``mpiexec -n $SLURM_NTASKS``. Like the real commands it prints the job's
id and exits 0, but only once every task has ended.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

SRUN = '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec mpiexec -n "$SLURM_NTASKS" "$@"\n'
JOB_ID = "4242"


def directives(script: Path, prefix: str) -> list[str]:
    """The words of the script's ``prefix`` lines (``#SBATCH``, ``#PBS``), in order."""
    words = []
    for line in script.read_text().splitlines():
        if line.startswith(prefix + " "):
            words += line[len(prefix):].split()
    return words


def indices(spec: str) -> tuple[list[int], int]:
    """Array indices and throttle of ``A-B[:S][%K]`` or ``A,B,...``."""
    spec, _, throttle = spec.partition("%")
    found: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        assert match, f"array range {part!r}"
        first, last, step = match.group(1), match.group(2) or match.group(1), match.group(3) or "1"
        found += range(int(first), int(last) + 1, int(step))
    return found, int(throttle or 1)


def slurm(script: Path) -> tuple[list[int], int, dict[str, str], str]:
    options = dict(word.removeprefix("--").split("=", 1) for word in directives(script, "#SBATCH")
                   if word.startswith("--") and "=" in word)
    tasks, throttle = indices(options["array"])
    return tasks, throttle, {"SLURM_NTASKS": options.get("ntasks", "1")}, options["output"]


def pbs(script: Path) -> tuple[list[int], int, dict[str, str], str]:
    words = directives(script, "#PBS")
    options = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("-")}
    tasks, _ = indices(options["-J"])
    throttle = re.fullmatch(r"max_run_subjobs=(\d+)", options.get("-W", ""))
    return tasks, int(throttle.group(1)) if throttle else 1, {"PBS_O_WORKDIR": os.getcwd()}, options["-o"]


def submit(kind: str, script: Path) -> int:
    tasks, throttle, variables, output = (slurm if kind == "sbatch" else pbs)(script)
    index_variable = "SLURM_ARRAY_TASK_ID" if kind == "sbatch" else "PBS_ARRAY_INDEX"
    with tempfile.TemporaryDirectory() as shims:
        srun = Path(shims) / "srun"
        srun.write_text(SRUN)
        srun.chmod(0o755)
        env = dict(os.environ, PATH=f"{shims}{os.pathsep}{os.environ['PATH']}", **variables)
        waiting = list(tasks)
        running: list[tuple[subprocess.Popen, IO[bytes]]] = []
        while waiting or running:
            while waiting and len(running) < throttle:
                index = waiting.pop(0)
                log = Path(output.replace("%a", str(index)).replace("%A", JOB_ID)
                           .replace("^array_index^", str(index)))
                handle = open(log, "wb")
                process = subprocess.Popen(["bash", str(script)], env={**env, index_variable: str(index)},
                                           stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                running.append((process, handle))
            process, handle = running.pop(0)
            process.wait()
            handle.close()
    print(f"Submitted batch job {JOB_ID}" if kind == "sbatch" else f"{JOB_ID}[].server")
    return 0


if __name__ == "__main__":
    assert len(sys.argv) == 3 and sys.argv[1] in ("sbatch", "qsub"), __doc__
    sys.exit(submit(sys.argv[1], Path(sys.argv[2])))
