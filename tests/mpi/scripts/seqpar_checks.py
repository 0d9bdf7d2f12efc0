"""Run under ``mpiexec -n N``: the ``seqpar`` engine must reproduce ``single`` for the graph transformers.

Rank 0 writes a random dataset (S = 61 nodes, not divisible by 2 or 4, isolated nodes, Laplacian
encodings); every rank then builds the same model twice, float64, dropout 0.2 (masks keyed on the
tokens' node ids, the global token's on the node count): once on a
``single``-engine context over the whole graph (the reference, computed on every rank) and once
on ``seqpar``, and checks for GT (global token, encodings) and Graphormer (structural bias, global
token), sparse, dense and interleaved attention:

* the forward rows this rank holds against the reference's rows ``[lo, hi)``;
* the loss (sum of CE over the train nodes / global train count, all-reduced);
* every parameter gradient (all-reduced) and the weights after 3 Adam steps, 1e-10 relative;
* the bytes sent in one forward + backward: exactly the all-to-alls' (per attention call
  ``(own rows x (P - 1) + S' - the rank's rows) x H/P x 4 d`` values, S' = S + 1 with the global
  token), so nothing else (no bias, no pattern) is communicated;
* the same with the sequence in RCM and METIS-cluster order (each rank then holds scattered nodes);
* the cluster-sparse layout (``cluster_beta`` 0 and 0.05, METIS clusters of 8): the same results;
* the beta tuner fed each rank's own epoch time: every rank takes the same decisions;
* heads not divisible by P fails with a message naming ``model.heads`` (the model on the engine, and the Trainer
  before it loads anything);
* the Trainer on ``seqpar`` (each rank with its own random stream, as in a job) against the Trainer on
  ``single``: GT with encodings, 3 steps, losses and parameters (the encodings' random sign flips must be
  drawn alike on every rank).

The orders and the cluster layout: both orders and both betas on 2 ranks, METIS order and beta 0.05 on
4, neither on 1 (where the sequence is not split).

Usage: seqpar_checks.py WORKDIR
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from data_io.dataset import GraphData, open_dataset, write_dataset
from data_io.preprocess import add_node_field, laplacian_pe
from hpc_graph.comm import get_communicator
from hpc_graph.engines import create_engine
from hpc_graph.graph.whole_graph import WholeGraph as _SingleGraph
from hpc_graph.nn import build_model
from hpc_graph.nn.optim import Adam  # torch.optim would import torch._dynamo: seconds per rank
from hpc_graph.ops.csr import CSR

RTOL = 1e-10
DROPOUT = 0.2


def _dataset(path: Path, n: int = 61, e: int = 150, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    active = n - 4
    s, d = rng.integers(0, active, e), rng.integers(0, active, e)
    keep = s != d
    pairs = np.unique(np.concatenate([np.stack([d[keep], s[keep]], 1), np.stack([s[keep], d[keep]], 1)]), axis=0)
    dst, src = pairs[:, 0], pairs[:, 1]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    feat = rng.standard_normal((n, 5)).astype(np.float32)
    label = rng.integers(0, 3, n).astype(np.int64)
    train = rng.random(n) < 0.5
    write_dataset(path, GraphData(indptr=indptr, indices=src.astype(np.int64), feat=feat, label=label,
                                  train_mask=train, val_mask=~train, test_mask=np.zeros(n, bool), num_classes=3,
                                  name="seqpar"))
    add_node_field(path, "lap_pe", laplacian_pe(indptr, src, n, 4))


def _close(what, a, b):
    if not torch.allclose(a, b, rtol=RTOL, atol=RTOL):
        raise AssertionError(f"{what}: max abs diff {float((a - b).abs().max()):.3e}")


def _loss(out, label, mask, count):
    return F.cross_entropy(out[mask], label[mask], reduction="sum") / count


def _check(comm, path, name, extra, tag, order="id", options=None) -> int:
    P, me = comm.size, comm.rank
    eng = create_engine("seqpar", str(path), comm, "cpu", torch.float64, {"sequence_order": order, **(options or {})})
    g = eng.graph
    with open_dataset(path) as ds:
        n = ds.num_nodes
        ref_graph = _SingleGraph(CSR(ds.indptr(), ds.indices().astype(np.int64), n), sequence_order=order)
        ref_graph.cluster_size = (options or {}).get("cluster_size", 256)  # the METIS order's cluster size
        ref_graph.node_fields["lap_pe"] = torch.from_numpy(ds.lap_pe()).double()
        feat = torch.from_numpy(ds.feat_rows(0, n)).double()
        label = torch.from_numpy(ds.label())
        train = torch.from_numpy(ds.mask("train_mask"))
    count = float(train.sum())
    torch.manual_seed(7)
    ref = build_model(name, 5, 8, 3, num_layers=2, heads=4, dropout=DROPOUT, **extra).double()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model = build_model(name, 5, 8, 3, num_layers=2, heads=4, dropout=DROPOUT, **extra).double()
    model.load_state_dict(ref.state_dict())
    if hasattr(ref, "pe_seed"):  # built after ref, so its own draw differs (the trainer builds one per rank alike)
        model.pe_seed = ref.pe_seed
    # eps 1e-4, not 1e-8: the key bias's true gradient is 0 (softmax ignores a constant per row), so its
    # computed gradient is rounding noise (~1e-17) that Adam would scale by lr/eps = 1e6 into the weights
    opt_r = Adam(ref.parameters(), lr=0.01, eps=1e-4)
    opt_s = Adam(model.parameters(), lr=0.01, eps=1e-4)
    rows = g.global_ids()  # the node ids of this rank's tokens
    glob = name == "graphormer" or extra.get("global_token", False)
    for step in range(3):
        torch.manual_seed(100 + step)  # the same sign flips on every rank and in the reference
        out_r = ref(ref_graph, feat)
        loss_r = _loss(out_r, label, train, count)
        opt_r.zero_grad()
        loss_r.backward()
        torch.manual_seed(100 + step)
        sent0 = comm.bytes_sent
        out_s = model(g, eng.feat)
        loss_s = _loss(out_s, eng.label, eng.masks["train"], count)
        opt_s.zero_grad()
        loss_s.backward()
        sent = comm.bytes_sent - sent0
        _close(f"{tag} step {step} forward rows", out_s.detach(), out_r.detach()[rows])
        total = loss_s.detach().clone()
        g.all_reduce_sum(total)
        _close(f"{tag} step {step} loss", total, loss_r.detach())
        counts = np.diff(g.ranges).astype(np.int64)
        if glob:
            counts[-1] += 1
        hp, dh = 4 // P, 8 // 4
        per_call = (int(counts[me]) * (P - 1) + int(counts.sum()) - int(counts[me])) * hp * 4 * dh * 8
        if P > 1 and sent != 2 * per_call:
            raise AssertionError(f"{tag}: sent {sent} bytes in forward+backward, the all-to-alls make {2 * per_call}")
        for (k, pr), ps in zip(ref.named_parameters(), model.parameters()):
            grad = ps.grad.detach().clone() if ps.grad is not None else torch.zeros_like(ps)
            g.all_reduce_sum(grad)
            ps.grad = grad
            _close(f"{tag} step {step} grad {k}", grad, pr.grad if pr.grad is not None else torch.zeros_like(pr))
        opt_r.step()
        opt_s.step()
    for (k, pr), ps in zip(ref.named_parameters(), model.parameters()):
        _close(f"{tag} weights after 3 steps {k}", ps.detach(), pr.detach())
    return 1


def _tuner_agrees(comm, path) -> int:
    """Each rank feeds its own (different) epoch time; the engine all-reduces it, so beta moves alike."""
    eng = create_engine("seqpar", str(path), comm, "cpu", torch.float64,
                        {"sequence_order": "metis", "cluster_beta": "auto", "cluster_size": 8, "tuner_window": 2})
    model = build_model("graphormer", 5, 8, 3, num_layers=1, heads=4, dropout=0.0).double()
    rng = np.random.default_rng(comm.rank)
    for epoch in range(1, 16):
        model(eng.graph, eng.feat)  # builds the layout of the current beta
        eng.end_epoch(epoch, 1.0 / epoch, float(rng.uniform(0.5, 1.5)))
    mine = eng.graph.clusters.tuner.history
    everyone = comm.allgather_object(mine)
    if any(h != everyone[0] for h in everyone):
        raise AssertionError(f"beta histories differ between ranks: {everyone}")
    if len({b for _, b in mine}) < 2:
        raise AssertionError(f"the tuner never moved: {mine}")
    return 1


def _trainer_refuses_heads(comm, path: Path, work: Path) -> int:
    """Heads that do not split over the ranks: the Trainer refuses in preflight, before anything is loaded."""
    from hpc_graph.train.config import ConfigError, config_from_dict
    from hpc_graph.train.trainer import Trainer

    heads = 6 * comm.size + 1
    cfg = config_from_dict({"data": {"path": str(path)}, "engine": {"name": "seqpar"},
                            "model": {"name": "gt", "hidden": heads, "heads": heads, "pe_dim": 0},
                            "train": {"progress": False, "run_dir": str(work / "heads")}})
    try:
        Trainer(cfg, comm)
    except ConfigError as exc:
        if not str(exc).startswith(f"model.heads: {heads} heads cannot be split over {comm.size} ranks"):
            raise AssertionError(f"heads refusal: {exc}") from None
    else:
        raise AssertionError("the Trainer accepted heads that do not split over the ranks")
    if (work / "heads").exists():
        raise AssertionError("the refused Trainer left a run directory")
    return 1


def _trainer_matches_single(comm, path: Path, work: Path) -> int:
    """The Trainer on ``seqpar`` (whose ranks keep the stream the model was built from) against the Trainer on
    ``single``: GT with encodings, whose random sign flips every rank must draw alike, and dropout, 3 steps,
    float64."""
    from hpc_graph.train.config import config_from_dict
    from hpc_graph.train.trainer import Trainer

    def cfg(engine):
        return config_from_dict({
            "data": {"path": str(path)}, "engine": {"name": engine},
            "model": {"name": "gt", "hidden": 8, "heads": 4, "num_layers": 2, "dropout": DROPOUT, "pe_dim": 4,
                      "global_token": True},
            "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
            "train": {"seed": 3, "dtype": "float64", "progress": False, "run_dir": str(work / f"tr-{engine}")}})

    ref = Trainer(cfg("single"), get_communicator("local"))
    run = Trainer(cfg("seqpar"), comm)
    # both trainers seeded torch's stream alike and built the same model; in one process they take turns on
    # it, so each keeps its own copy of the stream between its steps (as two jobs would)
    streams = {id(ref): torch.random.get_rng_state(), id(run): torch.random.get_rng_state()}

    def step(trainer) -> float:
        torch.random.set_rng_state(streams[id(trainer)])
        loss = trainer.step()
        streams[id(trainer)] = torch.random.get_rng_state()
        return loss

    for step_no in range(3):
        got, want = step(run), step(ref)
        if abs(got - want) > RTOL * max(1.0, abs(want)):
            raise AssertionError(f"rank {comm.rank}: trainer seqpar loss of step {step_no + 1} {got!r} != single "
                                 f"{want!r}")
    for (key, w), g in zip(ref.model.state_dict().items(), run.model.state_dict().values()):
        err = float((g.double() - w.double()).abs().max()) if w.numel() else 0.0
        if err > RTOL * max(1.0, float(w.double().abs().max())):
            raise AssertionError(f"rank {comm.rank}: trainer seqpar {key} differs by {err:g} after 3 steps")
    return 1


def main() -> int:
    comm = get_communicator("mpi")
    from hpc_graph.comm.threads import configure_threads
    configure_threads(comm=comm, world=True)
    work = Path(sys.argv[1])
    path = work / "seq.h5"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(path)
    comm.barrier()
    cases = 0
    try:
        for name, extra in (("gt", dict(pe_dim=4, global_token=True)), ("graphormer", dict(max_degree=3))):
            for att in ("sparse", "dense", "every_k_steps"):
                sched = dict(attention=att, dense_every=2) if att == "every_k_steps" else dict(attention=att)
                cases += _check(comm, path, name, {**extra, **sched}, f"rank {comm.rank}/{comm.size} {name} {att}")
            # a sequence order other than the ids: the ranks hold scattered nodes, the chain follows RCM / METIS
            # (both orders and both betas on 2 ranks; METIS order and beta 0.05 on 4; neither on 1)
            orders = {1: (), 2: ("rcm", "metis")}.get(comm.size, ("metis",))
            betas = {1: (), 2: (0.0, 0.05)}.get(comm.size, (0.05,))
            for order in orders:
                cases += _check(comm, path, name, {**extra, "attention": "sparse"},
                                f"rank {comm.rank}/{comm.size} {name} {order}", order=order)
            # the cluster-sparse layout (dense tiles on dense cluster pairs) gives the same results
            for beta in betas:
                cases += _check(comm, path, name, {**extra, "attention": "sparse"},
                                f"rank {comm.rank}/{comm.size} {name} cluster beta {beta}", order="metis",
                                options={"cluster_beta": beta, "cluster_size": 8})
        cases += _tuner_agrees(comm, path)
        cases += _trainer_matches_single(comm, path, work)
        if comm.size > 1:
            eng = create_engine("seqpar", str(path), comm, "cpu", torch.float64, {})
            bad = build_model("gt", 5, 6 * comm.size + 1, 3, heads=6 * comm.size + 1, pe_dim=0).double()
            try:
                bad(eng.graph, eng.feat)
            except ValueError as exc:
                if "model.heads" not in str(exc):
                    raise AssertionError(f"heads error does not name model.heads: {exc}") from None
            else:
                raise AssertionError("heads not divisible by the ranks was accepted")
            cases += 1
            cases += _trainer_refuses_heads(comm, path, work)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        comm.abort(1)
    comm.barrier()
    if comm.rank == 0:
        print(f"seqpar_checks: {comm.size} ranks, {cases} cases per rank OK", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run

    run(main)
