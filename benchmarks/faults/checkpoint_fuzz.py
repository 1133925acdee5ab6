"""Random byte edits of a real checkpoint: how many are refused, load unchanged, or load with
different values (silently). The probe of docs/results/reliability.md::

    python benchmarks/faults/checkpoint_fuzz.py [--edits 1200] [--seed 0] [--no-digest | --vet]

The checkpoint is the one the property tests use (tests/checkpoints.py): PR-SGD on
1 rank, MLP 64-12-10 on digits, momentum 0.9, I = 4, taken at tick 6 (mid-round: every kind
of per-rank dataset). Each edit sets 1 to 4 bytes at uniformly random offsets to random values,
then ``read_checkpoint`` loads the copy in a forked child process. Outcomes: ``refused`` (one
HpcoptError line naming the file), ``unchanged`` (loads, every field equal to the original's),
``silent`` (loads, some field differs: the damage went undetected), ``other`` (any other
exception: a reader bug), ``crash`` (the child died of a signal: a crash inside HDF5).
``--no-digest`` writes and reads without the content digest (as before it existed), for the
baseline on the same machine. ``--vet`` reads the way a resumed job does: first
``vet_checkpoint`` (a child process reads the whole file and checks the digest), then
``read_checkpoint`` without hashing again.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt.errors import HpcoptError  # noqa: E402
from hpcopt.io.data_parallel_checkpoint import Checkpoint, read_checkpoint  # noqa: E402
from hpcopt.run.vetting import vet_checkpoint  # noqa: E402
from tests.checkpoints import differences, small_checkpoint  # noqa: E402

OUTCOMES = ("refused", "unchanged", "silent", "other", "crash")


def outcome(path: Path, reference: Checkpoint, vet: bool) -> tuple[str, str]:
    """(outcome, detail) of loading ``path`` (after vetting it in a child process, with ``vet``)."""
    try:
        if vet:
            vet_checkpoint(path)
        loaded = read_checkpoint(path, verify=not vet)
    except HpcoptError as exc:
        return ("refused", "") if str(path) in str(exc) and "\n" not in str(exc) else ("other", str(exc))
    except Exception as exc:  # noqa: BLE001 - counted: any other exception is a reader bug
        return "other", f"{type(exc).__name__}: {exc}"
    diff = differences(reference, loaded)
    return ("silent", ", ".join(diff)) if diff else ("unchanged", "")


def in_child(path: Path, reference: Checkpoint, vet: bool) -> tuple[str, str]:
    """``outcome`` in a forked process: a crash (a signal) is an outcome, not the end of the probe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        name, detail = outcome(path, reference, vet)
        os.write(write_end, f"{name}\t{detail}".encode()[:4000])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "crash", signal.Signals(os.WTERMSIG(status)).name
    name, _, detail = message.partition("\t")
    return name, detail


def probe(original: Path, edits: int, seed: int, vet: bool) -> tuple[Counter, list[str]]:
    data, reference = original.read_bytes(), read_checkpoint(original)
    rng, outcomes, notes = random.Random(seed), Counter(), []
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / original.name
        for _ in range(edits):
            edited = bytearray(data)
            changes = [(rng.randrange(len(data)), rng.randrange(256)) for _ in range(rng.randint(1, 4))]
            for offset, value in changes:
                edited[offset] = value
            path.write_bytes(bytes(edited))
            name, detail = in_child(path, reference, vet)
            outcomes[name] += 1
            if name not in ("refused", "unchanged"):
                notes.append(f"{name} {changes}: {detail}")
    return outcomes, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    readers = parser.add_mutually_exclusive_group()
    readers.add_argument("--no-digest", action="store_true", help="the baseline: no content digest")
    readers.add_argument("--vet", action="store_true", help="vet in a child first, as a resume does")
    args = parser.parse_args()
    np.seterr(all="ignore")
    if args.no_digest:
        from checkpoint_digest_cost import without_digest

        without_digest()
    with tempfile.TemporaryDirectory() as directory:
        original = small_checkpoint(Path(directory) / "run")
        outcomes, notes = probe(original, args.edits, args.seed, args.vet)
        size = original.stat().st_size
    reader = "vetted in a child, then read" if args.vet else "read"
    print(f"checkpoint: {size / 1e3:.1f} kB, {'without' if args.no_digest else 'with'} the content "
          f"digest, {reader}; {args.edits} edits of 1-4 random bytes (seed {args.seed})")
    for name in OUTCOMES:
        print(f"{name:<10} {outcomes[name]:>6}")
    for line in notes:
        print(f"  {line}")


if __name__ == "__main__":
    main()
