"""Run under ``mpiexec -n N``: layers written by a user from the public API alone give, on every engine and rank
count, the numbers of one process holding the whole graph (float64).

The layers (examples/): GIN (sum aggregation, an MLP, a learnable epsilon; ``graph.aggregate``), GATv2 (a score
from both ends of every edge, softmax over the in-edges and the self loop; ``graph.message_passing`` with
``reduce="softmax"``) and a relational, edge-weighted mean (``w_ij * (x_j W_type)``; ``graph.message_passing``
reading ``edges.weight`` and ``edges.type``).

Rank 0 writes a random graph with skewed degrees, isolated nodes, edge weights and 3 edge types, and partitions it
into N parts (METIS). Every rank then checks against the ``single`` engine's model on the whole graph:

* ``dp``, ``sar`` (prefetch off and on) and ``sylvie`` (32 bits, synchronous: float32 halo rows, so 1e-6) with
  feature dropout 0.3 keyed on the nodes' dataset ids, both models
  starting their forward from one torch seed: the owned rows of the output, the loss (sum of CE over the training
  nodes / the global count) and every parameter's all-reduced gradient;
* ``minibatch`` with all neighbours (``fanouts: [-1, -1]``, ``mode: exact``), no dropout: every batch's rows and
  the gradients of its summed loss against the same seeds' rows of the whole-graph model. The relational model
  declares ``edge_fields``, so the sampler carries each sampled edge's weight and type.

With chunks of 200 edges (``hpc_graph.ops.message.CHUNK_EDGES``), so every layer call walks many chunks. Rank 0
prints ``user_layers_checks: N ranks, K cases OK``.

``--short`` (the 4-rank run): GATv2 and the relational layer on ``sar`` (prefetch on) and ``minibatch`` only.

Usage: user_layers_checks.py WORKDIR [--short]
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "examples"), str(Path(__file__).resolve().parent)]
import hpc_graph as hg  # noqa: E402
import hpc_graph.ops.message as message_op  # noqa: E402
from _rank_main import run  # noqa: E402
from custom_layer import GIN  # noqa: E402
from data_io.dataset import GraphData, write_dataset  # noqa: E402
from message_passing import GATv2, WeightedRGCN  # noqa: E402

RTOL = 1e-10
SYLVIE_RTOL = 1e-6  # 32-bit sylvie sends its halo rows as float32
SCALE_FLOOR = 1e-6
DROPOUT = 0.3
CPU = torch.device("cpu")
FEATURES, CLASSES = 6, 3


def _dataset(path: Path, n: int = 160, e: int = 900, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** 0.8
    src = rng.choice(n - 5, e, p=w[:n - 5] / w[:n - 5].sum())  # the last 5 nodes are isolated
    dst = rng.integers(0, n - 5, e)
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)  # directed: (destination, source)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=indptr[1:])
    split = rng.random(n)
    write_dataset(path, GraphData(
        indptr=indptr, indices=pairs[:, 1].astype(np.int64), feat=rng.standard_normal((n, FEATURES)).astype(np.float32),
        label=rng.integers(0, CLASSES, n).astype(np.int64), train_mask=split < 0.6,
        val_mask=(split >= 0.6) & (split < 0.8), test_mask=split >= 0.8,
        edge_weight=rng.uniform(0.2, 2.0, len(pairs)).astype(np.float32),
        edge_type=rng.integers(0, 3, len(pairs)).astype(np.int16), name="layers", num_classes=CLASSES, directed=True))


def _models(p: float, names: tuple[str, ...]) -> dict:
    mc = argparse.Namespace(hidden=8, heads=2, dropout=p)
    every = {"GIN": lambda: GIN(FEATURES, CLASSES, mc), "GATv2": lambda: GATv2(FEATURES, CLASSES, mc),
             "WeightedRGCN": lambda: WeightedRGCN(FEATURES, CLASSES, mc)}
    return {k: every[k] for k in names}


def _close(what: str, got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL) -> None:
    got, want = got.detach(), want.detach()
    scale = max(SCALE_FLOOR, float(want.abs().max()) if want.numel() else 0.0)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    if err > rtol * max(1.0, scale) or got.shape != want.shape:
        raise AssertionError(f"{what}: max error {err:.3e} (scale {scale:.3e}), shapes {tuple(got.shape)} "
                             f"{tuple(want.shape)}")


def check_full(data: Path, pdir: Path, comm, engines: tuple, names: tuple[str, ...]) -> int:
    single = hg.create_engine("single", str(data), hg.init("local"), CPU, torch.float64)
    cases = 0
    for engine, options in engines:
        eng = hg.create_engine(engine, str(pdir), comm, CPU, torch.float64, options)
        rows = eng.graph.dg.orig_id
        train = eng.masks["train"]
        total = float(comm.allreduce_(torch.tensor([float(train.sum())], dtype=torch.float64))[0])
        for name, build in _models(DROPOUT, names).items():
            torch.manual_seed(11)
            ref = build().double()
            model = copy.deepcopy(ref)
            torch.manual_seed(5)
            want = ref(single.graph, single.feat)
            torch.manual_seed(5)
            got = model(eng.graph, eng.feat)
            where = f"rank {comm.rank} {engine} {options} {name}"
            tol = SYLVIE_RTOL if engine == "sylvie" else RTOL
            _close(f"{where} output", got, want[rows], tol)
            loss_w = F.cross_entropy(want[single.masks["train"]], single.label[single.masks["train"]],
                                     reduction="sum") / total
            loss_g = F.cross_entropy(got[train], eng.label[train], reduction="sum") / total
            loss_w.backward()
            loss_g.backward()
            whole = float(comm.allreduce_(loss_g.detach().reshape(1).clone())[0])
            _close(f"{where} loss", torch.tensor(whole, dtype=torch.float64), loss_w.detach(), tol)
            for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
                grad = comm.allreduce_(p.grad.reshape(-1).clone()).view_as(p.grad)
                _close(f"{where} gradient {pname}", grad, q.grad, tol)
            cases += 1
    return cases


def check_minibatch(data: Path, pdir: Path, comm, names: tuple[str, ...]) -> int:
    single = hg.create_engine("single", str(data), hg.init("local"), CPU, torch.float64)
    mb = hg.create_engine("minibatch", str(pdir), comm, CPU, torch.float64,
                          {"fanouts": (-1, -1), "batch_size": 30, "mode": "exact"})
    orig = mb.dg.orig_id
    cases = 0
    for name, build in _models(0.0, names).items():
        torch.manual_seed(11)
        model = build().double()
        twin = copy.deepcopy(model)
        mb.check_model(twin)
        full = model(single.graph, single.feat)  # one whole-graph pass; each batch's rows differentiated from it
        params = list(model.parameters())
        mb.begin_epoch(1)
        for it in range(mb.iterations(1)):
            batch = mb.batch(1, it)
            rows = orig[batch.seeds]
            out = twin(batch.graph, batch.feat)
            where = f"rank {comm.rank} minibatch {name} iteration {it}"
            _close(f"{where} rows", out, full[rows])
            twin.zero_grad()
            F.cross_entropy(out, batch.label, reduction="sum").backward()
            want = torch.autograd.grad(F.cross_entropy(full[rows], single.label[rows], reduction="sum"), params,
                                       retain_graph=True, allow_unused=True)
            for (pname, p), q in zip(twin.named_parameters(), want):
                _close(f"{where} gradient {pname}", p.grad, torch.zeros_like(p) if q is None else q)
        cases += 1
    return cases


def main() -> int:
    work = Path(sys.argv[1])
    short = "--short" in sys.argv[2:]
    comm = hg.init()
    message_op.CHUNK_EDGES = 200
    data, pdir = work / "layers.h5", work / f"layers-{comm.size}"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(data)
        hg.partition_dataset(data, pdir, comm.size, "metis", seed=0)
    comm.barrier()
    if short:  # the message functions on the rotation and the sampled blocks (GIN is aggregate's, checked elsewhere)
        names, engines = ("GATv2", "WeightedRGCN"), (("sar", {"prefetch": True}),)
    else:
        names, engines = ("GIN", "GATv2", "WeightedRGCN"), (("dp", {}), ("sar", {"prefetch": False}),
                                                             ("sar", {"prefetch": True}),
                                                             ("sylvie", {"bits": 32, "pipeline": "off"}))
    cases = check_full(data, pdir, comm, engines, names) + check_minibatch(data, pdir, comm, names)
    comm.barrier()
    if comm.rank == 0:
        print(f"user_layers_checks: {comm.size} ranks, {cases} cases OK", flush=True)
    return 0


if __name__ == "__main__":
    run(main)
