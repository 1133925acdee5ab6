"""Each pass of the wire's codec against the memory's ceiling: before and after, in one process.

    python benchmarks/speed/codec.py [--values 1863690] [--dtype float32] [--repeats 41]
                                     [--write docs/results/codec.md]

For a message of ``--values`` random normal values (the MLP 1024,1024's 1,863,690 by default:
docs/results/clusters.md), in interleaved repeats (a random order of the cases per repeat) it
times, per wire:

- ``encode``: Q of the message and the error feedback e <- m - D(Q(m)), what a round does before
  it sends: ``before`` the whole-vector casts (tests/reference.py ``whole_vector_encode``, what
  hpcopt ran until hpcopt/comm/codec.py), ``after`` ``Codec.encode_``;
- ``decode``: total += D(payload), what a round does for each rank's payload it receives:
  ``before`` ``whole_vector_decode``, ``after`` ``Codec.add_decoded_``;

and the ceiling: a NumPy copy of the message's float32 bytes (``np.copyto``: 4 n bytes read and
written). Per pass: the median wall milliseconds and the median CPU milliseconds of the thread
(what the pass cost the core, without the time it waited for one on a busy machine), and in CPU
time: after against before and after against the copy (paired per repeat, medians), the
message's float32 bytes per second (GB/s), and per wire whether an encode and a decode cost less
than the bytes they save take on a link of 1 and 10 Gbit/s. The load (``uptime``) is printed at the start
and the end. The before cases need ml-dtypes (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common.sections import replace_section  # noqa: E402
from hpcopt.comm.codec import WIRES, codec_for, message_bytes  # noqa: E402
from tests.reference import whole_vector_decode, whole_vector_encode  # noqa: E402

LINKS_GBITS = (1, 10)


def uptime() -> str:
    """The ``uptime`` line (its load averages), or the load averages where there is no uptime."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def cases(message: np.ndarray) -> dict[str, Callable[[], object]]:
    """The timed calls: "copy", and "<wire> <encode|decode> <before|after>"."""
    n = message.size
    error, total, copied = np.zeros_like(message), np.zeros(n, np.float32), np.empty(n, np.float32)
    out: dict[str, Callable[[], object]] = {"copy": lambda: np.copyto(copied, message, casting="unsafe")}
    for wire in WIRES:
        codec = codec_for(wire, n)
        payload = codec.encode_(message, error).copy()

        def before_encode(wire: str = wire) -> None:
            _, decoded = whole_vector_encode(message, wire)
            np.subtract(message, decoded, out=error)

        def before_decode(wire: str = wire, payload: np.ndarray = payload) -> None:
            total.__iadd__(whole_vector_decode(payload, wire, n))

        out[f"{wire} encode before"] = before_encode
        out[f"{wire} encode after"] = lambda codec=codec: codec.encode_(message, error)
        out[f"{wire} decode before"] = before_decode
        out[f"{wire} decode after"] = lambda codec=codec, payload=payload: codec.add_decoded_(payload, total)
    return out


def measure(message: np.ndarray, repeats: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per case, the wall and the thread's CPU seconds of each repeat (one untimed call first)."""
    calls = cases(message)
    for call in calls.values():
        call()
    wall = {name: np.empty(repeats) for name in calls}
    cpu = {name: np.empty(repeats) for name in calls}
    names = list(calls)
    for r in range(repeats):
        for name in np.random.default_rng(r).permutation(names):
            c0, t0 = time.thread_time(), time.perf_counter()
            calls[name]()
            wall[name][r], cpu[name][r] = time.perf_counter() - t0, time.thread_time() - c0
    return wall, cpu


def table(wall: dict[str, np.ndarray], cpu: dict[str, np.ndarray], n: int) -> list[str]:
    """Per pass: the thread's CPU milliseconds before and after, their ratio and after's against
    the copy (paired per repeat), after's GB/s of CPU time; the wall milliseconds."""
    ms = lambda t: f"{1e3 * float(np.median(t)):.2f}"  # noqa: E731
    ratio = lambda a, b: f"{float(np.median(a / b)):.2f}"  # noqa: E731
    gbps = lambda t: f"{4 * n / float(np.median(t)) / 1e9:.1f}"  # noqa: E731
    copy = cpu["copy"]
    lines = ["| wire | pass | before CPU ms | after CPU ms | after / before | after / copy | after GB/s "
             "| before wall ms | after wall ms |", "|---|---|---:|---:|---:|---:|---:|---:|---:|",
             f"| - | copy (the ceiling) | - | {ms(copy)} | - | 1.00 | {gbps(copy)} | - "
             f"| {ms(wall['copy'])} |"]
    for wire in WIRES:
        for step in ("encode", "decode"):
            before, after = f"{wire} {step} before", f"{wire} {step} after"
            lines.append(f"| {wire} | {step} | {ms(cpu[before])} | {ms(cpu[after])} "
                         f"| {ratio(cpu[after], cpu[before])} | {ratio(cpu[after], copy)} "
                         f"| {gbps(cpu[after])} | {ms(wall[before])} | {ms(wall[after])} |")
    return lines


def savings(cpu: dict[str, np.ndarray], n: int) -> list[str]:
    """Per compressing wire: an encode and a decode (CPU time, before and after) against the
    time the bytes they save take on the links."""
    lines = []
    for wire in WIRES[1:]:
        spent = {when: 1e3 * float(np.median(cpu[f"{wire} encode {when}"] + cpu[f"{wire} decode {when}"]))
                 for when in ("before", "after")}
        saved = 4 * n - message_bytes(wire, n)
        links = ", ".join(f"{saved * 8 / (g * 1e9) * 1e3:.1f} ms at {g} Gbit/s" for g in LINKS_GBITS)
        lines.append(f"- {wire}: an encode and a decode cost {spent['after']:.2f} CPU ms (before: "
                     f"{spent['before']:.2f}); the {saved / 1e6:.2f} MB they save take {links}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--values", type=int, default=1_863_690, help="values per message")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="the message's dtype (the run's); float64 is cast to float32 first")
    p.add_argument("--repeats", type=int, default=41, help="interleaved repeats per case")
    p.add_argument("--write", type=Path, help="also write the table into this results page's "
                   "'codec-DTYPE' section")
    args = p.parse_args(argv)
    start = uptime()
    message = np.random.default_rng(0).standard_normal(args.values).astype(args.dtype)
    wall, cpu = measure(message, args.repeats)
    end = uptime()
    text = "\n".join([
        f"`python benchmarks/speed/codec.py --values {args.values} --dtype {args.dtype} "
        f"--repeats {args.repeats}`: numpy {np.__version__}, {os.cpu_count()} cpu(s); median of "
        f"{args.repeats} interleaved repeats; ratios of CPU times, paired per repeat; GB/s: the "
        f"message's float32 bytes ({4 * args.values / 1e6:.2f} MB) per CPU second",
        "", f"- at the start: `{start}`", f"- at the end: `{end}`", "",
        *table(wall, cpu, args.values), "", *savings(cpu, args.values)])
    print(text)
    if args.write:
        replace_section(args.write, f"codec-{args.dtype}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
