"""The `sar` engine on one rank (LocalCommunicator): GAT layers rematerialise their projection.

Multi-rank equivalence with `single` is in tests/mpi/test_engines.py; here the single-process
case pins down what the fused ``gat_projected`` keeps for the backward pass.
"""
import numpy as np
import torch

from data_io.dataset import GraphData, write_dataset
from data_io.partitioner import partition_dataset
from hpc_graph.comm.local import LocalCommunicator
from hpc_graph.engines import create_engine
from hpc_graph.nn.models import build_model


def _graph(n=60, e=300, f=8, c=3, seed=0) -> GraphData:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    g = GraphData(indptr=indptr, indices=src[order].astype(np.int64),
                  feat=rng.standard_normal((n, f)).astype(np.float32),
                  label=rng.integers(0, c, n).astype(np.int64), num_classes=c, name="rand")
    g.train_mask = rng.random(n) < 0.5
    return g


def _saved_bytes(model, eng) -> tuple[int, torch.Tensor]:
    """Bytes of the distinct storages autograd keeps for the backward pass, and the output."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(eng.graph, eng.feat)
    return sum(storages.values()), out


def test_fused_gat_keeps_no_projection_and_matches_dp(tmp_path):
    """``single`` and ``sar`` run a GAT layer as one op keeping only its input; ``dp`` (the graph's default
    gat_projected, step by step with autograd) keeps z and the activation's copies. Same values and grads."""
    g = _graph()
    write_dataset(tmp_path / "g.h5", g)
    partition_dataset(tmp_path / "g.h5", tmp_path / "p1", 1, "random")
    comm = LocalCommunicator()
    single = create_engine("single", str(tmp_path / "g.h5"), comm, torch.device("cpu"), torch.float64)
    sar = create_engine("sar", str(tmp_path / "p1"), comm, torch.device("cpu"), torch.float64)
    dp = create_engine("dp", str(tmp_path / "p1"), comm, torch.device("cpu"), torch.float64)
    heads, hidden, layers = 2, 4, 3
    torch.manual_seed(0)
    ref = build_model("gat", 8, hidden, 3, num_layers=layers, dropout=0.0, heads=heads, out_heads=1).double()
    models = []
    for _ in range(2):
        m = build_model("gat", 8, hidden, 3, num_layers=layers, dropout=0.0, heads=heads, out_heads=1).double()
        m.load_state_dict(ref.state_dict())
        models.append(m.train())
    ref.train()

    kept_ref, out_ref = _saved_bytes(ref, dp)
    kept_single, out_single = _saved_bytes(models[0], single)
    kept_sar, out_sar = _saved_bytes(models[1], sar)
    # the random partition relabels nodes: compare rows by source-dataset id
    orig = sar.graph.dg.orig_id
    torch.testing.assert_close(out_sar, out_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_single[orig], out_ref, rtol=1e-10, atol=1e-10)
    # every GAT layer's z (N x H x D, float64) is recomputed in the backward pass instead of kept, and so is
    # the ELU's output (the next layer's input)
    n = g.num_nodes
    z_bytes = 8 * n * (heads * hidden * (layers - 1) + 1 * 3)
    elu_bytes = 8 * n * heads * hidden * (layers - 1)
    for kept in (kept_single, kept_sar):
        assert kept <= kept_ref - z_bytes - elu_bytes, (kept, kept_ref, z_bytes, elu_bytes)

    w = torch.randn_like(out_ref)
    (out_ref * w).sum().backward()
    (out_sar * w).sum().backward()
    inv = torch.empty_like(orig)
    inv[orig] = torch.arange(len(orig))
    (out_single * w[inv]).sum().backward()
    for model in models:
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_graph_transformers_refuse_self_loop_and_repeated_edges_on_partial_engines(tmp_path):
    """dp, sar and sylvie hold part of the graph; a graph transformer's sparse attention adds every self loop
    itself and holds each edge once (as single's pattern does), so a dataset with self-loop or repeated edges
    is refused by check_model (before training), naming the count; message-passing models and a graph
    without them pass."""
    import pytest

    def write(name, rows, cols):
        g = _graph(seed=4)
        order = np.argsort(rows, kind="stable")
        g.indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=60)))).astype(np.int64)
        g.indices = cols[order].astype(np.int64)
        write_dataset(tmp_path / f"{name}.h5", g)
        partition_dataset(tmp_path / f"{name}.h5", tmp_path / name, 1, "random")
        return tmp_path / name

    g = _graph(seed=4)
    rows = np.repeat(np.arange(60), np.diff(g.indptr))
    pairs = np.unique(np.stack([rows, g.indices]), axis=1)
    pairs = pairs[:, pairs[0] != pairs[1]]  # distinct, no self loops
    loops, repeats = 7, 5
    clean = write("clean", pairs[0], pairs[1])
    looped = write("looped", np.concatenate([pairs[0], np.arange(loops)]), np.concatenate([pairs[1], np.arange(loops)]))
    repeated = write("repeated", np.concatenate([pairs[0], pairs[0, :repeats]]),
                     np.concatenate([pairs[1], pairs[1, :repeats]]))
    comm = LocalCommunicator()
    gt = build_model("gt", 8, 8, 3, num_layers=1, heads=2, pe_dim=0, dropout=0.0).double()
    gcn = build_model("gcn", 8, 8, 3).double()
    for name in ("dp", "sar", "sylvie"):
        def engine(path):
            return create_engine(name, str(path), comm, torch.device("cpu"), torch.float64)
        with pytest.raises(ValueError, match=f"on engine '{name}': the graph has {loops} self-loop edge"):
            engine(looped).check_model(gt)
        with pytest.raises(ValueError, match=f"on engine '{name}': the graph has {repeats} repeated edge.*--dedup"):
            engine(repeated).check_model(gt)
        engine(repeated).check_model(gcn)
        engine(clean).check_model(gt)
