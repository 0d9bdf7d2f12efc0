"""Run under ``mpiexec -n N``: the ``dp``, ``sar`` and ``sylvie`` (32 bits) engines must reproduce ``single``.

Rank 0 writes random datasets (float features, isolated nodes, a variant with a
single training node so that some parts have none) and partitions them into N
parts (random and METIS); then every rank compares, for GCN, SAGE and GAT
(with attention dropout) and the deep models (4-layer GCNII, 3-layer JKNet
with a different combination and layer type per dataset, APPNP with K=3,
SGC with K=2 (its cached propagation included), DAGNN with K=3, and R-GCN
over the datasets' 3 edge types, with and without bases, and the reversible RevGCN
(3 blocks) and RevGAT (2 blocks), whose backward recomputes through the engine), and GT's sparse
attention through a K/V halo exchange (against ``single`` without the sequence chain), in float64, with
feature dropout 0.3 (masks keyed on the nodes' dataset ids; the reference and the engine start their
forward passes from one torch seed, so they must drop the same elements):

* forward outputs of its owned rows with the single engine's rows ``orig_id``,
* the loss (sum of CE over train nodes / global train count, all-reduced),
* every parameter gradient (all-reduced),
* weights after 5 SGD steps,
* the bytes each engine sent in one forward + backward against the count
  derived from the halo sizes and the widths of the aggregations the model made;
* ``sylvie`` with ``bits: 32`` (full precision, synchronous) against ``dp``:
  loss and gradients within 1e-6.

GCN, SAGE and GAT run on every dataset with every engine variant (dp, sar without and with prefetch,
sylvie); the deep models on two of the three datasets on 2 ranks and the third on 4 (:data:`DEEP_CASES`:
together the 2- and 4-rank runs cover all three and every per-dataset option) with sar once, its prefetch
alternating;
on 3 ranks only GCN, SAGE and GAT (an odd rank count for the halo exchange and sar's rotation).

With ``HPC_GRAPH_TEST_DEVICE=cuda`` (a GPU run, ``tests/gpu/``) the engines
under test and the models run on the GPU (the ranks share it), the ``single``
reference stays on the CPU, and ``single`` on the GPU is compared with it too.

Usage: engine_equivalence.py WORKDIR
"""
from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from data_io.dataset import GraphData, write_dataset
from data_io.partitioner import partition_dataset
from hpc_graph.comm import get_communicator
from hpc_graph.engines import create_engine
from hpc_graph.nn import build_model

RTOL = 1e-10  # float64, exact algorithms: only the summation order differs
#: the reversible blocks recompute their inputs from their outputs in backward (x = y - f(.)): the subtraction
#: cancels leading digits, so their gradients and weights carry ~100x the rounding of a stored activation
RTOL_BY_MODEL = {"revgcn": 1e-8, "revgat": 1e-8}
#: a tensor whose largest entry is below this is compared in absolute terms (RTOL * SCALE_FLOOR): a gradient that
#: is zero up to rounding (e.g. a score vector no training node's loss reaches) has no digits to compare
SCALE_FLOOR = 1e-6
DROPOUT = 0.3
FORWARD_SEED = 4321  # torch's stream at the first forward pass of the reference and of every engine
ITEM = 8  # float64 bytes
DEVICE = os.environ.get("HPC_GRAPH_TEST_DEVICE", "cpu")  # where the engines under test run


def _comm():
    comm = get_communicator("mpi")
    try:
        from hpc_graph.comm import install_abort_handler
        install_abort_handler(comm)
    except ImportError:
        pass
    # threads as a user's ranks get them (one each when the ranks share the cores), not every core per rank
    from hpc_graph.comm.threads import configure_threads
    configure_threads(comm=comm, world=True)
    return comm


