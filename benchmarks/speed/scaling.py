"""Strong and weak scaling of PR-SGD (and CELGC): ``python -m hpcopt bench scaling`` as a script.

    python benchmarks/speed/scaling.py [--ranks 1 2 4] [--algorithms prsgd celgc] [--repeats 3] [--steps 600]

The logic lives in hpcopt/bench/scaling.py, so an installed hpcopt runs it without this directory.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt.bench.scaling import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
