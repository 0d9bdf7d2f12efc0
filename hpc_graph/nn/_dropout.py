"""Feature dropout with a cheap counter-based mask (private to the models).

``torch.nn.functional.dropout`` on the CPU draws one Bernoulli variate per
element from the Mersenne twister and keeps the mask for the backward pass.
Here (:mod:`hpc_graph.ops.dropout`) one kernel pass hashes (key, element
index) into four 16-bit uniforms per 64-bit hash; an element is kept when its
uniform is at least ``round(p * 65536)``, i.e. with probability
``keep = 1 - round(p * 65536) / 65536`` (within 2^-17 of ``1 - p``), and kept
values are scaled by ``1 / keep`` so the expectation is exact. The backward
pass redraws the mask from the key: nothing N x F is stored. The key comes
from torch's default generator, so ``torch.manual_seed`` makes runs
reproducible; CPU and CUDA twins drop the same elements.

A sparse CSR input (bag-of-words features, see ``data.feature_layout``) has
only its stored values dropped: the same distribution as dense dropout, since
zeros stay zero, at the cost of nnz instead of N*F draws. Sparse inputs are
treated as constants (input features): no gradient flows to them.

``ids`` (the rows' dataset ids, ``GraphContext.row_ids``) key each row's mask
on its node, not its position: a rank holding some of the rows drops what one
process holding all of them drops. A stored value of a sparse row is keyed on
its (row id, column) (ids or not), so it is dropped exactly when the same
element of the dense matrix would be.
"""
from __future__ import annotations

import warnings

import torch
from torch.nn import functional as F

from hpc_graph.nn._csr_plan import share_transpose_plan

_LEVELS = 1 << 16


def dropout(x: torch.Tensor, p: float, training: bool, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Zero each element of ``x`` float[N, ...] with probability ~``p`` and rescale the rest (identity unless
    training); ``ids`` int64[N]: the rows' dataset ids keying the mask, or None (the rows' positions)."""
    if not training or p <= 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    if x.layout == torch.sparse_csr:  # each stored value keyed on its dense position id * F + column
        crow = x.crow_indices()
        ids = torch.arange(x.shape[0], device=crow.device) if ids is None else ids.to(crow.device, torch.int64)
        vids = torch.repeat_interleave(ids, crow[1:] - crow[:-1]) * int(x.shape[1]) + x.col_indices().to(torch.int64)
        values = dropout(x.values().detach(), p, True, vids)
        with warnings.catch_warnings():  # torch's one-time "sparse CSR support is in beta" notice
            warnings.simplefilter("ignore", UserWarning)
            out = torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), values, x.shape,
                                          check_invariants=False)
        return share_transpose_plan(x, out)
    if x.dtype not in (torch.float32, torch.float64):
        return F.dropout(x, p, True)
    from hpc_graph.ops.dropout import dropout as fused

    return fused(x, p, ids)