def _dataset(path: Path, seed: int, n: int = 70, e: int = 320, isolated: int = 6,
             feat_dim: int = 7, classes: int = 3, train_count: int | None = None) -> None:
    """Random directed graph (no self loops, no duplicate edges); the last ``isolated`` nodes have no edges."""
    rng = np.random.default_rng(seed)
    active = n - isolated
    src = rng.integers(0, active, e)
    dst = rng.integers(0, active, e)
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)
    perm = rng.permutation(n)  # isolated nodes scattered over the id range
    dst, src = perm[pairs[:, 0]], perm[pairs[:, 1]]
    order = np.lexsort((src, dst))
    dst, src = dst[order], src[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    label = rng.integers(0, classes, n)
    edge_type = rng.integers(0, 3, len(src)).astype(np.int16)  # typed: R-GCN's relations (others ignore them)
    split = rng.random(n)
    train = split < 0.4
    if train_count is not None:
        train = np.zeros(n, dtype=bool)
        train[rng.choice(n, train_count, replace=False)] = True
    data = GraphData(indptr=indptr, indices=src.astype(np.int64), edge_type=edge_type,
                     feat=rng.standard_normal((n, feat_dim)).astype(np.float32),
                     label=label.astype(np.int64), train_mask=train,
                     val_mask=(split >= 0.4) & (split < 0.7), test_mask=split >= 0.7,
                     name=path.stem, num_classes=classes, directed=True)
    write_dataset(path, data)


def _close(what: str, got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL) -> None:
    got, want = got.detach().cpu(), want.detach().cpu()
    scale = float(want.abs().max()) if want.numel() else 0.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    if got.shape != want.shape or not err <= rtol * max(scale, SCALE_FLOOR):
        raise AssertionError(f"{what}: max abs error {err:.3e} vs scale {scale:.3e} "
                             f"(shapes {tuple(got.shape)} / {tuple(want.shape)})")


def _close_to(what: str, got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    got, want = got.detach().cpu(), want.detach().cpu()
    scale = float(want.abs().max()) if want.numel() else 0.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    if not err <= rtol * max(scale, 1e-8):
        raise AssertionError(f"{what}: max abs error {err:.3e} vs scale {scale:.3e}")


CORE = ("gcn", "sage", "gat")  # checked on every dataset, rank count and engine variant
# the deep models (the rest of the zoo) on these datasets per rank count (none at 3 ranks; 4 ranks share 2 cores in
# CI), with one sar variant each: every dataset and option variant is covered at 2 or 4 ranks, at a fraction of the
# full cross product
DEEP_CASES = {2: (0, 2), 3: (), 4: (1,)}


def expected_cases(n: int) -> int:
    """How many (dataset, model, engine) cases a run on ``n`` ranks checks per rank."""
    deep = len(_models(0)) - len(CORE)
    return len(CORE) * 3 * 4 + deep * len(DEEP_CASES.get(n, (0, 1, 2))) * 3


def _models(case: int) -> list[tuple[str, dict]]:
    """(name, build_model options) of every model checked on dataset case ``case`` (0, 1, 2)."""
    stack = {"num_layers": 2, "heads": 3, "out_heads": 2}
    return [("gcn", stack), ("sage", stack), ("gat", {**stack, "attn_dropout": 0.3}),
            ("gcn2", {"num_layers": 4, "alpha": 0.2, "theta": 0.7}),
            ("jknet", {"num_layers": 3, "jk": ("concat", "max", "attention")[case],
                       "conv": ("gcn", "sage", "gcn")[case]}),
            ("appnp", {"hops": 3, "alpha": 0.2}), ("sgc", {"hops": 2}), ("dagnn", {"hops": 3}),
            ("rgcn", {"num_layers": 2, "num_bases": (None, 2, 1)[case]}),
            ("revgcn", {"num_layers": 3, "groups": (2, 3, 2)[case], "hidden": 6}),
            ("revgat", {"num_layers": 2, "groups": 2, "heads": 1, "hidden": 4}),
            ("gt", {"num_layers": 2, "heads": 2, "hidden": 4, "pe_dim": 0, "attention": "sparse"})]


def _model(name: str, in_dim: int, classes: int, options: dict, relations: int) -> torch.nn.Module:
    torch.manual_seed(1234)
    options = dict(options)
    hidden = options.pop("hidden", 5)
    return build_model(name, in_dim, hidden, classes, dropout=DROPOUT, num_relations=relations, **options).double()


def _loss(out, engine, global_train: float) -> torch.Tensor:
    mask = engine.masks["train"]
    return F.cross_entropy(out[mask], engine.label[mask], reduction="sum") / global_train


def _sgd_step(model, lr: float = 0.5, weight_decay: float = 5e-4) -> None:
    """Plain SGD with weight decay (torch.optim would import torch._dynamo: ~10 s per rank)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad + weight_decay * p, alpha=-lr)


def _record_calls(graph) -> list:
    """Wrap ``graph.aggregate``/``aggregate_combine``/``aggregate_relations``/``gat``/``gat_projected`` to log (kind,
    row width, requires_grad); a relation-wise aggregation moves the rows once, like an ``aggregate``.

    A ``gat_projected`` call is logged once, whether the engine fuses it or its default calls ``gat``.
    """
    calls = []
    agg, agg_rel, gat, gat_projected = graph.aggregate, graph.aggregate_relations, graph.gat, graph.gat_projected
    agg_combine = graph.aggregate_combine
    inside = []

    def aggregate(x, reduce="sum"):
        if not inside:
            calls.append(("aggregate", int(np.prod(x.shape[1:])), _grad(x)))
        return agg(x, reduce)

    def combine(x, reduce="sum", **kw):  # logged once, whether the engine fuses it or composes aggregate
        calls.append(("aggregate", int(np.prod(x.shape[1:])), _grad(x)))
        inside.append(True)
        try:
            return agg_combine(x, reduce, **kw)
        finally:
            inside.pop()

    def aggregate_relations(x, reduce="mean"):
        calls.append(("aggregate", int(np.prod(x.shape[1:])), _grad(x)))
        return agg_rel(x, reduce)

    def attention(z, s_src, s_dst, **kw):
        if not inside:
            calls.append(("gat", int(np.prod(z.shape[1:])) + int(s_src.shape[1]),
                          _grad(z, s_src)))
        return gat(z, s_src, s_dst, **kw)

    def projected(x, weight, att_src, att_dst, **kw):
        calls.append(("gat", int(weight.shape[0]) + int(att_src.shape[1]),
                      _grad(x, weight, att_src)))
        inside.append(True)
        try:
            return gat_projected(x, weight, att_src, att_dst, **kw)
        finally:
            inside.pop()

    dot = graph.attention

    def dot_attention(q, k, v, **kw):  # k and v of the halo rows travel; sar re-fetches them in backward
        calls.append(("gat", int(np.prod(k.shape[1:])) + int(np.prod(v.shape[1:])), _grad(k, v)))
        return dot(q, k, v, **kw)

    graph.attention = dot_attention
    graph.aggregate, graph.gat, graph.gat_projected = aggregate, attention, projected
    graph.aggregate_relations, graph.aggregate_combine = aggregate_relations, combine
    return calls


def _grad(*ts) -> bool:
    """Whether a call on ``ts`` builds a graph (a backward pass will follow): grad mode on and an input
    needing gradients (a reversible model's forward runs under no_grad with parameters that need them)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


class _ExchangeProbe:
    """Wrap ``comm.exchange_start`` to record, per call, the peers received from and the
    number of exchanges in flight (started, not yet waited for)."""

    def __init__(self, comm):
        self.comm, self.recv_peers, self.in_flight, self.max_in_flight = comm, [], 0, 0
        self._orig = comm.exchange_start

        def exchange_start(sends, recv_specs, **kw):
            self.recv_peers.append(len([q for q in recv_specs if q != comm.rank]))
            req = self._orig(sends, recv_specs, **kw)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            wait = req.wait

            def waited():
                if not req.done:
                    self.in_flight -= 1
                return wait()
            req.wait = waited
            return req

        comm.exchange_start = exchange_start

    def close(self) -> None:
        del self.comm.exchange_start


def _expected_bytes(engine_name: str, dg, calls: list) -> int:
    """Bytes one forward + backward sends, from the halo sizes and the logged calls."""
    send_rows = sum(dg.send_count(q) for q in range(dg.num_parts))
    halo_rows = dg.num_halo
    total = 0
    for kind, width, grad in calls:
        total += send_rows * width * ITEM                      # forward: my rows to the peers
        if grad:
            total += halo_rows * width * ITEM                  # backward: halo gradients to owners
            if engine_name == "sar" and kind == "gat":
                total += send_rows * width * ITEM              # case 2: re-fetch in backward
    return total


def _reference(ds_path: Path, model_name: str, options: dict, local_comm, device: str = "cpu") -> dict:
    # graph transformers: the pattern the partitioned engines attend over (self loops + edges, no chain)
    engine_options = {"attention_chain": False} if model_name == "gt" else {}
    eng = create_engine("single", str(ds_path), local_comm, device, torch.float64, engine_options)
    model = _model(model_name, eng.num_features, eng.num_classes, options, eng.graph.num_relations).to(device)
    start = copy.deepcopy(model).cpu()
    train_count = float(eng.masks["train"].sum())
    torch.manual_seed(FORWARD_SEED)
    out = model(eng.graph, eng.feat)
    loss = _loss(out, eng, train_count)
    loss.backward()
    ref = {"out": out.detach(), "loss": loss.detach(), "model": start, "rtol": RTOL_BY_MODEL.get(model_name, RTOL),
           "grads": {k: p.grad.detach().clone() for k, p in model.named_parameters()}}
    for _ in range(5):
        model.zero_grad()
        _loss(model(eng.graph, eng.feat), eng, train_count).backward()
        _sgd_step(model)
    ref["weights"] = {k: p.detach().clone() for k, p in model.named_parameters()}
    return ref


def _check_engine(tag: str, engine_name: str, options: dict, pdir: Path, ref: dict, comm) -> tuple:
    eng = create_engine(engine_name, str(pdir), comm, DEVICE, torch.float64, options)
    dg = eng.graph.dg
    rows = torch.as_tensor(dg.orig_id)
    model = copy.deepcopy(ref["model"]).to(DEVICE)
    train_count = float(eng.graph.all_reduce_sum(eng.masks["train"].sum().double()))
    calls = _record_calls(eng.graph)
    eng.reset_stats()
    probe = _ExchangeProbe(comm)
    torch.manual_seed(FORWARD_SEED)
    out = model(eng.graph, eng.feat)
    rtol = ref["rtol"]
    _close(f"{tag} forward", out.detach(), ref["out"][rows], rtol)
    loss = _loss(out, eng, train_count)
    loss.backward()
    probe.close()
    if engine_name == "sar":
        # one remote block per exchange; at most the prefetched block and one returning gradient in flight
        limit = 2 if options.get("prefetch") else 1
        if max(probe.recv_peers, default=0) > 1 or probe.max_in_flight > limit:
            raise AssertionError(f"{tag}: exchanges received from {max(probe.recv_peers)} peers at once, "
                                 f"{probe.max_in_flight} in flight (limit {limit})")
    elif n_peers := len(dg.recv_count):
        if max(probe.recv_peers) != n_peers:
            raise AssertionError(f"{tag}: dp halo exchange should receive from all {n_peers} peers at once")
    sent = eng.stats()["bytes_sent"]
    want = _expected_bytes(engine_name, dg, calls)
    if sent != want:
        raise AssertionError(f"{tag}: sent {sent} bytes in forward+backward, halo sizes give {want} "
                             f"(calls {calls})")
    if comm.size > 1 and eng.stats()["comm_seconds"] <= 0:
        raise AssertionError(f"{tag}: comm_seconds not counted")
    total = loss.detach().clone()
    comm.allreduce_(total)
    _close(f"{tag} loss", total, ref["loss"], rtol)
    grads = [p.grad for p in model.parameters()]
    comm.allreduce_bucketed_(grads)
    for k, p in model.named_parameters():
        _close(f"{tag} grad {k}", p.grad, ref["grads"][k], rtol)
    first = (total, {k: p.grad.detach().clone() for k, p in model.named_parameters()})
    for _ in range(5):
        model.zero_grad()
        _loss(model(eng.graph, eng.feat), eng, train_count).backward()
        comm.allreduce_bucketed_([p.grad for p in model.parameters()])
        _sgd_step(model)
    for k, p in model.named_parameters():
        _close(f"{tag} weights after 5 steps {k}", p.detach(), ref["weights"][k], rtol)
    # evaluation mode under no_grad goes through the same ops
    model.eval()
    with torch.no_grad():
        model(eng.graph, eng.feat)
    return int(sent), first


def main() -> int:
    work = Path(sys.argv[1])
    comm = _comm()
    local = get_communicator("local")
    n = comm.size
    t0 = time.perf_counter()
    cases = [("graph", "random", 1), ("graph", "metis", 0), ("onetrain", "random", 2)]
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(work / "graph.h5", seed=10 + n)
        _dataset(work / "onetrain.h5", seed=20 + n, train_count=1)
        for ds, method, seed in cases:
            partition_dataset(work / f"{ds}.h5", work / f"{ds}-{method}-{n}", n, method, seed)
        partition_dataset(work / "graph.h5", work / f"graph-random-{n + 1}", n + 1, "random", 0)
    comm.barrier()
    t_setup = time.perf_counter() - t0

    # wrong rank count: a clear error naming the directory and both numbers
    wrong = work / f"graph-random-{n + 1}"
    for name in ("dp", "sar", "sylvie"):
        try:
            create_engine(name, str(wrong), comm, "cpu", torch.float64)
        except ValueError as exc:
            msg = str(exc)
            if str(wrong) not in msg or f"{n + 1} parts" not in msg or f"{n} ranks" not in msg:
                raise AssertionError(f"{name}: unclear rank-count error: {msg}") from None
        else:
            raise AssertionError(f"{name}: no error for {n + 1} parts on {n} ranks")

    checked = 0
    bytes_by = {}
    for case, (ds, method, _) in enumerate(cases):
        pdir = work / f"{ds}-{method}-{n}"
        for model_name, model_options in _models(case):
            deep = model_name not in CORE
            if deep and case not in DEEP_CASES.get(n, (0, 1, 2)):
                continue
            ref = _reference(work / f"{ds}.h5", model_name, model_options, local)
            if DEVICE != "cpu":  # single on the GPU against single on the CPU
                got = _reference(work / f"{ds}.h5", model_name, model_options, local, DEVICE)
                for key in ("out", "loss"):
                    _close(f"single on {DEVICE} {ds} {model_name} {key}", got[key], ref[key])
                for key in ("grads", "weights"):
                    for k, t in ref[key].items():
                        _close(f"single on {DEVICE} {ds} {model_name} {key} {k}", got[key][k], t)
            first_dp = None
            variants = [("dp", {}), ("sar", {"prefetch": False}), ("sar", {"prefetch": True}),
                        ("sylvie", {"bits": 32, "pipeline": "off"})]
            if deep:  # sar once, with and without prefetch in turn (both for the core models)
                del variants[1 + (case + n) % 2]
            for engine_name, options in variants:
                tag = f"rank {comm.rank}/{n} {ds}/{method} {model_name} {engine_name}{options}"
                sent, first = _check_engine(tag, engine_name, options, pdir, ref, comm)
                bytes_by[(ds, method, model_name, engine_name, bool(options.get("prefetch")))] = sent
                if engine_name == "dp":
                    first_dp = first
                elif engine_name == "sylvie":  # full precision, synchronous: dp's numbers
                    _close_to(f"{tag} loss vs dp", first[0], first_dp[0], 1e-6)
                    for k, g in first[1].items():
                        _close_to(f"{tag} grad {k} vs dp", g, first_dp[1][k], 1e-6)
                    if sent != bytes_by[(ds, method, model_name, "dp", False)]:
                        raise AssertionError(f"{tag}: 32-bit sylvie sent {sent} bytes, dp sent "
                                             f"{bytes_by[(ds, method, model_name, 'dp', False)]}")
                checked += 1
    # sar sends as much as dp for sum/mean (case 1) and 1.5x for GAT (case 2)
    for (ds, method, model_name, engine_name, prefetch), sent in bytes_by.items():
        other = bytes_by.get((ds, method, model_name, "sar", not prefetch))
        if engine_name == "sar" and other is not None:
            if sent != other:
                raise AssertionError(f"sar bytes depend on prefetch ({ds}/{method} {model_name})")
    comm.barrier()
    if comm.rank == 0:
        if checked != expected_cases(n):
            raise AssertionError(f"checked {checked} cases, expected {expected_cases(n)}")
        print(f"engine_equivalence: {n} ranks, {checked} cases per rank OK "
              f"(setup {t_setup:.1f} s, total {time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
