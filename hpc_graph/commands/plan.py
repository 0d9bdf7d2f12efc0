"""``hpc-graph plan --config CFG.yaml [--set key=value ...]``: what a job will cost, before it trains.

So far for engine ``apt``: every rank loads its partition, the engine runs its dry run and cost model
(``hpc_graph.plan``: a profile of this launch, ``engine.dry_run_batches`` sampled batches, each
strategy's bytes by operation, timed builds and kernels, a memory check) and rank 0 prints the
table of predicted epochs per strategy and the choice; nothing is trained. Run it under the same
launcher and rank count as the job (``mpiexec -n 4 hpc-graph plan --config configs/apt_sage.yaml``).
``--json FILE`` also writes the predictions (per strategy: seconds by term, bytes by operation, memory,
whether it fits) as JSON.

Exit status: 0 done; 2 bad config or data, or an engine the planner does not cover yet.
"""
from __future__ import annotations

import argparse
import json
import sys

from hpc_graph.cli import CLIError, add_threads_option

#: the CLI leaves the thread decision to this command (``train.threads`` takes part in it)
CONFIGURES_THREADS = True


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="predict a job's epoch time and memory per rank before training (engine apt so far)",
        description="Run the apt engine's dry run and cost model for a training config and print the "
                    "predicted epoch of each parallel strategy; nothing is trained (docs/apt.md).")
    parser.add_argument("--config", required=True, metavar="CFG.yaml", help="training config (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field (repeatable)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the predictions as JSON")
    add_threads_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hpc_graph.comm import get_communicator
    from hpc_graph.comm.threads import configure_threads, parse_threads
    from hpc_graph.train.config import ConfigError, load_config

    try:
        config = load_config(args.config, args.overrides)
        threads = parse_threads(args.threads, "--threads") if args.threads is not None else config.train.threads
        configure_threads(threads, explicit_name="--threads" if args.threads is not None else "train.threads",
                          world=True)
        if config.engine.name != "apt":
            raise ConfigError(f"engine.name: hpc-graph plan covers engine 'apt' so far, not "
                              f"{config.engine.name!r}")
        import torch

        from hpc_graph.engines import create_engine
        from hpc_graph.train.trainer import _DTYPES, engine_options_from_config

        import logging

        logging.getLogger("hpc_graph.plan.dry_run").setLevel(logging.WARNING)  # the table is printed below
        comm = get_communicator(config.train.comm_backend)
        options = engine_options_from_config(config, "apt")
        options["strategy"] = "auto"
        engine = create_engine("apt", config.data.path, comm, torch.device("cpu"), _DTYPES[config.train.dtype],
                               options)
    except (ConfigError, ValueError, OSError) as exc:
        raise CLIError(str(exc)) from exc
    plan = engine.plan
    if comm.rank == 0:
        print(plan.table())
        print(f"choice: {plan.choice} (predicted epoch {plan.predicted(plan.choice):.3f} s on {comm.size} rank(s))")
        if args.json:
            out = {"ranks": int(comm.size), "choice": plan.choice, "iterations": plan.iterations,
                   "dry_run_seconds": plan.dry_seconds, "profile": plan.profile.as_dict(),
                   "strategies": {s: {"epoch_seconds": c.total, "seconds": c.seconds, "bytes": c.bytes,
                                      "memory_mb": c.memory_mb, "fits": c.fits, "reason": c.reason}
                                  for s, c in plan.costs.items()}}
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(out, fh, indent=1, default=float)
        sys.stdout.flush()
    return 0
