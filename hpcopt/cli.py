"""Command line: ``hpcopt train|resume|report|info|bench`` (under ``mpiexec -n N python -m hpcopt ...``)
and ``hpcopt sweep|collect|export`` (studies of many runs, without ``mpiexec``)."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
import traceback
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .algorithms.base import MergedOption
from .algorithms.registration import registry
from .comm import ulfm
from .config import (
    MODEL_DEFAULTS,
    Config,
    algorithm_options,
    build_config,
    check_resume,
    option_index,
    read_toml,
    require_named_model,
    sections,
)
from .errors import EXIT_CONTINUED, EXIT_NOT_CONTINUED, HpcoptError, abort_job, did_you_mean
from .run.mpi_start import LINGER_SECONDS


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage on every rank, and that names the option
    closest to a mistyped one (argparse before Python 3.12 names none)."""

    def error(self, message: str) -> typing.NoReturn:
        raise HpcoptError(message)

    def parse_known_args(self, args: typing.Any = None, namespace: typing.Any = None) -> typing.Any:
        """argparse's, but an unknown option is an error here, in the (sub)command that knows
        which options it has: "unrecognized arguments: --intervl 4; did you mean --interval?"."""
        parsed, extras = super().parse_known_args(args, namespace)
        unknown = [word for word in extras if word.startswith("--")]
        if unknown:
            options = [name for name in self._option_string_actions if name.startswith("--")]
            hint = did_you_mean(unknown[0].partition("=")[0], options)
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed, extras


#: Defaults of the command line that differ from the config's (the Python API writes no files
#: unless asked; a command-line run gets a new run directory).
CLI_DEFAULTS = {"out": "runs/{time}"}
#: ``resume --help``: where a resumed run writes and what it imports (docs/formats.md).
RESUME_RULES = (
    "Continue a run from a checkpoint, on as many ranks as wrote it (a data-parallel one on another "
    "number with --ranks-changed). Flags may change only where "
    "files go, how often, what is printed, evaluation, and the number of steps. The run continues "
    "in the directory that holds the checkpoint's checkpoints/ folder, or in --out DIR (needed for "
    "a checkpoint anywhere else; the out stored in a checkpoint is never used). A run directory "
    "holds one run (a checkpoint of another run is refused) and one job at a time (rank 0 holds "
    "OUT/hpcopt.lock; a lock left by a killed job is taken over). A torch model is imported only "
    "when named again: --model torch:MODULE:FUNCTION, the checkpoint's.")
#: Commands over many runs (hpcopt.study), run without MPI: name -> (module, help).
STUDY_COMMANDS = {
    "sweep": ("hpcopt.study.sweep", "write a study: one Slurm or PBS job array per rank count and a "
              "manifest of its tasks, from a sweep file (--dry-run lists them; --local -j K runs them here)"),
    "collect": ("hpcopt.study.collect", "one row per run of a study (state, options that differ, final "
                "figures): study.csv and study.md"),
    "export": ("hpcopt.study.export", "a run's trace as CSV tables or TensorBoard event files, its "
               "timeline as Trace Event Format JSON (Perfetto)"),
}


def _shown(default: Any) -> str:
    if isinstance(default, tuple):
        return ",".join(str(v) for v in default) or "none"
    return '""' if default == "" else str(default)


def _algorithm_flag_where(o: MergedOption) -> str:
    """Where an ``[algorithm]`` option applies and its defaults: "algorithm: celgc, naive_clip;
    default: inf", or "algorithm; default: 0.1; 0.001 for pprs, ..." when the algorithms' own
    defaults differ."""
    by_value: dict[str, list[str]] = {}
    for name, default in o.defaults.items():
        by_value.setdefault(_shown(default), []).append(name)
    (first, _), *others = by_value.items()
    applies = "" if len(o.users) == len(registry()) else f": {', '.join(o.users)}"
    return (f"algorithm{applies}; default: {first}"
            + "".join(f"; {value} for {', '.join(names)}" for value, names in others))


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    merged = algorithm_options()
    for name, (section, f) in option_index().items():
        if section == "algorithm" and name in merged:
            where = _algorithm_flag_where(merged[name])
        else:
            default = CLI_DEFAULTS.get(name, getattr(sections()[section](), name))
            where = f"{section}; default: {_shown(default)}" + "".join(
                f"; {_shown(value)} for {model}" for model, value in MODEL_DEFAULTS.get(name, {}).items())
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, metavar="VALUE",
                            help=f"{f.metadata.get('help', '')} [{where}]".replace("%", "%%"))


