"""Inference: train, then write every node's model output into one HDF5 file from all ranks, and read it back.

    mpiexec -n 2 python examples/predictions.py data/cora-2parts --out runs/predictions.h5
    python -c "import h5py; print(h5py.File('runs/predictions.h5')['node/output'].shape)"

``Trainer.write_predictions`` writes ``/node/output`` float32[N, C], row i the node of dataset id i (a partition's
local order does not leak out), with the best-validation weights; each rank writes its rows in turn and the file
appears only when complete. ``Trainer.predict()`` gives the same rows as a tensor, with their dataset ids. With a
model of your own that returns embeddings instead of logits, these are the embeddings.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py

import hpc_graph as hg

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="a dataset file or a partition directory")
    ap.add_argument("--out", type=Path, default=Path("runs/predictions.h5"))
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = ap.parse_args()
    comm = hg.init()
    config = hg.load_config(REPO / "configs" / "sar_gcn.yaml", [
        f"data.path={args.data}", f"engine.name={args.engine}", f"train.epochs={args.epochs}", "train.progress=false",
        f"train.dtype={args.dtype}",
        "train.run_dir=runs/predictions-example"])
    trainer = hg.Trainer(config, comm)
    trainer.fit()
    path = trainer.write_predictions(args.out)
    if comm.rank == 0:
        with h5py.File(path, "r") as f:
            out = f["node/output"]
            print(f"{path}: node/output {out.shape} from epoch {out.attrs['epoch']} ({out.attrs['engine']})")


if __name__ == "__main__":
    main()
