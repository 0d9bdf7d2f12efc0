"""``hpc-graph train --config CFG.yaml [--set key=value ...] [--run-dir DIR] [--resume RUN_DIR]``: train a GNN.

Run it under the site's launcher for several ranks (``mpiexec -n 4 hpc-graph
train ...``). The config is loaded and checked on every rank before anything
else: a bad field ends the command with one line naming it and exit status 2.
Rank 0 prints the final summary line.

Before loading anything, every rank predicts the memory it will use (``hpc_graph.plan.predict``: its step run
on shapes, every engine that can be planned) and the job stops, on every rank, with one line when the ranks of
a host would need more than it has (``data_io.memory.available_bytes``), or when the estimate fails;
``--force`` starts it anyway.

Exit status: 0 done; 1 failed (a crash on any rank aborts the job with MPI_Abort); 2 bad config, data or
resume, a job that would not fit in memory, or a model the engine cannot run; 3 diverged (a non-finite loss
with ``train.on_nonfinite: stop``, a loss above ``train.diverge_factor`` times the first optimiser step's, or
``train.nonfinite_streak`` skipped steps in a row);
75 preempted by SIGTERM/SIGUSR1 (or a first Ctrl-C) after writing a checkpoint
(resume with ``--resume RUN_DIR``). See docs/configuration.md.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from hpc_graph.cli import CLIError, add_model_option, add_threads_option, model_overrides

log = logging.getLogger(__name__)

#: the CLI leaves the thread decision to this command: ``train.threads`` takes part in it
CONFIGURES_THREADS = True
#: a SIGTERM/SIGUSR1 the CLI held while the process started is this command's to act on (exit 75)
TAKES_STOP_SIGNALS = True


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="train a GNN from a YAML config (single process or under mpiexec/srun)",
        description="Full-batch node-classification training. Writes RUN_DIR/metrics.rank<R>.jsonl "
                    "(every rank, one line per epoch), RUN_DIR/metrics.jsonl and RUN_DIR/summary.json "
                    "(rank 0) and RUN_DIR/checkpoints/. Exit status 75: preempted (SIGTERM/SIGUSR1) "
                    "after a checkpoint; run again with --resume RUN_DIR.",
        epilog="Every config field is described in docs/configuration.md.")
    parser.add_argument("--config", default=None, metavar="CFG.yaml",
                        help="training config (see configs/); required unless --resume is given")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field, e.g. --set model.hidden=64 (repeatable)")
    parser.add_argument("--run-dir", default=None, metavar="DIR",
                        help="where metrics and summary.json go (overrides train.run_dir)")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its newest valid checkpoint; the config comes "
                             "from the checkpoint (a --config given too must match it)")
    parser.add_argument("--resume-if-possible", action="store_true",
                        help="with --run-dir: continue from the run directory's newest checkpoint when it has "
                             "one, else start afresh from --config (what the job scripts use, so that a job "
                             "killed before its first checkpoint starts again)")
    parser.add_argument("--force", action="store_true",
                        help="start even when the predicted peak memory exceeds what is available "
                             "(HPC_GRAPH_MEMORY_LIMIT, the cgroup limit or the free memory)")
    add_model_option(parser)
    add_threads_option(parser)
    parser.set_defaults(func=run)


#: a stop signal that arrived while MPI was not up yet on this rank of a multi-rank job: acted on once it is
_early_stop: list[int] = []


def _preempted_before_training(signum: int) -> None:
    """End the job with status 75 and one line: nothing to checkpoint yet (the job scripts resubmit, and
    ``--resume-if-possible`` starts afresh). ``MPI_Abort`` where MPI is up, so that no peer is left waiting in a
    collective. The other ranks give the first a moment to say it and end the job (a batch system signals every
    rank), and say it themselves when it did not (the signal reached only them)."""
    import signal
    import time

    from hpc_graph.cli import _error_line, _launch_rank
    from hpc_graph.comm.abort import ABORT_GRACE_S, mpi_ready
    from hpc_graph.train.signals import EXIT_PREEMPTED

    if _launch_rank() != 0:
        time.sleep(2 * ABORT_GRACE_S)
    _error_line(f"hpc-graph train: preempted by {signal.Signals(signum).name} before training started: no "
                f"checkpoint written (resubmit: --resume-if-possible starts afresh)")
    if mpi_ready():
        time.sleep(ABORT_GRACE_S)  # the launcher forwards the line before the abort ends the job
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(EXIT_PREEMPTED)
    os._exit(EXIT_PREEMPTED)


def _stop_before_training(signum: int, _frame: object) -> None:
    """A stop signal before the training loop. On one process, or once MPI is up, the job ends now. Before that,
    a peer may already wait inside ``MPI_Init`` for this rank, where no signal handler of its own can run: leaving
    would strand it there, so the stop is kept and acted on as soon as MPI is up (:func:`_act_on_early_stop`).

    It may run in the middle of any import (``import torch`` takes seconds): everything it and
    :func:`_preempted_before_training` use is imported before it is installed (:data:`_HANDLER_MODULES`), so
    that it never imports a module itself, which would meet the half-imported one."""
    from hpc_graph.comm.abort import mpi_ready
    from hpc_graph.comm.env import detect_rank_size

    try:
        size = detect_rank_size()[1]
    except ValueError:
        size = 1
    if size > 1 and not mpi_ready():
        if not _early_stop:
            _early_stop.append(signum)
        return
    _preempted_before_training(signum)


#: the modules the stop handlers use, imported before they are installed (:func:`_stop_before_training`)
_HANDLER_MODULES = ("hpc_graph.cli", "hpc_graph.comm.abort", "hpc_graph.comm.env", "hpc_graph.train.signals")


def _act_on_early_stop() -> None:
    """End the job now if a stop signal arrived before MPI was up (and MPI is up now)."""
    from hpc_graph.comm.abort import mpi_ready

    if _early_stop and mpi_ready():
        _preempted_before_training(_early_stop[0])


def run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from hpc_graph.train.signals import STOP_SIGNALS

    if threading.current_thread() is not threading.main_thread():  # no handlers outside the main thread
        return _train(args)
    from hpc_graph.cli import held_stop_signal

    for name in _HANDLER_MODULES:
        importlib.import_module(name)
    # until the training loop takes them over (it checkpoints first)
    previous = {s: signal.signal(s, _stop_before_training) for s in STOP_SIGNALS}
    log.debug("train: a stop signal before the first epoch ends the job with status 75")
    if held_stop_signal() is not None:  # it arrived while the process started
        _stop_before_training(held_stop_signal(), None)
    try:
        return _train(args)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _train(args: argparse.Namespace) -> int:
    from hpc_graph.train.config import ConfigError, config_from_dict, read_config, train_section

    try:
        if args.resume_if_possible:
            if args.resume is not None or not args.run_dir or args.config is None:
                raise ConfigError("--resume-if-possible: give it with --run-dir RUN_DIR and --config, without "
                                  "--resume (it starts afresh from the config when RUN_DIR has no checkpoint)")
        if args.resume is not None:
            if not args.resume.strip():
                raise ConfigError("--resume: must be a non-empty path")
            if args.run_dir is not None and os.path.abspath(args.run_dir) != os.path.abspath(args.resume):
                raise ConfigError(f"--run-dir {args.run_dir} and --resume {args.resume} name different "
                                  "directories (a resumed run continues in its own directory)")
            if args.config is not None:
                raw = read_config(args.config, model_overrides(args))
            else:
                from hpc_graph.train.checkpoint import checkpoint_config
                raw = checkpoint_config(args.resume, model_overrides(args), validate=False)
        else:
            if args.config is None:
                raise ConfigError("--config: required (or --resume RUN_DIR to continue a run)")
            raw = read_config(args.config, model_overrides(args))
            if args.run_dir is not None and not args.run_dir.strip():
                raise ConfigError("--run-dir: must be a non-empty path")
        tc = train_section(raw)  # the process-wide settings, before torch and the engines are imported
        if tc.malloc_mmap_threshold is not None:  # else the trainer applies the engine's policy
            from hpc_graph.comm.malloc import configure_malloc
            configure_malloc(tc.malloc_mmap_threshold)  # before torch's first large tensor
        from hpc_graph.comm.threads import configure_threads
        threads = tc.threads
        if args.threads is not None:
            from hpc_graph.comm.threads import parse_threads
            threads = parse_threads(args.threads, "--threads")
            configure_threads(threads, explicit_name="--threads", world=True)
        else:
            configure_threads(threads, explicit_name="train.threads", world=True)
        _act_on_early_stop()  # MPI is up now (the ranks of a node compared their CPU masks)
        # decided before torch and numba are imported: their pools start with the right size
        config = config_from_dict(raw)
        config.train.threads = threads
        if args.resume is not None:
            config.train.run_dir = args.resume
        elif args.run_dir is not None:
            config.train.run_dir = args.run_dir
        from numba_kernels import cpu_cache_state
        warm, cache_dir = cpu_cache_state()  # before anything compiles
        from hpc_graph.train.trainer import Trainer
        if args.resume_if_possible:
            trainer = Trainer(config, resume=args.run_dir, force_memory=args.force, resume_if_possible=True)
        else:
            trainer = Trainer(config, resume=args.resume, force_memory=args.force)
    except ConfigError as exc:
        err = CLIError(str(exc))
        err.collective = getattr(exc, "collective", False)  # every rank refused alike: printed once
        raise err from None
    _act_on_early_stop()  # (a launch whose thread decision did not need MPI: its communicator is up now)
    if warm is False and trainer.rank == 0:  # a first job would otherwise look stuck for minutes
        print(f"hpc-graph train: note: numba compiles the CPU kernels at their first use after an install "
              f"(a few minutes on every rank of this first job, before its first epochs); later runs load them "
              f"from {cache_dir}; `hpc-graph warmup` compiles them all at once, in parallel", file=sys.stderr)

    import signal

    from hpc_graph.train.signals import EXIT_PREEMPTED, STOP_SIGNALS, Preempted, StopSignal
    from hpc_graph.graph.base import UnsupportedOperation
    from hpc_graph.train.loops import EXIT_DIVERGED, DivergedError
    trainer.stop = StopSignal(STOP_SIGNALS + (signal.SIGINT,))  # Ctrl-C: checkpoint and exit 75 too
    try:
        summary = trainer.fit()
    except Preempted as exc:
        if trainer.rank == 0:
            print(f"hpc-graph train: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    except DivergedError as exc:  # a non-finite loss (on_nonfinite: stop), a blown-up loss, a streak of skips
        if trainer.rank == 0:
            print(f"hpc-graph train: error: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except UnsupportedOperation as exc:  # every rank runs the same model code: all stop here
        if trainer.rank == 0:
            print(f"hpc-graph train: error: engine.name: {trainer.engine_name!r} cannot run model "
                  f"{config.model.name!r}: {exc}", file=sys.stderr)
        return 2
    if trainer.rank == 0:
        best, test = summary["best_val_acc"], summary["test_acc"]
        med = summary["median_epoch_seconds"]
        med_text = "n/a" if med is None else f"{med:.4f} s"
        cs = summary.get("correct_smooth")
        cs_text = "" if cs is None else (
            f"after C&S: val acc {_pct(cs['after']['val_acc'])}, test acc {_pct(cs['after']['test_acc'])}, ")
        print(f"best val acc {_pct(best)} (epoch {summary['best_epoch']}), test acc {_pct(test)}, {cs_text}"
              f"median epoch {med_text}, {summary['engine']} on {summary['world_size']} rank(s), "
              f"summary {trainer.run_dir / 'summary.json'}")
    return 0


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"
