"""Run under ``mpiexec -n N``: the ``sylvie`` engine's messages, policy and pipeline.

Rank 0 writes a random power-law-ish graph and partitions it into N parts
(random). Every rank then checks:

1. **bytes**: for base widths 1, 2, 4, 8 (``bits: auto``), static widths and
   float16 parameters, one forward + backward of GCN and GAT sends exactly the
   bytes computed here from the halo sizes and a bit table built independently
   (naive degree ranking of the boundary nodes, importances gathered from
   every rank, the candidate rule, ``ceil(n_b F b / 8)`` code bytes per group);
   the communicator counted the same bytes.
2. **pipeline**: with the weights unchanged between epochs, a stale epoch
   (``pipeline: on``, 32 bits) gives dp's output and gradients exactly; once
   the weights change, its output differs from dp's (the halo is really old).
3. **policy**: ``Trainer.fit`` with ``bits: auto`` and ``pipeline: on`` /
   ``adaptive`` and a short LDR window: every rank records the same base width
   and sync/async sequence, the width changes while messages are in flight
   (no deadlock: the test's timeout), and adaptive runs both modes.

Usage: sylvie_checks.py WORKDIR
"""
from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from data_io.dataset import GraphData, write_dataset
from data_io.partitioner import partition_dataset
from hpc_graph.comm import get_communicator
from hpc_graph.engines import create_engine
from hpc_graph.nn import build_model


def _dataset(path: Path, n: int = 160, seed: int = 3) -> None:
    rng = np.random.default_rng(seed)
    weight = 1.0 / np.arange(1, n + 1) ** 0.8  # skewed degrees: importances spread over [0, 1]
    src = rng.choice(n, 900, p=weight / weight.sum())
    dst = rng.integers(0, n, 900)
    keep = src != dst
    pairs = np.unique(np.concatenate([np.stack([dst[keep], src[keep]], 1), np.stack([src[keep], dst[keep]], 1)]),
                      axis=0)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=indptr[1:])
    split = rng.random(n)
    write_dataset(path, GraphData(indptr=indptr, indices=pairs[:, 1].astype(np.int64),
                                  feat=rng.standard_normal((n, 11)).astype(np.float32),
                                  label=rng.integers(0, 4, n).astype(np.int64), train_mask=split < 0.6,
                                  val_mask=(split >= 0.6) & (split < 0.8), test_mask=split >= 0.8,
                                  name="sylvie", num_classes=4, directed=False))


# -- 1. bytes from an independent bit table -----------------------------------------------------------
def _importances(dg, comm) -> dict[int, float]:
    """{global id: importance} of every boundary node of every rank (naive ranking, all-gathered)."""
    deg = dg.in_degree.numpy()
    boundary = sorted({int(v) for lid in dg.send_lid.values() for v in lid.tolist()})
    d = [int(deg[v]) for v in boundary]
    mine = {}
    for v, dv in zip(boundary, d):
        mine[int(dg.gid[v])] = 1.0 if len(d) == 1 else (sum(1 for u in d if u <= dv) - 1) / (len(d) - 1)
    everyone = {}
    for part in comm.allgather_object(mine):
        everyone.update(part)
    return everyone


def _bits(p: float, base: int) -> int:
    cand = [b for b in (1, 2, 4, 8) if b >= base]
    return cand[min(len(cand) - 1, int(math.floor(p * len(cand))))]


def _message_bytes(bits: list[int], width: int, extra: int, item: int, pitem: int) -> int:
    total = len(bits) * extra * item
    for b in set(bits):
        n = bits.count(b)
        total += n * width * item if b == 32 else 2 * n * pitem + (n * width * b + 7) // 8
    return total


def _expected(dg, imp, table, calls, item, pitem):
    fwd = bwd = 0
    for width, extra, grad in calls:
        for q, lid in dg.send_lid.items():
            bits = [table(imp[int(dg.gid[v])]) for v in lid.tolist()]
            fwd += _message_bytes(bits, width, extra, item, pitem)
        if grad:
            for q in dg.recv_count:
                lo, hi = dg.halo_range(q)
                bits = [table(imp[int(g)]) for g in dg.halo_gid[lo:hi].tolist()]
                bwd += _message_bytes(bits, width, extra, item, pitem)
    return fwd, bwd


def check_bytes(pdir: Path, comm) -> int:
    checked = 0
    cases = [("auto", b, "float32") for b in (1, 2, 4, 8)] + [(2, 2, "float32"), (32, 32, "float32"),
                                                              ("auto", 1, "float16"), (8, 8, "float16")]
    if comm.size > 2:  # every other case on 4 ranks (each bit width / scale type is still reached)
        cases = cases[::2]
    for bits, base, scale in cases:
        eng = create_engine("sylvie", str(pdir), comm, "cpu", torch.float32, {"bits": bits, "scale_dtype": scale})
        dg = eng.graph.dg
        imp = _importances(dg, comm)
        if bits == "auto":
            eng.policy.bits = base
            table = lambda p, base=base: _bits(p, base)  # noqa: E731
        else:
            table = lambda p, b=bits: b  # noqa: E731
        for model_name in ("gcn", "gat"):
            torch.manual_seed(0)
            model = build_model(model_name, eng.num_features, 6, eng.num_classes, num_layers=2, dropout=0.0,
                                heads=2, out_heads=1)
            calls = []
            halo = eng.graph.halo

            def logged(x, extra=None, halo=halo, calls=calls):
                calls.append((int(x.shape[1]), 0 if extra is None else int(extra.shape[1]),
                              x.requires_grad or (extra is not None and extra.requires_grad)))
                return halo(x, extra)
            eng.graph.halo = logged
            eng.reset_stats()
            before = comm.bytes_by_op.get("exchange", 0)
            out = model(eng.graph, eng.feat)
            out.sum().backward()
            del eng.graph.halo
            st = eng.stats()
            want = _expected(dg, imp, table, calls, 4, 2 if scale == "float16" else 4)
            got = (st["halo_bytes_fwd"], st["halo_bytes_bwd"])
            if got != want:
                raise AssertionError(f"rank {comm.rank} bits={bits} base={base} {scale} {model_name}: sent {got}, "
                                     f"the bit table gives {want} (calls {calls})")
            if comm.bytes_by_op.get("exchange", 0) - before != sum(want):
                raise AssertionError(f"rank {comm.rank}: communicator counted "
                                     f"{comm.bytes_by_op.get('exchange', 0) - before}, expected {sum(want)}")
            checked += 1
    return checked


