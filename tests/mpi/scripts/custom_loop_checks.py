"""Run under ``mpiexec -n N``: the training loop of examples/custom_loop.py gives hpc_graph's Trainer's numbers bit
for bit on ``dp`` and ``sar`` (Cora, float64, dropout on): every step's global loss and every parameter, against
``Trainer(config, model=TwoLayerGCN)`` with the same settings. Rank 0 prints ``custom_loop_checks: N ranks OK``.

Usage: custom_loop_checks.py WORKDIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import hpc_graph as hg

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "examples"))
import custom_loop  # noqa: E402

EPOCHS = 8


def main() -> int:
    work = Path(sys.argv[1])
    comm = hg.init()
    data, parts = work / "cora.h5", work / f"cora-{comm.size}"
    if comm.rank == 0:
        from data_io.converters.npz import convert_npz
        work.mkdir(parents=True, exist_ok=True)
        convert_npz(REPO / "tests" / "data" / "cora.npz", data)
        hg.partition_dataset(data, parts, comm.size, "metis", seed=0)
    comm.barrier()
    for engine in ("dp", "sar"):
        config = hg.load_config(REPO / "configs" / "single_gcn.yaml", [
            f"data.path={parts}", f"engine.name={engine}", "data.feature_norm=none", "data.feature_layout=dense",
            "train.dtype=float64", f"train.epochs={EPOCHS}", "train.seed=0", "train.progress=false",
            f"train.run_dir={work / engine}", "model.hidden=16", "model.dropout=0.5", "optim.lr=0.01",
            "optim.weight_decay=0.0005", "optim.schedule=none"])
        trainer = hg.Trainer(config, comm, model=custom_loop.TwoLayerGCN)
        want = [trainer.step() for _ in range(EPOCHS)]
        got = custom_loop.train(str(parts), engine, EPOCHS, seed=0)
        if got != want:
            raise AssertionError(f"rank {comm.rank} {engine}: the loop's losses {got} != the Trainer's {want}")
    comm.barrier()
    if comm.rank == 0:
        print(f"custom_loop_checks: {comm.size} ranks OK", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