def _add_debug_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug-fail-at", metavar="RANK:STEP[:KIND]",
                        help="debug option for fault-injection tests: fail rank RANK in its step "
                        "STEP; KIND raise (default), kill, sigterm, sigint, hang, nan, checkpoint, "
                        "checkpoint-sigterm or checkpoint-sigint (hpcopt.run.faults)")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hpcopt", description="Distributed optimization over MPI: "
                     "run as mpiexec -n N python -m hpcopt train ...")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train a model (defaults: MLP on MNIST-5k with PR-SGD)")
    train.add_argument("--config", help="TOML file with [data], [model], [algorithm], [run] tables")
    train.add_argument("--resume", metavar="CKPT",
                       help="continue from a checkpoint file or run directory (see 'resume')")
    _add_config_flags(train)
    _add_debug_flags(train)
    resume = sub.add_parser("resume", help="continue a run from a checkpoint, on as many ranks "
                            "as wrote it (on another number: --ranks-changed); flags may change "
                            "only where files go, how often, what is printed, evaluation, and the "
                            "number of steps",
                            description=RESUME_RULES)
    resume.add_argument("checkpoint", metavar="CKPT",
                        help="a checkpoint file, or a run directory (its newest checkpoint)")
    resume.add_argument("--config", help="TOML file (same rules as flags)")
    resume.add_argument("--ranks-changed", action="store_true",
                        help="carry a data-parallel checkpoint over to this job's number of ranks: "
                             "the averaged model exactly, per-rank state by each field's policy, "
                             "the data partitioned anew; a streaming run's only with no fragment "
                             "reduction in flight at the checkpoint; the old count's checkpoints "
                             "after CKPT in the run directory are replaced and pruned as this run "
                             "writes its own: rank 0 names them (docs/failures.md)")
    _add_config_flags(resume)
    _add_debug_flags(resume)
    report = sub.add_parser("report", help="plots and a table comparing run traces "
                            "(needs matplotlib: pip install 'hpcopt[plot]')")
    report.add_argument("runs", nargs="+", metavar="RUN",
                        help="trace files (trace.h5), run directories or study directories (hpcopt sweep)")
    report.add_argument("--out", default="report", help="output directory (default: report)")
    sub.add_parser("info", help="versions, MPI library, world size, threads, GPU and HDF5 support")
    bench = sub.add_parser("bench", help="benchmarks: allreduce and p2p (under mpiexec), scaling "
                           "(launches mpiexec itself); 'bench KIND --help' for each one's options")
    bench.add_argument("kind", choices=("allreduce", "p2p", "scaling"))
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    for name, (module, text) in STUDY_COMMANDS.items():
        importlib.import_module(module).add_arguments(sub.add_parser(name, help=text))
    return parser


