"""OSU-style point-to-point latency and bandwidth: ``python -m hpcopt bench p2p`` as a script.

    mpiexec -n 2 python benchmarks/speed/p2p.py [--max-bytes 4M] [--json FILE]

The logic lives in hpcopt/bench/p2p.py, so an installed hpcopt runs it without this directory.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt.bench.p2p import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
