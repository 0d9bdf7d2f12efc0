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
"""
from __future__ import annotations

import warnings

import torch
from torch.nn import functional as F

from hpc_graph.nn._linear import share_transpose_plan

_LEVELS = 1 << 16


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Zero each element of ``x`` with probability ~``p`` and rescale the rest (identity unless training)."""
    if not training or p <= 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    if x.layout == torch.sparse_csr:
        values = dropout(x.values().detach(), p, True)
        with warnings.catch_warnings():  # torch's one-time "sparse CSR support is in beta" notice
            warnings.simplefilter("ignore", UserWarning)
            out = torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), values, x.shape,
                                          check_invariants=False)
        return share_transpose_plan(x, out)
    if x.dtype not in (torch.float32, torch.float64):
        return F.dropout(x, p, True)
    from hpc_graph.ops.dropout import dropout as fused

    return fused(x, p)