def _rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() else 0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line arguments; for ``train`` and ``resume`` also the fault plan and
    ``args.resume`` (the checkpoint to resume from, or None). Reads no file."""
    args = make_parser().parse_args(argv)
    if args.command not in ("train", "resume"):
        return args
    from .run.faults import FaultPlan

    args.faults = FaultPlan.parse(args.debug_fail_at) if args.debug_fail_at else None
    if args.command == "resume":
        args.resume = args.checkpoint
    return args


def run_config(args: argparse.Namespace) -> Config | None:
    """For ``train`` and ``resume``, the resolved configuration (else None).

    Resuming starts from the checkpoint's config; options given in a file or as flags replace
    its values where they are safe to change (``check_resume``). A torch model is imported only
    when the user names it again (``require_named_model``), and the stored ``out`` is never
    used: the run directory is ``--out`` or the one holding the checkpoint's ``checkpoints/``
    (hpcopt.run.directory). Both are refused here, before anything is imported or opened for
    writing. ``args.resume`` is then the checkpoint file.
    """
    if args.command not in ("train", "resume"):
        return None
    overrides = {k: v for k, v in vars(args).items() if k in option_index() and v is not None}
    file_values = read_toml(args.config) if args.config else None
    if not args.resume:
        run_table = (file_values or {}).get("run")
        in_file = set(run_table) if isinstance(run_table, dict) else set()
        defaults = {k: v for k, v in CLI_DEFAULTS.items() if k not in in_file}
        _check_data_path(overrides.get("path", (file_values or {}).get("data", {}).get("path")))
        return build_config(file_values, {**defaults, **overrides})
    from .io.pipeline_checkpoint import stored_config  # a data-parallel or a pipeline checkpoint

    build_config(file_values)  # reject unknown keys in the file
    given: dict[str, Any] = {"out": ""}
    for table in (file_values or {}).values():
        given.update(table)
    given.update(overrides)
    args.resume, stored = stored_config(args.resume)
    require_named_model(stored, "model" in given)
    config = build_config(stored.to_dict(), given)
    check_resume(stored, config)
    return config


def _refuse_singletons(world_size: int) -> None:
    """HpcoptError (on every process: each is a world of its own) when the launcher started
    several processes that did not join one MPI world: each would train alone, into the same run
    directory (hpcopt.comm.launcher)."""
    from .comm.launcher import singleton_problem
    from .comm.mpi_support import mpi_library

    problem = singleton_problem(world_size, mpi_library())
    if problem:
        raise HpcoptError(problem)


def _check_data_path(path: Any) -> None:
    """A ``path`` that names no directory is refused first: the data set cannot be read whatever
    the other options say, so it is the error to see."""
    if isinstance(path, str) and path and not Path(path).is_dir():
        raise HpcoptError(f"--path {path}: no such directory (the data set's files are read from it)")


def _given_out(args: argparse.Namespace) -> str:
    """The run directory a user gave a resumed run (``--out``, or ``[run] out`` in their own
    ``--config``); "" for none."""
    if args.out is not None:
        return str(args.out)
    table = (read_toml(args.config) if args.config else {}).get("run")
    out = table.get("out", "") if isinstance(table, dict) else ""
    return out if isinstance(out, str) else ""


def run(argv: Sequence[str] | None = None) -> int:
    """Parse (agreed on by all ranks) and dispatch; ``main`` turns exceptions into exit codes."""
    from mpi4py import MPI

    from .comm import Comm, agreed

    fault_tolerant = not ulfm.unavailable()  # --with-ft ulfm: a loss in set-up ends the job, exit 6
    ulfm.watch(MPI.COMM_WORLD if fault_tolerant else None)
    comm = Comm()
    ulfm.watch(comm.mpi if fault_tolerant else None)
    args = agreed(lambda: parse(argv), comm)
    if args.command in ("train", "resume"):  # before anything is read or written
        _refuse_singletons(comm.size)
    if getattr(args, "resume", None):  # before any rank opens it: a child reads it whole first,
        # unless another job holds the run directory
        from .run.directory import vet_resumed

        agreed(lambda: vet_resumed(args.resume, _given_out(args)) if comm.rank == 0 else None, comm)
    config = agreed(lambda: run_config(args), comm)
    if config is None or config.run.on_rank_loss != "continue":
        ulfm.watch(None)  # a lost rank ends the job by MPI_Abort, as under any MPI
    if args.command == "info":
        from .info import print_info

        print_info(comm)
        return 0
    if args.command == "bench":
        from .bench import run_bench

        comm.free()  # the benchmarks make their own communicators
        return run_bench(args.kind, args.options)
    if args.command in STUDY_COMMANDS:
        rank = comm.rank
        comm.free()  # no MPI: these commands start their own processes (sweep --local)
        return importlib.import_module(STUDY_COMMANDS[args.command][0]).run(args) if rank == 0 else 0
    if args.command == "report":
        from .report import write_report

        written = agreed(lambda: write_report(args.runs, args.out) if comm.rank == 0 else [], comm)
        for path in written:
            print(f"wrote {path}", flush=True)
        return 0
    from .run import train
    from .run.signals import exit_code

    summary, _ = train(config, comm, resume=args.resume, faults=args.faults,
                       ranks_changed=getattr(args, "ranks_changed", False))
    # stopped (143 for SIGTERM, 130 for SIGINT): the run is not finished, so job chains must not
    # take it for done; finished on the survivors of a lost rank: 5 (mpirun itself exits 0)
    if summary.stopped:
        return exit_code(signal.Signals[summary.stop_signal])
    return EXIT_CONTINUED if getattr(summary, "rank_losses", None) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: user errors exit 2 with one line from rank 0; crashes abort every rank;
    SIGTERM and SIGINT stop the run at a checkpoint or end the job (``hpcopt.run.signals``)."""
    from .run.signals import JobSignals

    with JobSignals() as signals:
        try:
            return _without_finalize(signals.exit_code(run(argv)))
        except HpcoptError as exc:
            if exc.everywhere or _world_size() == 1:
                reports = exc.reports if exc.reports is not None else _rank() == 0
                if reports:
                    print(f"hpcopt: error: {exc}", file=sys.stderr, flush=True)
                return _without_finalize(exc.exit_code, reports)
            abort_job(f"hpcopt: error on rank {_rank()}: {exc}\n", exc.exit_code)
            return exc.exit_code
        except BaseException as exc:  # noqa: BLE001 - any crash must end every rank
            if isinstance(exc, SystemExit):
                raise
            if ulfm.watched() is not None and ulfm.is_rank_loss(exc):  # outside the loop that
                end = ulfm.ended(exc)  # survives it (--on-rank-loss continue): one line, exit 6
                if end.reports:
                    print(f"hpcopt: error: {end.line}", file=sys.stderr, flush=True)
                return _without_finalize(EXIT_NOT_CONTINUED, end.reports)
            rank = _rank()
            failed = _mpi_failure(exc)
            if failed:
                abort_job(f"hpcopt: MPI failed on rank {rank}: {failed}; ending the job\n", 1)
                return 1
            text = "".join(traceback.format_exception(exc))
            abort_job("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()), 1)
            return 1


def _without_finalize(code: int, reports: bool = True) -> int:
    """``code``, or this process ended with it at once, without MPI_Finalize, where a rank was
    or may yet be lost (exit 5, 6, or any run under ``--on-rank-loss continue``): MPI_Finalize
    waits for every rank, a minute or more for a lost one, for ever for a stopped one
    (docs/failures.md). A survivor that did not print the line of exit 6 (``reports``) exits
    ``LINGER_SECONDS`` later: ``mpirun`` may drop the line of a rank still writing it when
    another has exited non-zero."""
    if code in (EXIT_CONTINUED, EXIT_NOT_CONTINUED) or ulfm.watched() is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        if code == EXIT_NOT_CONTINUED and not reports:
            time.sleep(LINGER_SECONDS)
        os._exit(code)
    return code


def _mpi_failure(exc: BaseException) -> str:
    """For an error MPI returned (mpi4py's MPI.Exception), what failed where, in one line: most
    often another rank died (``kill -9``, its node lost) and this rank's next call found it gone
    before the launcher ended this rank too, and MPI's error stack would print dozens of lines.
    "" for any other exception."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not isinstance(exc, mpi.Exception):
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" in {frames[-1].name} at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return f"{first} (error class {exc.Get_error_class()}){where}; another rank has most likely died"


def _world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1
