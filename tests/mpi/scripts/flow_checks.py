"""Run under ``mpiexec -n P``: the ``flow`` engine (one pipeline stage per rank) against references.

Rank 0 writes a random dataset (dense features); every rank then trains in float64 and checks, for
8-layer GCN, SAGE (residual) and GAT, an 8-block RevGCN, a 4-layer GAT with attention dropout, and GCN,
SAGE and RevGCN with feature dropout 0.5:

* ``flow`` with one micro-batch and with ``cross_edges: exact`` over 3 METIS micro-batches equals the
  ``single`` engine (run on a one-process communicator on every rank): the loss of every step, the
  accuracies, and every parameter after the steps (Adam);
* ``drop`` equals ``single`` on the dataset without the edges between the micro-batches (written here
  from the engine's micro-batches);
* ``stale`` on P ranks equals ``stale`` on one process (the pipeline does not change the arithmetic);
* the stages hold disjoint parameters that add up to the model's;
* the point-to-point bytes of one step at each stage boundary are exactly ``2 * N * d * 8``
  (``d``: the hidden width crossing it) in every mode;
* a checkpoint written by a pipeline resumes to the same next step (also under ``stale``, with its history);
* too few layers for the stages is refused on every rank.

On more than 2 ranks the model checks run for GCN, RevGCN, the GAT with attention dropout and GCN and RevGCN
with feature dropout only.

Rank 0 prints ``flow_checks: P ranks OK``.

Usage: flow_checks.py WORKDIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from hpc_graph.comm import get_communicator

STEPS = 3
MODELS = {
    "gcn": {"name": "gcn", "hidden": 6, "num_layers": 8},
    "sage": {"name": "sage", "hidden": 6, "num_layers": 8, "residual": True},
    "gat": {"name": "gat", "hidden": 3, "heads": 2, "out_heads": 2, "num_layers": 8},
    "revgcn": {"name": "revgcn", "hidden": 8, "num_layers": 8},
    # hashed attention dropout: the same coefficients dropped as on single (dataset ids, the same call counts)
    "gat_attn_dropout": {"name": "gat", "hidden": 3, "heads": 2, "num_layers": 4, "attn_dropout": 0.3},
    # feature dropout: each stage replays the other stages' key draws, so every layer draws single's key
    "gcn_dropout": {"name": "gcn", "hidden": 6, "num_layers": 8, "dropout": 0.5},
    "sage_dropout": {"name": "sage", "hidden": 6, "num_layers": 8, "residual": True, "dropout": 0.5},
    "revgcn_dropout": {"name": "revgcn", "hidden": 8, "num_layers": 8, "dropout": 0.5},
}
RTOL = 1e-10  # float64, the same dropout masks: only the summation order differs


def _write(path: Path, indptr, indices, feat, label, masks, classes: int) -> None:
    from data_io.dataset import GraphData, write_dataset

    write_dataset(path, GraphData(indptr=indptr, indices=indices, feat=feat, label=label, name="rand",
                                  num_classes=classes, directed=True, **masks))


def _dataset(path: Path, n: int = 96, e: int = 480, f: int = 12, classes: int = 3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)
    dst, src = pairs[:, 0], pairs[:, 1]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    split = rng.random(n)
    masks = {"train_mask": split < 0.5, "val_mask": (split >= 0.5) & (split < 0.75), "test_mask": split >= 0.75}
    _write(path, indptr, src.astype(np.int64), rng.standard_normal((n, f)).astype(np.float32),
           rng.integers(0, classes, n).astype(np.int64), masks, classes)


def _cut_dataset(src_path: Path, out: Path, order: np.ndarray, offsets: np.ndarray) -> None:
    """The dataset without the edges between micro-batches (``order``/``offsets``: the engine's micro-batches)."""
    from data_io.dataset import open_dataset

    with open_dataset(src_path) as ds:
        indptr, indices = np.asarray(ds.indptr(), np.int64), np.asarray(ds.indices(), np.int64)
        feat, label, n = ds.feat_rows(0, ds.num_nodes), ds.label(), ds.num_nodes
        masks = {k: ds.mask(k) for k in ("train_mask", "val_mask", "test_mask")}
        classes = int(ds.num_classes)
    part = np.empty(n, dtype=np.int64)
    part[order] = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    dst = np.repeat(np.arange(n), np.diff(indptr))
    keep = part[dst] == part[indices]
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst[keep], minlength=n), out=new_ptr[1:])
    _write(out, new_ptr, indices[keep], feat, label, masks, classes)


