"""Sampled blocks as GraphContexts: aggregation semantics, attention and prefix rows against torch references."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_graph.comm import get_communicator
from hpc_graph.graph.block import Block, BlockStack
from hpc_graph.ops.csr import CSR


def _block(seed=0, num_dst=7, num_src=15, fanout=4, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    indptr, cols = [0], []
    for i in range(num_dst):
        k = int(rng.integers(0, fanout + 1))
        cols += rng.choice(num_src, k, replace=False).tolist()
        indptr.append(len(cols))
    degree = rng.integers(fanout, 3 * fanout, num_src)  # full-graph in-degrees >= sampled counts
    csr = CSR(torch.tensor(indptr), torch.tensor(cols, dtype=torch.int64), num_src)
    gid = torch.from_numpy(rng.permutation(1000)[:num_src].astype(np.int64))
    return Block(csr, gid, gid, torch.from_numpy(degree), get_communicator("local")), np.array(indptr), \
        np.array(cols), degree


@pytest.mark.parametrize("seed", range(5))
def test_mean_is_over_the_sampled_edges_and_sum_is_rescaled_to_the_full_degree(seed):
    b, indptr, cols, degree = _block(seed)
    x = torch.randn(b.num_src, 3, dtype=torch.float64)
    mean, total = b.aggregate(x, "mean"), b.aggregate(x, "sum")
    for i in range(b.num_nodes):
        nb = cols[indptr[i]:indptr[i + 1]]
        if len(nb) == 0:
            assert torch.all(mean[i] == 0) and torch.all(total[i] == 0)
            continue
        torch.testing.assert_close(mean[i], x[nb].mean(0))
        torch.testing.assert_close(total[i], x[nb].sum(0) * degree[i] / len(nb))


def test_all_neighbours_sampled_gives_the_plain_sum():
    b, indptr, cols, _ = _block(3)
    full = torch.from_numpy(np.diff(indptr)).to(torch.int64)
    exact = Block(b.csr, b.src_gid, b.src_orig_id, torch.cat([full, b.src_degree[b.num_nodes:]]),
                  get_communicator("local"))
    x = torch.randn(b.num_src, 2, dtype=torch.float64)
    want = torch.zeros(b.num_nodes, 2, dtype=torch.float64).index_add_(
        0, torch.from_numpy(np.repeat(np.arange(b.num_nodes), np.diff(indptr))), x[cols])
    torch.testing.assert_close(exact.aggregate(x, "sum"), want)


def test_gat_is_softmax_over_sampled_edges_and_the_self_loop():
    b, indptr, cols, _ = _block(4)
    heads, dim = 2, 3
    z = torch.randn(b.num_src, heads, dim, dtype=torch.float64)
    s_src = torch.randn(b.num_src, heads, dtype=torch.float64)
    s_dst = torch.randn(b.num_nodes, heads, dtype=torch.float64)
    out = b.gat(z, s_src, s_dst)
    for i in range(b.num_nodes):
        nb = list(cols[indptr[i]:indptr[i + 1]]) + [i]  # the destination is source i (prefix)
        logits = torch.nn.functional.leaky_relu(s_dst[i] + s_src[nb], 0.2)  # [k, H]
        a = torch.softmax(logits, 0)
        torch.testing.assert_close(out[i], (a.unsqueeze(2) * z[nb]).sum(0))


def test_dst_is_the_prefix_for_dense_and_sparse_rows():
    b, *_ = _block(5)
    x = torch.randn(b.num_src, 4)
    assert torch.equal(b.dst(x), x[:b.num_nodes])
    x[x.abs() < 0.8] = 0
    sp = b.dst(x.to_sparse_csr())
    assert sp.layout == torch.sparse_csr and torch.equal(sp.to_dense(), x[:b.num_nodes])
    assert torch.equal(b.in_degree(), b.src_degree) and torch.equal(b.global_ids(), b.src_gid[:b.num_nodes])


def test_stack_hands_out_one_block_per_layer_and_refuses_whole_graph_calls():
    b0, *_ = _block(6)
    b1, *_ = _block(7)
    stack = BlockStack([b0, b1])
    assert stack.layer(0) is b0 and stack.layer(1) is b1 and stack.num_nodes == b1.num_nodes
    with pytest.raises(ValueError, match="fanouts"):
        stack.layer(2)
    with pytest.raises(RuntimeError, match="graph.layer"):
        stack.aggregate(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="rows"):
        b0.aggregate(torch.zeros(b0.num_src + 1, 2))


def test_a_moved_block_aggregates_as_the_original_and_shares_no_tensors():
    """``Block.to``/``BlockStack.to`` (how the trainer moves a sampled batch to the model's device): same
    results, new tensors for the structure, ids, degrees and scales (the move is exercised on the GPU in
    tests/gpu; here onto the CPU, which still copies nothing it should not)."""
    b, *_ = _block(3)
    stack = BlockStack([b, _block(4, num_dst=3, num_src=7)[0]])
    moved = stack.to("cpu")
    assert isinstance(moved, BlockStack) and moved is not stack and len(moved.blocks) == 2
    mb = moved.layer(0)
    x = torch.randn(b.num_src, 3, dtype=torch.float64)
    for reduce in ("sum", "mean"):
        torch.testing.assert_close(mb.aggregate(x, reduce), b.aggregate(x, reduce))
    assert mb.csr is not b.csr and mb.src_degree.device == torch.device("cpu")
    torch.testing.assert_close(mb.global_ids(), b.global_ids())


def test_a_batch_built_on_the_device_is_not_copied_and_other_contexts_refuse_to_move():
    from hpc_graph.engines.base import Batch
    from hpc_graph.graph.whole_graph import WholeGraph

    b, *_ = _block(5)
    batch = Batch(BlockStack([b]), torch.zeros(b.num_src, 2), torch.zeros(b.num_nodes, dtype=torch.int64),
                  torch.arange(b.num_nodes))
    assert batch.to("cpu") is batch
    g = WholeGraph(CSR(torch.tensor([0, 1, 1]), torch.tensor([1]), 2))
    with pytest.raises(NotImplementedError, match="WholeGraph cannot be moved"):
        g.to("cuda")
