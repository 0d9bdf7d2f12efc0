"""Run under ``mpiexec -n 2``: train GCN and GAT on Cora with the ``sar`` engine, 2 seeds each.

Rank 0 converts ``cora.npz`` to a dataset file and partitions it into 2 parts
with METIS (in WORKDIR); every rank then runs the Trainer (standard Planetoid
settings, row-normalised features, 200 epochs, test accuracy at the best
validation epoch; 2 seeds each). Rank 0 prints one line ``CORA_SAR {json}`` with the
accuracies per model and seed.

Usage: cora_sar.py CORA_NPZ WORKDIR
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hpc_graph.comm import get_communicator

MODELS = {
    "gcn": ({"name": "gcn", "hidden": 16, "num_layers": 2, "dropout": 0.5},
            {"name": "adam", "lr": 0.01, "weight_decay": 5e-4}),
    "gat": ({"name": "gat", "hidden": 8, "heads": 8, "out_heads": 1, "num_layers": 2, "dropout": 0.6,
             "attn_dropout": 0.6},
            {"name": "adam", "lr": 0.005, "weight_decay": 5e-4}),
}
# two seeds each (the Trainer on sar follows single step by step, attention dropout included:
# tests/mpi/test_trainer.py, and single's GCN and GAT are checked on 3 seeds in tests/train/test_cora.py)
SEEDS = {"gcn": (0, 1), "gat": (0, 1)}


def main() -> int:
    npz, work = Path(sys.argv[1]), Path(sys.argv[2])
    comm = get_communicator("mpi")
    from hpc_graph.comm import install_abort_handler
    install_abort_handler(comm)
    from data_io.converters.npz import convert_npz
    from data_io.partitioner import partition_dataset
    from hpc_graph.train.config import config_from_dict
    from hpc_graph.train.trainer import Trainer

    pdir = work / "cora-metis-2"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        convert_npz(npz, work / "cora.h5")
        partition_dataset(work / "cora.h5", pdir, comm.size, "metis", seed=0)
    comm.barrier()
    results: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    for name, (model, optim) in MODELS.items():
        t0 = time.perf_counter()
        for seed in SEEDS[name]:
            config = config_from_dict({
                "data": {"path": str(pdir), "feature_norm": "row"},
                "engine": {"name": "sar", "prefetch": True},
                "model": model, "optim": optim,
                "train": {"epochs": 200, "seed": seed, "eval_every": 1, "progress": False,
                          "run_dir": str(work / f"run-{name}-{seed}")},
            })
            trainer = Trainer(config, comm)
            if trainer.engine_name != "sar":
                raise AssertionError(f"expected the sar engine, got {trainer.engine_name}")
            summary = trainer.fit()
            results.setdefault(name, []).append(float(summary["test_acc"]))
        seconds[name] = time.perf_counter() - t0
    if comm.rank == 0:
        print("CORA_SAR " + json.dumps({"test_acc": results, "seconds": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
