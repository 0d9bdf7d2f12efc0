"""``hpc-graph`` command-line entry point.

Each sub-command lives in its own module under :mod:`hpc_graph.commands` and
exposes ``add_parser(subparsers)`` and ``run(args) -> int``. This module only
wires them together, sets up logging and turns expected errors into a one-line
message and a non-zero exit status. Only the CLI prints; library code logs.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import NoReturn

# sub-command name -> module under hpc_graph.commands
COMMANDS = {
    "generate": "generate",
    "convert": "convert",
    "partition": "partition",
    "preprocess": "preprocess",
    "info": "inspect",
    "check": "inspect",
    "train": "train",
    "plan": "plan",
    "bench": "bench",
    "report": "report",
    "demo": "demo",
    "warmup": "warmup",
}


class CLIError(Exception):
    """An expected user-facing error: printed as one line, exit status 2."""


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: CPU threads per rank (see :mod:`hpc_graph.comm.threads`)."""
    parser.add_argument("--threads", type=str, default=None, metavar="N",
                        help="CPU threads per rank for numba, torch and BLAS (default: NUMBA_NUM_THREADS, "
                             "else OMP_NUM_THREADS, else this rank's share of the CPUs in its affinity mask)")

def add_model_option(parser: argparse.ArgumentParser) -> None:
    """``--model PACKAGE.MODULE:FACTORY``: a model of one's own (``model.name``), importable from the current
    directory or ``PYTHONPATH``."""
    parser.add_argument("--model", default=None, metavar="PACKAGE.MODULE:FACTORY",
                        help="a model of your own instead of model.name's: FACTORY(in_dim, out_dim, model_section) "
                             "returns a torch.nn.Module whose forward(graph, x) aggregates through graph "
                             "(importable from the current directory or PYTHONPATH; docs/extending.md)")


def model_overrides(args: argparse.Namespace) -> list[str]:
    """``args.overrides`` with ``--model`` as ``model.name`` (the current directory importable for it)."""
    if not getattr(args, "model", None):
        return list(args.overrides)
    import os
    import sys
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return [*args.overrides, f"model.name={args.model}"]


class _Version(argparse.Action):
    """``--version``: asks git for the commit only when given (not on every start of every rank)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from hpc_graph.version import version_string

        sys.stdout.write(version_string() + "\n")
        parser.exit()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpc-graph",
        description="MPI-native training of graph neural networks on large graphs.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version (and the git commit when run from a clone) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    seen = set()
    for name, module in COMMANDS.items():
        if module in seen:
            continue
        try:
            mod = importlib.import_module(f"hpc_graph.commands.{module}")
        except ModuleNotFoundError as exc:  # command not built yet in this checkout
            if exc.name != f"hpc_graph.commands.{module}":
                raise
            continue
        seen.add(module)
        mod.add_parser(sub)
    return parser


def _configure_threads(args: argparse.Namespace) -> None:
    """Decide and apply the threads of this rank before the command imports numba or torch.

    Commands whose module sets ``CONFIGURES_THREADS = True`` (``train``: the config's
    ``train.threads`` takes part) do it themselves.
    """
    module = importlib.import_module(f"hpc_graph.commands.{COMMANDS[args.command]}")
    if getattr(module, "CONFIGURES_THREADS", False):
        return
    from hpc_graph.comm.threads import configure_threads

    configure_threads(getattr(args, "threads", None), explicit_name="--threads", world=True)


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose >= 2 else logging.INFO)
    rank = ""
    try:  # prefix the rank when running under a launcher, without importing MPI
        from hpc_graph.comm.env import detect_rank_size  # noqa: WPS433
        r, n = detect_rank_size()
        if n > 1:
            rank = f"[rank {r}] "
    except Exception:  # comm layer absent or env unreadable: no prefix
        pass
    logging.basicConfig(level=level, format=f"{rank}%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


#: SIGTERM/SIGUSR1 that arrived while the command was starting (:func:`run` holds them from its first line)
_held_stops: list[int] = []


def _hold_stop_signals() -> None:
    """From the first line of the console script, a batch system's SIGTERM or SIGUSR1 is kept instead of killing
    the process: ``train`` acts on it with its own contract (exit 75) once it installs its handlers
    (:func:`held_stop_signal`), every other command is ended by it as before (:func:`_release_stop_signals`)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, _hold)


def _hold(signum: int, _frame) -> None:
    _held_stops.append(signum)


def held_stop_signal() -> int | None:
    """The first stop signal held since the process started, or None (see :func:`_hold_stop_signals`)."""
    return _held_stops[0] if _held_stops else None


def _release_stop_signals(module) -> None:
    """Give a command that does not take the held stop signals (``TAKES_STOP_SIGNALS``) the default ones back,
    and end the process by a signal that arrived meanwhile, as it would have ended without holding it."""
    import os
    import signal

    if getattr(module, "TAKES_STOP_SIGNALS", False) or signal.getsignal(signal.SIGTERM) is not _hold:
        return
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_DFL)
    if _held_stops:
        os.kill(os.getpid(), _held_stops[0])


def main(argv: list[str] | None = None) -> int:
    from hpc_graph.comm.env import prepare_process

    prepare_process()  # huge pages for torch's tensors, Open MPI's library under its launcher: before either loads
    parser = _build_parser()
    args = parser.parse_args(argv)
    _release_stop_signals(importlib.import_module(f"hpc_graph.commands.{COMMANDS[args.command]}"))
    _setup_logging(args.verbose, args.quiet)
    from data_io.errors import DataError, is_disk_full  # local import keeps `--help` fast
    from hpc_graph.comm.threads import ThreadSettingError

    try:
        _configure_threads(args)
        return int(args.func(args) or 0)
    except (CLIError, DataError, ThreadSettingError) as exc:
        if not getattr(exc, "collective", False) or _launch_rank() == 0:  # a collective error: printed once
            _error_line(f"hpc-graph {args.command}: error: {exc}")
        return 2
    except OSError as exc:  # a full disk is the user's to fix, like a bad input (exit 2); others are crashes
        if not is_disk_full(exc):
            raise
        _error_line(f"hpc-graph {args.command}: error: {exc.filename or 'a write'}: write failed: disk full")
        return 2
    except KeyboardInterrupt:
        _error_line(f"hpc-graph {args.command}: interrupted")
        return 130


def run() -> NoReturn:
    """The ``hpc-graph`` console script: :func:`main`, then a process exit that skips the interpreter's
    teardown (:func:`hpc_graph.comm.abort.end_process`, about a second per rank with torch loaded). A stop
    signal from the first line on is held for the command (:func:`_hold_stop_signals`)."""
    _hold_stop_signals()
    status = main()
    from hpc_graph.comm.abort import end_process

    end_process(status)


def _launch_rank() -> int:
    from hpc_graph.comm.env import detect_rank_size

    try:
        return detect_rank_size()[0]
    except ValueError:
        return 0


def _error_line(text: str) -> None:
    """One ``write`` per line: under mpiexec every rank's stderr shares one stream, and print()'s
    separate write of the newline let two ranks' lines run together."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    # Re-enter through the package module so that `python -m hpc_graph.cli` and the
    # console script share one CLIError class (commands import it from hpc_graph.cli).
    from hpc_graph.cli import run as _run

    _run()
