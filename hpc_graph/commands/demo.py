"""``hpc-graph demo``: the whole pipeline on an embedded default, end to end.

Generates a contextual SBM graph, partitions it with METIS, checks the
partition directory, then trains on ``--ranks`` MPI ranks (``mpiexec``) with
the ``sar`` engine and prints the test accuracy. Every step is an ordinary
``hpc-graph`` command; the demo prints each one so it can be re-run by hand.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hpc_graph.cli import CLIError

_CONFIG = """\
# written by `hpc-graph demo`
data:
  path: {parts}
  feature_norm: none
engine:
  name: {engine}
model:
  name: {model}
  hidden: 64
  num_layers: 2
  dropout: 0.5
  heads: 4
optim:
  name: adam
  lr: 0.01
  weight_decay: 0.0005
train:
  epochs: {epochs}
  seed: 0
  device: cpu
  dtype: float32
  run_dir: {run_dir}
  progress: true
"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="generate, partition, check and train on a built-in graph (quick start)",
        description="End-to-end demo: CSBM graph -> METIS partitions -> check -> mpiexec training.")
    p.add_argument("--workdir", default="runs/demo", help="where the graph, partitions and run go")
    p.add_argument("--nodes", type=int, default=20000, help="nodes of the generated graph (default 20000)")
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks = partitions (default 2)")
    p.add_argument("--engine", default="sar", choices=["single", "dp", "sar"], help="training engine")
    p.add_argument("--model", default="gcn", choices=["gcn", "sage", "gat"], help="model")
    p.add_argument("--epochs", type=int, default=50, help="training epochs (default 50)")
    p.add_argument("--no-train", action="store_true", help="stop after generate/partition/check")
    p.add_argument("--force", action="store_true", help="replace an existing workdir's outputs")
    p.set_defaults(func=run)


def _step(title: str, argv: list[str]) -> None:
    from hpc_graph.cli import main

    print(f"== {title}: hpc-graph {shlex.join(argv)}", flush=True)
    t0 = time.perf_counter()
    status = main(argv)
    if status:
        raise CLIError(f"step '{title}' failed with status {status}")
    print(f"   done in {time.perf_counter() - t0:.1f} s", flush=True)


def run(args: argparse.Namespace) -> int:
    if args.nodes < 100:
        raise CLIError(f"--nodes: must be >= 100, got {args.nodes}")
    if args.ranks < 1:
        raise CLIError(f"--ranks: must be >= 1, got {args.ranks}")
    if args.epochs < 1:
        raise CLIError(f"--epochs: must be >= 1, got {args.epochs}")
    from hpc_graph.engines import engine_class

    cls = engine_class(args.engine)
    if cls.max_ranks is not None and args.ranks > cls.max_ranks:
        raise CLIError(f"--engine {args.engine} runs on at most {cls.max_ranks} rank(s): add --ranks {cls.max_ranks}")
    whole = cls.data_source == "file"  # the engine reads the dataset file itself: no partitioning
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    graph, parts, run_dir = work / "graph.h5", work / f"parts-{args.ranks}", work / "run"
    force = ["--force"] if args.force else []

    _step("generate", ["generate", "csbm", "-o", str(graph), "--num-nodes", str(args.nodes), *force])
    if not whole:
        _step("partition", ["partition", str(graph), "-o", str(parts), "--num-parts", str(args.ranks),
                            "--method", "metis", *force])
        _step("check", ["check", str(parts)])
    if args.no_train:
        return 0

    config = work / "demo.yaml"
    config.write_text(_CONFIG.format(parts=graph if whole else parts, engine=args.engine,
                                     model=args.model, epochs=args.epochs, run_dir=run_dir))
    cmd = [sys.executable, "-m", "hpc_graph.cli", "train", "--config", str(config)]
    if args.ranks > 1:
        mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
        if mpiexec is None:
            raise CLIError("mpiexec not found on PATH: install an MPI (e.g. pip install 'hpc_graph[mpich]')")
        cmd = [mpiexec, "-n", str(args.ranks), *cmd]
    print(f"== train: {shlex.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    status = subprocess.run(cmd).returncode  # every rank decides its own threads (hpc_graph.comm.threads)
    if status:
        raise CLIError(f"training failed with status {status} (see the messages above)")
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"   done in {time.perf_counter() - t0:.1f} s")
    print(f"test accuracy: {summary['test_acc']:.4f} (best validation {summary['best_val_acc']:.4f} "
          f"at epoch {summary['best_epoch']}; {args.engine} on {args.ranks} rank(s); run in {run_dir})")
    return 0
