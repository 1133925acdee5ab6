"""Command line: ``hpcopt train|info`` (run under ``mpiexec -n N python -m hpcopt ...``)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import typing
from typing import Any, Sequence

from .config import SECTIONS, Config, build_config, option_index, read_toml
from .errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage on every rank."""

    def error(self, message: str) -> typing.NoReturn:
        raise UserError(message)


def _flag_help(section: str, default: Any) -> str:
    if isinstance(default, tuple):
        default = ",".join(str(v) for v in default) or "none"
    return f"[{section}] default: {default}"


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    for name, (section, f) in option_index().items():
        default = getattr(SECTIONS[section](), name)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, metavar="VALUE",
                            help=_flag_help(section, default))


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hpcopt", description="Distributed optimization over MPI: "
                     "run as mpiexec -n N python -m hpcopt train ...")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train a model (defaults: MLP on MNIST-5k with PR-SGD)")
    train.add_argument("--config", help="TOML file with [data], [model], [algorithm], [run] tables")
    _add_config_flags(train)
    sub.add_parser("info", help="versions, MPI library, world size, threads, GPU and HDF5 support")
    return parser


def _rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() else 0


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Config | None]:
    """Command-line arguments and, for ``train``, the resolved configuration."""
    args = make_parser().parse_args(argv)
    if args.command != "train":
        return args, None
    overrides = {k: v for k, v in vars(args).items() if k in option_index() and v is not None}
    file_values = read_toml(args.config) if args.config else None
    return args, build_config(file_values, overrides)


def run(argv: Sequence[str] | None = None) -> int:
    """Parse (agreed on by all ranks) and dispatch; ``main`` turns exceptions into exit codes."""
    from .comm import Comm, agreed

    comm = Comm()
    args, config = agreed(lambda: parse(argv), comm)
    if args.command == "info":
        from .info import print_info

        print_info(comm)
        return 0
    from .train import train

    train(config, comm)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: user errors exit 2 with one line from rank 0; crashes abort every rank."""
    try:
        return run(argv)
    except UserError as exc:
        if exc.everywhere or _world_size() == 1:
            if _rank() == 0:
                print(f"hpcopt: error: {exc}", file=sys.stderr, flush=True)
            return UserError.exit_code
        _abort(f"hpcopt: error on rank {_rank()}: {exc}\n", UserError.exit_code)
        return UserError.exit_code
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 - any crash must end every rank
        if isinstance(exc, SystemExit):
            raise
        rank = _rank()
        text = "".join(traceback.format_exception(exc))
        _abort("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()), 1)
        return 1


def _world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1


def _abort(text: str, code: int) -> None:
    """Write ``text`` to stderr and end the whole MPI job with exit status ``code``."""
    sys.stderr.write(text)
    sys.stderr.flush()
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)