def _config(path: Path, engine: str, model: dict, run_dir: Path, **engine_opts):
    from hpc_graph.train.config import config_from_dict

    return config_from_dict({
        "data": {"path": str(path), "feature_layout": "dense"},
        "engine": {"name": engine, **engine_opts},
        "model": {"dropout": 0.0, **model},
        "optim": {"name": "adam", "lr": 0.02, "weight_decay": 5e-4},
        "train": {"epochs": 10, "seed": 3, "eval_every": 1, "dtype": "float64", "progress": False,
                  "run_dir": str(run_dir)},
    })


def _close(what: str, got: float, want: float) -> None:
    if not abs(got - want) <= RTOL * max(1.0, abs(want)):
        raise AssertionError(f"{what}: {got!r} != {want!r}")


def _run(trainer) -> tuple[list[float], dict, dict]:
    losses = [trainer.step() for _ in range(STEPS)]
    return losses, trainer.evaluate(), trainer._model_state()


def _same(what: str, got: tuple, want: tuple) -> None:
    for i, (a, b) in enumerate(zip(got[0], want[0])):
        _close(f"{what}: loss of step {i + 1}", a, b)
    for k in ("train_acc", "val_acc", "test_acc"):
        _close(f"{what}: {k}", got[1][k], want[1][k])
    if sorted(got[2]) != sorted(want[2]):
        raise AssertionError(f"{what}: parameter names differ: {sorted(set(got[2]) ^ set(want[2]))}")
    for name, t in want[2].items():
        if not torch.allclose(got[2][name], t, rtol=RTOL, atol=1e-9):
            raise AssertionError(f"{what}: parameter {name} differs by {(got[2][name] - t).abs().max().item():.3g}")


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="rank %(process)d %(name)s: %(message)s")
    from hpc_graph.comm.local import LocalCommunicator
    from hpc_graph.comm.threads import configure_threads
    from hpc_graph.train.trainer import Trainer

    comm = get_communicator("mpi")
    configure_threads(comm=comm)  # decided over all ranks before the single-process references run
    rank, size = comm.rank, comm.size
    work = Path(sys.argv[1])
    data = work / "rand.h5"
    if rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(data)
    comm.barrier()
    local = LocalCommunicator()
    # on 4 ranks five of the eight models (a stack, the reversible blocks, attention dropout, feature dropout on
    # a stack and on the reversible blocks); all on 2
    keys = ("gcn", "revgcn", "gat_attn_dropout", "gcn_dropout", "revgcn_dropout") if size > 2 else tuple(MODELS)
    for key, model in ((k, MODELS[k]) for k in keys):
        ref = _run(Trainer(_config(data, "single", model, work / f"{key}-single-{rank}"), local))
        flow1 = Trainer(_config(data, "flow", model, work / f"{key}-flow1"), comm)
        parts = comm.allgather_object(sorted(n for n, p in flow1.model.named_parameters() if not p.is_meta))
        names = [n for part in parts for n in part]
        if len(names) != len(set(names)) or set(names) != set(ref[2]):
            raise AssertionError(f"{key}: the stages' parameters are not a partition of the model's: {parts}")
        _same(f"{key}: flow, one micro-batch", _run(flow1), ref)
        exact = Trainer(_config(data, "flow", model, work / f"{key}-exact", microbatches=3), comm)
        _same(f"{key}: flow exact, 3 micro-batches", _run(exact), ref)
        if key in ("gcn", "gat", "revgcn"):
            cut = work / f"cut-{key}.h5"
            drop = Trainer(_config(data, "flow", model, work / f"{key}-drop", microbatches=3, cross_edges="drop"),
                           comm)
            if rank == 0:
                _cut_dataset(data, cut, drop.engine.order.numpy(), drop.engine.offsets)
            comm.barrier()
            if drop.engine.cut_edges == 0:
                raise AssertionError(f"{key}: 3 micro-batches cut no edge; the drop check would prove nothing")
            want = _run(Trainer(_config(cut, "single", model, work / f"{key}-cut-{rank}"), local))
            _same(f"{key}: flow drop vs single without the cut edges", _run(drop), want)
        if key in ("gcn", "sage"):
            stale_p = _run(Trainer(_config(data, "flow", model, work / f"{key}-stale", microbatches=3,
                                           cross_edges="stale"), comm))
            stale_1 = _run(Trainer(_config(data, "flow", model, work / f"{key}-stale1-{rank}", microbatches=3,
                                           cross_edges="stale"), local))
            _same(f"{key}: flow stale on {size} ranks vs one process", stale_p, stale_1)

    # bytes at every stage boundary, every mode
    n, hidden = 96, MODELS["gcn"]["hidden"]
    for mode in ("exact", "stale", "drop"):
        t = Trainer(_config(data, "flow", MODELS["gcn"], work / f"bytes-{mode}", microbatches=4, cross_edges=mode),
                    comm)
        before = dict(comm.bytes_by_op)
        t.step()
        sent = comm.bytes_by_op.get("exchange", 0) - before.get("exchange", 0)
        per_rank = comm.allgather_object(sent)
        stages = t.engine.boundaries
        # rank r sends forward to r+1 (N rows of its output) and backward to r-1 (N rows of its input)
        for r in range(size):
            want = (n * hidden * 8 if r < size - 1 else 0) + (n * hidden * 8 if r > 0 else 0)
            if per_rank[r] != want:
                raise AssertionError(f"{mode}: rank {r} (units {stages[r]}..{stages[r + 1] - 1}) sent {per_rank[r]} "
                                     f"bytes in one step, expected {want}")

    # a checkpoint of the pipeline resumes to the same next step
    run = work / "resume"
    a = Trainer(_config(data, "flow", MODELS["gcn"], run, microbatches=2), comm)
    a.step()
    a.step()
    a.save_checkpoint()
    b = Trainer(_config(data, "flow", MODELS["gcn"], run, microbatches=2), comm, resume=run)
    _close("resumed step", b.step(), a.step())
    # ... and under `stale`, with every stage's history of the previous steps
    run = work / "resume-stale"
    a = Trainer(_config(data, "flow", MODELS["gcn"], run, microbatches=3, cross_edges="stale"), comm)
    for _ in range(3):
        a.step()
    a.save_checkpoint()
    b = Trainer(_config(data, "flow", MODELS["gcn"], run, microbatches=3, cross_edges="stale"), comm, resume=run)
    for i in range(2):
        _close(f"stale: resumed step {i}", b.step(), a.step())

    # too few layers for the stages
    if size > 1:
        try:
            Trainer(_config(data, "flow", {"name": "gcn", "hidden": 4, "num_layers": size - 1}, work / "few"), comm)
        except ValueError as exc:
            if "pipeline units" not in str(exc):
                raise AssertionError(f"unexpected message: {exc}") from None
        else:
            raise AssertionError("a model with fewer layers than stages was accepted")
    comm.barrier()
    if rank == 0:
        print(f"flow_checks: {size} ranks OK", flush=True)


if __name__ == "__main__":
    from _rank_main import run
    run(main)
