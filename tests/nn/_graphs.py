"""Test helpers for layer tests: random graphs and a dense plain-torch GraphContext reference."""
from __future__ import annotations

import numpy as np
import torch

from hpc_graph.graph.base import GraphContext


def random_edges(n: int, e: int, seed: int, isolated: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``e`` distinct random edges ``src -> dst`` without self loops; the last ``isolated`` nodes get no in-edges."""
    rng = np.random.default_rng(seed)
    pairs = set()
    while len(pairs) < e:
        s, d = (int(v) for v in rng.integers(0, n, 2))
        if s != d and d < n - isolated:
            pairs.add((s, d))
    arr = np.array(sorted(pairs), dtype=np.int64)
    return arr[:, 0], arr[:, 1]


def dense_adjacency(src, dst, n: int, dtype=torch.float64) -> torch.Tensor:
    """A[dst, src] = number of edges src -> dst."""
    a = torch.zeros(n, n, dtype=dtype)
    a.index_put_((torch.as_tensor(dst), torch.as_tensor(src)), torch.ones(len(src), dtype=dtype), accumulate=True)
    return a


class DenseGraph(GraphContext):
    """Whole graph as a dense adjacency matrix; every method is plain torch (the reference)."""

    def __init__(self, src, dst, n: int, dtype=torch.float64):
        self.num_nodes = self.global_num_nodes = n
        self.adj = dense_adjacency(src, dst, n, dtype)

    def aggregate(self, x, reduce="sum"):
        out = self.adj.to(x.dtype) @ x
        if reduce == "mean":
            out = out / self.adj.sum(1).clamp_min(1).to(x.dtype)[:, None]
        return out

    def gat(self, z, s_src, s_dst, *, negative_slope=0.2, attn_dropout=0.0, seed=0, add_self_loops=True):
        assert attn_dropout == 0.0, "the dense reference has no attention dropout"
        a = self.adj.to(z.dtype)
        if add_self_loops:
            a = a + torch.eye(self.num_nodes, dtype=z.dtype)
        logits = torch.nn.functional.leaky_relu(s_dst[:, None, :] + s_src[None, :, :], negative_slope)  # [i, j, h]
        logits = logits.masked_fill((a == 0)[:, :, None], float("-inf"))
        w = torch.exp(logits - logits.amax(1, keepdim=True).clamp_min(-1e300)) * a[:, :, None]
        w = torch.nan_to_num(w / w.sum(1, keepdim=True), nan=0.0)
        return torch.einsum("ijh,jhd->ihd", w, z)

    def in_degree(self):
        return self.adj.sum(1).to(torch.int64)

    def global_ids(self):
        return torch.arange(self.num_nodes)

    def all_reduce_sum(self, t):
        return t
