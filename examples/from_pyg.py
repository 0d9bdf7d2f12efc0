"""From a PyTorch Geometric ``Data`` to distributed training: the graph into hpc_graph's dataset file, partitioned
for 2 ranks, trained with ``dp``, and the trained model's outputs back as a tensor.

    python examples/from_pyg.py --out data/pyg-example            # writes the files once (one process)
    mpiexec -n 2 python examples/from_pyg.py --out data/pyg-example --train

Here the ``Data`` is Cora from the NumPy archive that ships with the repository (``tests/data/cora.npz``); any
homogeneous ``Data`` with ``edge_index``, ``x``, ``y`` and the three masks goes the same way
(``torch_geometric.datasets.Planetoid(...)[0]``, for instance).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import hpc_graph as hg

REPO = Path(__file__).resolve().parents[1]


def cora_as_pyg():
    from torch_geometric.data import Data

    a = np.load(REPO / "tests" / "data" / "cora.npz")
    return Data(edge_index=torch.from_numpy(a["edge_index"]), x=torch.from_numpy(a["x"]),
                y=torch.from_numpy(a["y"]), train_mask=torch.from_numpy(a["train_mask"]),
                val_mask=torch.from_numpy(a["val_mask"]), test_mask=torch.from_numpy(a["test_mask"]))


def write(out: Path, parts: int) -> None:
    """``out/graph.h5`` from the ``Data``, and its METIS partition ``out/parts`` for ``parts`` ranks."""
    out.mkdir(parents=True, exist_ok=True)
    hg.write_dataset(out / "graph.h5", hg.from_pyg(cora_as_pyg(), name="cora"), force=True)
    hg.partition_dataset(out / "graph.h5", out / "parts", parts, "metis", seed=0)


def train(out: Path, epochs: int) -> dict:
    comm = hg.init()
    config = hg.load_config(REPO / "configs" / "dp_gcn.yaml", [
        f"data.path={out / 'parts'}", f"train.epochs={epochs}", "train.progress=false",
        f"train.run_dir={out / 'run'}"])
    trainer = hg.Trainer(config, comm)
    summary = trainer.fit()
    ids, logits = trainer.predict()  # this rank's nodes: their ids in the Data, and the model's output rows
    if comm.rank == 0:
        print(f"rank 0 holds {len(ids)} of {trainer.graph.global_num_nodes} nodes; logits {tuple(logits.shape)}")
        print(f"test accuracy {summary['test_acc']:.4f}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("data/pyg-example"))
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--train", action="store_true", help="train on the partition (under mpiexec -n PARTS)")
    ap.add_argument("--epochs", type=int, default=50)
    args = ap.parse_args()
    if args.train:
        train(args.out, args.epochs)
    else:
        write(args.out, args.parts)
        print(f"wrote {args.out / 'graph.h5'} and {args.out / 'parts'}")


if __name__ == "__main__":
    main()
