"""``hpc-graph train --config CFG.yaml [--set key=value ...] [--run-dir DIR]``: train a GNN.

Run it under the site's launcher for several ranks (``mpiexec -n 4 hpc-graph
train ...``). The config is loaded and checked on every rank before anything
else: a bad field ends the command with one line naming it and exit status 2.
Rank 0 prints the final summary line.
"""
from __future__ import annotations

import argparse

from hpc_graph.cli import CLIError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="train a GNN from a YAML config (single process or under mpiexec/srun)",
        description="Full-batch node-classification training. Writes RUN_DIR/metrics.rank<R>.jsonl "
                    "(every rank, one line per epoch) and RUN_DIR/summary.json (rank 0).")
    parser.add_argument("--config", required=True, metavar="CFG.yaml", help="training config (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field, e.g. --set model.hidden=64 (repeatable)")
    parser.add_argument("--run-dir", default=None, metavar="DIR",
                        help="where metrics and summary.json go (overrides train.run_dir)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hpc_graph.train.config import ConfigError, check_paths, load_config

    try:
        config = load_config(args.config, args.overrides)
        if args.run_dir is not None:
            if not args.run_dir.strip():
                raise ConfigError("--run-dir: must be a non-empty path")
            config.train.run_dir = args.run_dir
        check_paths(config)
        from hpc_graph.train.trainer import Trainer
        trainer = Trainer(config)
    except ConfigError as exc:
        raise CLIError(str(exc)) from None
    summary = trainer.fit()
    if trainer.rank == 0:
        best, test = summary["best_val_acc"], summary["test_acc"]
        med = summary["median_epoch_seconds"]
        print(f"best val acc {_pct(best)} (epoch {summary['best_epoch']}), test acc {_pct(test)}, "
              f"median epoch {med:.4f} s, {summary['engine']} on {summary['world_size']} rank(s), "
              f"summary {trainer.run_dir / 'summary.json'}")
    return 0


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"
