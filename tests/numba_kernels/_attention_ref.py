"""Test helpers for the attention kernels and ops: awkward random graphs, the
dropout hash in plain NumPy, materialised torch references and block splits.

Imported by tests/numba_kernels/test_*attention*.py and tests/ops/test_*attention.py.
"""
from __future__ import annotations

import numpy as np
import torch

from hpc_graph.ops.csr import CSR

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def awkward_graph(rng: np.random.Generator, num_dst: int, num_src: int, num_edges: int) -> CSR:
    """Random CSR with empty rows (every 5th destination), isolated sources (the last 3),
    self-loops, duplicate edges and one hub row (destination 1) holding ~40% of the edges."""
    assert num_dst > 5 and num_src > 5
    src = rng.integers(0, num_src - 3, num_edges)
    dst = rng.integers(0, num_dst, num_edges)
    dst[: 2 * num_edges // 5] = 1
    loops = np.arange(0, min(num_dst, num_src - 3))
    src = np.concatenate([src, loops, src[:7]])
    dst = np.concatenate([dst, loops, dst[:7]])  # self-loops and duplicated edges
    keep = dst % 5 != 0
    return CSR.from_edges(src[keep], dst[keep], num_dst, num_src)


def edge_dst(g: CSR) -> torch.Tensor:
    """int64[E]: destination row of every edge of ``g``."""
    return torch.repeat_interleave(torch.arange(g.num_dst), g.in_degree())


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def keep_mask(seed: int, dst_gid: np.ndarray, src_gid: np.ndarray, heads: int, p: float) -> np.ndarray:
    """bool[E, heads]: NumPy reference of the attention-dropout hash for edges ``src_gid -> dst_gid``."""
    with np.errstate(over="ignore"):
        s = _splitmix64(np.array([seed], dtype=np.uint64))
        hd = _splitmix64(s ^ np.asarray(dst_gid, dtype=np.uint64))
        he = _splitmix64(hd ^ np.asarray(src_gid, dtype=np.uint64))
        hh = _splitmix64(he[:, None] ^ np.arange(heads, dtype=np.uint64)[None, :])
    u = (hh >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0 ** 53)
    return u >= p


def _edge_softmax(scores: torch.Tensor, dst: torch.Tensor, num_dst: int) -> torch.Tensor:
    heads = scores.shape[1]
    mx = torch.full((num_dst, heads), float("-inf"), dtype=scores.dtype)
    mx = mx.scatter_reduce(0, dst[:, None].expand(-1, heads), scores, "amax")
    w = torch.exp(scores - mx[dst])
    den = torch.zeros(num_dst, heads, dtype=scores.dtype).index_add(0, dst, w)
    return w / den[dst]


def gat_reference(g: CSR, z, s_src, s_dst, slope: float = 0.2, p: float = 0.0, seed: int = 0,
                  src_gid=None, dst_gid=None) -> torch.Tensor:
    """Materialised GATv1 attention (differentiable by torch autograd)."""
    dst, src = edge_dst(g), g.indices
    alpha = _edge_softmax(torch.nn.functional.leaky_relu(s_dst[dst] + s_src[src], slope), dst, g.num_dst)
    if p > 0:
        sg = np.arange(g.num_src) if src_gid is None else np.asarray(src_gid)
        dg = np.arange(g.num_dst) if dst_gid is None else np.asarray(dst_gid)
        mask = torch.as_tensor(keep_mask(seed, dg[dst.numpy()], sg[src.numpy()], z.shape[1], p))
        alpha = alpha * mask.to(alpha.dtype) / (1.0 - p)
    out = torch.zeros(g.num_dst, z.shape[1], z.shape[2], dtype=z.dtype)
    return out.index_add(0, dst, alpha[:, :, None] * z[src])


def dot_reference(g: CSR, q, k, v, bias=None, scale=None) -> torch.Tensor:
    """Materialised dot-product edge attention (differentiable by torch autograd)."""
    dst, src = edge_dst(g), g.indices
    scale = q.shape[2] ** -0.5 if scale is None else scale
    scores = (q[dst] * k[src]).sum(-1) * scale
    if bias is not None:
        scores = scores + bias
    alpha = _edge_softmax(scores, dst, g.num_dst)
    out = torch.zeros(g.num_dst, v.shape[1], v.shape[2], dtype=v.dtype)
    return out.index_add(0, dst, alpha[:, :, None] * v[src])


def split_blocks(g: CSR, num_blocks: int):
    """Split the source columns of ``g`` into ``num_blocks`` contiguous ranges.

    Returns a list of ``(block CSR with block-local columns, first column, last column + 1,
    bool[E] mask of g's edges in the block)``; each block keeps g's edge order.
    """
    bounds = np.linspace(0, g.num_src, num_blocks + 1).round().astype(np.int64)
    dst = edge_dst(g)
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        mask = (g.indices >= int(lo)) & (g.indices < int(hi))
        indptr = torch.zeros(g.num_dst + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(dst[mask], minlength=g.num_dst), 0, out=indptr[1:])
        out.append((CSR(indptr, g.indices[mask] - int(lo), int(hi - lo)), int(lo), int(hi), mask))
    return out