# -- 2. the stale pipeline against dp ---------------------------------------------------------------
def _loss(out, eng):
    m = eng.masks["train"]
    return F.cross_entropy(out[m], eng.label[m], reduction="sum")


def check_pipeline(pdir: Path, comm) -> None:
    dp = create_engine("dp", str(pdir), comm, "cpu", torch.float64)
    sy = create_engine("sylvie", str(pdir), comm, "cpu", torch.float64, {"bits": 32, "pipeline": "on"})
    torch.manual_seed(5)
    model = build_model("gcn", dp.num_features, 8, dp.num_classes, num_layers=3, dropout=0.0).double()
    twin = copy.deepcopy(model)

    def step(eng, net):
        net.zero_grad()
        out = net(eng.graph, eng.feat)
        _loss(out, eng).backward()
        return out.detach(), [p.grad.clone() for p in net.parameters()]

    for epoch in (1, 2, 3):
        sy.begin_epoch(epoch)
        got, got_g = step(sy, twin)
        sy.end_epoch(epoch, 1.0 / epoch, 0.1)
        want, want_g = step(dp, model)
        assert sy.stale == (epoch > 1), (epoch, sy.stale)
        if not torch.equal(got, want):
            raise AssertionError(f"rank {comm.rank} epoch {epoch}: stale output differs although the weights "
                                 f"did not change (max {float((got - want).abs().max()):.3e})")
        for g, w in zip(got_g, want_g):
            if not torch.allclose(g, w, rtol=1e-12, atol=1e-12):
                raise AssertionError(f"rank {comm.rank} epoch {epoch}: stale gradient differs")
    with torch.no_grad():  # now the weights move: a stale epoch sees the old halo rows
        for net in (model, twin):
            for p in net.parameters():
                p.mul_(1.5)
    sy.begin_epoch(4)
    got, _ = step(sy, twin)
    want, _ = step(dp, model)
    differs = torch.tensor([float(not torch.allclose(got, want))], dtype=torch.float64)
    comm.allreduce_(differs)
    if comm.size > 1 and differs.item() == 0 and sy.plan.num_halo:
        raise AssertionError("a stale epoch after a weight change matched dp: the halo was not stale")
    sy.close()


# -- 3. the policy through the trainer ---------------------------------------------------------------
def check_policy(pdir: Path, work: Path, comm) -> tuple[int, int]:
    from hpc_graph.train.config import config_from_dict
    from hpc_graph.train.trainer import Trainer

    results = []
    for pipeline, window in (("on", 1), ("adaptive", 2)):
        cfg = config_from_dict({
            "data": {"path": str(pdir)},
            "engine": {"name": "sylvie", "bits": "auto", "pipeline": pipeline, "ldr_window": window,
                       "ldr_smoothing": 0.5},
            "model": {"name": "gcn", "hidden": 16, "num_layers": 2, "dropout": 0.5},
            "optim": {"lr": 0.02},
            "train": {"epochs": 30, "seed": 1, "eval_every": 10, "progress": False,
                      "run_dir": str(work / f"fit-{pipeline}")},
        })
        trainer = Trainer(cfg, comm)
        trainer.fit()
        hist = [(h["epoch"], h["bits"], h["mode"]) for h in trainer.engine.history]
        everyone = comm.allgather_object(hist)
        if any(h != hist for h in everyone):
            raise AssertionError(f"{pipeline}: ranks disagree on the bit widths / modes: {everyone}")
        changed_async = sum(1 for a, b in zip(hist, hist[1:]) if a[1] != b[1] and a[2] == b[2] == "async")
        modes = {m for _, _, m in hist}
        if pipeline == "on" and (changed_async == 0 or modes != {"sync", "async"}):
            raise AssertionError(f"pipeline on: the width never changed while messages were in flight: {hist}")
        if pipeline == "adaptive" and modes != {"sync", "async"}:
            raise AssertionError(f"pipeline adaptive: expected both sync and async epochs: {hist}")
        results.append(changed_async)
    return results[0], results[1]


def main() -> int:
    work = Path(sys.argv[1])
    comm = get_communicator("mpi")
    from hpc_graph.comm.threads import configure_threads
    configure_threads(comm=comm, world=True)  # one thread per rank on shared cores, as a user's job
    from hpc_graph.comm import install_abort_handler
    install_abort_handler(comm)
    n = comm.size
    pdir = work / f"parts-{n}"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(work / "g.h5")
        partition_dataset(work / "g.h5", pdir, n, "random", 0)
    comm.barrier()
    cases = check_bytes(pdir, comm)
    check_pipeline(pdir, comm)
    changes = check_policy(pdir, work, comm)
    comm.barrier()
    if comm.rank == 0:
        print(f"sylvie_checks: {n} ranks, {cases} byte cases, pipeline, policy OK "
              f"(width changes while in flight: {changes})", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
