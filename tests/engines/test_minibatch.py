"""``minibatch`` on one process: blocks with all neighbours reproduce the full graph; sampling properties;
options. Multi-rank behaviour (exact / drop / hec, pushes, bytes) is in tests/mpi/test_minibatch.py."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data_io.dataset import GraphData, write_dataset
from hpc_graph.comm import get_communicator
from hpc_graph.engines import create_engine
from hpc_graph.nn import build_model


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    n, e = 120, 700
    w = 1.0 / np.arange(1, n + 1) ** 0.7  # skewed degrees, a few hubs
    src = rng.choice(n, e, p=w / w.sum())
    dst = rng.integers(0, n, e)
    pairs = np.unique(np.stack([dst, src], 1), axis=0)  # self loops allowed, no duplicates
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=indptr[1:])
    split = rng.random(n)
    path = tmp_path_factory.mktemp("mb") / "g.h5"
    write_dataset(path, GraphData(indptr=indptr, indices=pairs[:, 1].astype(np.int64),
                                  feat=rng.standard_normal((n, 6)).astype(np.float32),
                                  label=rng.integers(0, 3, n).astype(np.int64), train_mask=split < 0.5,
                                  val_mask=split >= 0.5, test_mask=split >= 0.8, name="mb", num_classes=3,
                                  directed=True))
    return str(path), indptr, pairs[:, 1]


def _engines(path, fanouts, batch_size=16, **opts):
    local = get_communicator("local")
    single = create_engine("single", path, local, torch.device("cpu"), torch.float64)
    mb = create_engine("minibatch", path, local, torch.device("cpu"), torch.float64,
                       {"fanouts": tuple(fanouts), "batch_size": batch_size, "mode": "exact", **opts})
    return single, mb


# build_model arguments; one block per message-passing layer of each model
_ALL_NEIGHBOURS = {
    "gcn": ("gcn", {"num_layers": 3, "heads": 2}), "sage": ("sage", {"num_layers": 3, "heads": 2}),
    "gat": ("gat", {"num_layers": 3, "heads": 2}),
    "gcn2": ("gcn2", {"num_layers": 4, "alpha": 0.2, "theta": 0.7}),
    "jknet-concat-gcn": ("jknet", {"num_layers": 3, "jk": "concat"}),
    "jknet-max-sage": ("jknet", {"num_layers": 2, "jk": "max", "conv": "sage"}),
    "jknet-attention-gcn": ("jknet", {"num_layers": 3, "jk": "attention"}),
    "appnp": ("appnp", {"hops": 3, "alpha": 0.2}), "sgc": ("sgc", {"hops": 2}),
    "dagnn": ("dagnn", {"hops": 3}),
}


@pytest.mark.parametrize("model_name", list(_ALL_NEIGHBOURS))
def test_all_neighbours_give_the_full_graph_rows_loss_and_gradients(graph_file, model_name):
    path, *_ = graph_file
    torch.manual_seed(3)
    name, kwargs = _ALL_NEIGHBOURS[model_name]
    model = build_model(name, 6, 5, 3, dropout=0.0, **kwargs).double()
    single, mb = _engines(path, [-1] * model.message_passing_layers)
    twin = copy.deepcopy(model)
    full = model(single.graph, single.feat)
    mb.begin_epoch(1)
    for it in range(mb.iterations(1)):
        batch = mb.batch(1, it)
        out = twin(batch.graph, batch.feat)
        seeds = batch.seeds
        torch.testing.assert_close(out, full[seeds], rtol=1e-10, atol=1e-10)
        # the batch's loss and gradients are those of full-batch training on these seeds
        twin.zero_grad()
        model.zero_grad()
        F.cross_entropy(out, batch.label, reduction="sum").backward()
        F.cross_entropy(model(single.graph, single.feat)[seeds], single.label[seeds], reduction="sum").backward()
        for (name, p), q in zip(twin.named_parameters(), model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-11, msg=name)


def test_blocks_sample_exactly_min_fanout_degree_distinct_real_neighbours(graph_file):
    path, indptr, indices = graph_file
    _, mb = _engines(path, [4, 3], batch_size=20)
    mb.begin_epoch(2)
    batch = mb.batch(2, 0)
    for block in batch.graph.blocks:
        gid = block.src_gid.numpy()
        bi, bc = block.csr.indptr.numpy(), block.csr.indices.numpy()
        fanout = 4 if block is batch.graph.blocks[-1] else 3
        for i in range(block.num_nodes):
            v = gid[i]
            nbrs = gid[bc[bi[i]:bi[i + 1]]]
            true = indices[indptr[v]:indptr[v + 1]]
            assert len(nbrs) == min(fanout, len(true))
            assert len(set(nbrs.tolist())) == len(nbrs) and set(nbrs.tolist()) <= set(true.tolist())
    # destinations first: the output layer's are the seeds, in the batch's order; the input layer's are the next
    # layer's sources, in order
    b0, b1 = batch.graph.blocks
    assert np.array_equal(b1.src_gid[:b1.num_nodes].numpy(), (batch.seeds + mb.first).numpy())
    assert np.array_equal(b0.src_gid[:b0.num_nodes].numpy(), b1.src_gid.numpy())


def test_a_node_gets_the_same_sample_in_every_batch_of_an_epoch(graph_file):
    path, *_ = graph_file
    _, mb = _engines(path, [3], batch_size=8)
    samples: dict[int, set] = {}
    for epoch in (5, 5):  # the same epoch twice: identical
        mb.begin_epoch(epoch)
        for it in range(mb.iterations(epoch)):
            b = mb.batch(epoch, it).graph.blocks[0]
            gid, bi, bc = b.src_gid.numpy(), b.csr.indptr.numpy(), b.csr.indices.numpy()
            for i in range(b.num_nodes):
                got = set(gid[bc[bi[i]:bi[i + 1]]].tolist())
                assert samples.setdefault(int(gid[i]), got) == got
    mb.begin_epoch(6)  # another epoch draws again: some node's sample changes
    changed = False
    for it in range(mb.iterations(6)):
        b = mb.batch(6, it).graph.blocks[0]
        gid, bi, bc = b.src_gid.numpy(), b.csr.indptr.numpy(), b.csr.indices.numpy()
        changed |= any(set(gid[bc[bi[i]:bi[i + 1]]].tolist()) != samples[int(gid[i])] for i in range(b.num_nodes))
    assert changed


def test_every_training_node_is_a_seed_once_per_epoch(graph_file):
    path, *_ = graph_file
    _, mb = _engines(path, [2], batch_size=7)
    mb.begin_epoch(1)
    seeds = torch.cat([mb.batch(1, it).seeds for it in range(mb.iterations(1))])
    assert sorted(seeds.tolist()) == sorted(mb.train_idx.tolist())


@pytest.mark.parametrize("options,named", [({"fanouts": (3, 0)}, "sampler.fanouts"),
                                           ({"fanouts": ()}, "sampler.fanouts"),
                                           ({"batch_size": 0}, "sampler.batch_size"),
                                           ({"mode": "sometimes"}, "hec.mode"),
                                           ({"delay": 0}, "hec.delay"),
                                           ({"push_limit": -1}, "hec.push_limit")])
def test_bad_options_are_named(graph_file, options, named):
    path, *_ = graph_file
    with pytest.raises(ValueError, match=named):
        create_engine("minibatch", path, get_communicator("local"), torch.device("cpu"), torch.float32,
                      {"fanouts": (2,), **options})


def test_push_packing_handles_empty_and_single_rows():
    # a push to a peer may hold no row (or one): such tensors can carry stride 0, which a dtype view refuses
    from hpc_graph.engines.minibatch import _as_bytes

    rng = np.random.default_rng(0)
    gids = rng.integers(0, 1000, 5)
    rows = torch.from_numpy(rng.standard_normal((5, 3)).astype(np.float32))
    for cand in (np.zeros(0, np.int64), np.array([3]), np.array([0, 2, 4])):
        g = torch.from_numpy(gids[cand].astype(np.int64))
        packed = _as_bytes(g, rows[torch.from_numpy(cand)])
        assert packed.dtype == torch.uint8 and packed.numel() == cand.size * (8 + 3 * 4)
        back_g = packed[:8 * cand.size].view(torch.int64) if cand.size else torch.zeros(0, dtype=torch.int64)
        assert np.array_equal(back_g.numpy(), gids[cand])
        back_rows = packed[8 * cand.size:].view(torch.float32).reshape(-1, 3) if cand.size else rows[:0]
        assert torch.equal(back_rows, rows[torch.from_numpy(cand)])


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_mlp_on_sampled_batches_gives_the_seeds_rows(graph_file, layout):
    """``mlp`` reads no graph: on a sampled batch its output is the seeds' rows (the first rows of the input),
    equal to the full-graph rows of those nodes, dense or sparse CSR input."""
    path, *_ = graph_file
    torch.manual_seed(4)
    model = build_model("mlp", 6, 5, 3, num_layers=2, dropout=0.0).double()
    single, mb = _engines(path, [2, 2])
    full = model(single.graph, single.feat)
    mb.begin_epoch(0)
    for it in range(mb.iterations(0)):
        batch = mb.batch(0, it)
        x = batch.feat if layout == "dense" else batch.feat.to_sparse_csr()
        out = model(batch.graph, x)
        assert out.shape[0] == batch.seeds.numel() < batch.feat.shape[0]
        torch.testing.assert_close(out, full[batch.seeds], rtol=1e-12, atol=1e-12)


def test_push_choice_is_weighted_by_degree():
    """``hec``'s push cap keeps ``k`` of the candidates drawn by degree: one draw follows w / sum(w) (chi-square),
    and ``k`` draws include each node as often as ``k`` successive weighted draws without replacement do."""
    from scipy.stats import chisquare

    from hpc_graph.engines.minibatch import weighted_choice

    rng = np.random.default_rng(3)
    w = rng.integers(1, 30, 12).astype(np.float64)
    draws = 40_000
    ones = np.bincount([int(weighted_choice(w, 1, rng)[0]) for _ in range(draws)], minlength=w.size)
    assert chisquare(ones, draws * w / w.sum()).pvalue > 1e-4
    # k = 4: inclusion counts against those of numpy's successive draws (two samples of one law)
    k, ref = 4, np.random.default_rng(4)
    ours = np.zeros(w.size)
    theirs = np.zeros(w.size)
    for _ in range(draws // 4):
        got = weighted_choice(w, k, rng)
        assert got.size == k and np.unique(got).size == k and np.all(np.diff(got) > 0)
        ours[got] += 1
        theirs[ref.choice(w.size, k, replace=False, p=w / w.sum())] += 1
    table = np.stack([ours, theirs])
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    from scipy.stats import chi2
    assert chi2.sf(stat, w.size - 1) > 1e-4
    # degenerate caps
    assert weighted_choice(w, 0, rng).size == 0 and np.array_equal(weighted_choice(w, 99, rng), np.arange(w.size))
    # a uniform law would be refused: the heaviest node is drawn far more often than the lightest
    assert ones[np.argmax(w)] > 3 * ones[np.argmin(w)]
