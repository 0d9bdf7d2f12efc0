"""``AttentionPattern``: which tokens a graph transformer's sparse attention lets each token attend to.

TorchGT's topology-induced pattern with its three expressiveness conditions met by
construction (not checked after the fact):

* C1, every token attends to itself: a self loop on every row;
* C2, a Hamiltonian path through the sequence: consecutive tokens of the sequence
  order attend to each other (the "chain"), whatever the graph's edges are;
* C3, every token can reach every other within the layers: the chain already gives
  that after S - 1 layers, and the optional **global token** (one extra token, last
  in the sequence, attending to and attended by every node) after 2.

Plus the graph's edges themselves (row ``i`` lists the in-neighbours ``j -> i``). Every
entry carries a **code**, the bucket of the structural bias (Graphormer's shortest-path
distance, capped): :data:`SELF` 0, :data:`HOP1` 1, :data:`HOP2` 2 (a chain pair with a
common neighbour), :data:`FAR` 3 (3+ hops or unreachable; also every pair outside the
pattern in dense attention), :data:`GLOBAL` 4 (to or from the global token).
:data:`NUM_CODES` = 5 rows of a per-head bias table.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpc_graph.ops.csr import CSR

SELF, HOP1, HOP2, FAR, GLOBAL = 0, 1, 2, 3, 4
NUM_CODES = 5


@dataclass
class AttentionPattern:
    """A sparse attention pattern over ``num_tokens = num_nodes (+ 1 global token)`` tokens.

    Attributes:
        csr: CSR with ``num_tokens`` rows and columns; row ``t`` lists (ascending) the tokens ``t`` attends to.
        codes: uint8[E] bias bucket of each entry (:data:`SELF` ... :data:`GLOBAL`), in ``csr`` order (1 byte
            per entry; index a bias table with ``codes.long()`` or :func:`code_bias`).
        num_nodes: node tokens (the global token, if any, is token ``num_nodes``).
        global_token: whether the last token is the global one.
        order: int64[num_nodes] the sequence order the chain follows (``order[t]`` is the t-th node).
    """

    csr: CSR
    codes: torch.Tensor
    num_nodes: int
    global_token: bool
    order: np.ndarray

    @property
    def num_tokens(self) -> int:
        return self.num_nodes + int(self.global_token)

    def entries_per_code(self) -> list[int]:
        """How many entries fall in each bias bucket (``NUM_CODES`` counts)."""
        return np.bincount(self.codes.numpy(), minlength=NUM_CODES).tolist()


def build_pattern(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, *, global_token: bool = True,
                  order: np.ndarray | None = None) -> AttentionPattern:
    """The sparse pattern of a graph: self loops + edges + the chain through ``order`` + the global token.

    Args:
        indptr: int[num_nodes + 1], indices: int[E]: the graph as a CSR over destinations.
        num_nodes: nodes N.
        global_token: add token N, attending to and attended by every node (and itself).
        order: a permutation of ``range(N)``, the sequence order (default: node id order).
    Returns:
        the :class:`AttentionPattern` (entries deduplicated; an edge that is also a chain pair is one entry, code 1).
    Raises:
        ValueError: inconsistent arrays or an ``order`` that is not a permutation.
    """
    from numba_kernels.cpu.pattern import attention_pattern, is_sorted_rows

    n = int(num_nodes)
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if indptr.shape != (n + 1,) or indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        raise ValueError(f"build_pattern: indptr must have num_nodes + 1 = {n + 1} entries from 0 to "
                         f"len(indices) = {indices.shape[0]}")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise ValueError(f"build_pattern: indices out of range [0, {n})")
    if order is None:
        order = np.arange(n, dtype=np.int64)
    else:
        order = np.asarray(order, dtype=np.int64)
        if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
            raise ValueError(f"build_pattern: order must be a permutation of range({n})")
    if not is_sorted_rows(indptr, indices):  # the hop test needs ascending rows
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        indices = indices[np.lexsort((indices, dst))]
    rowptr, cols, codes = attention_pattern(indptr, indices, order, global_token)
    csr = CSR(torch.from_numpy(rowptr), torch.from_numpy(cols), n + int(global_token), validate=False)
    return AttentionPattern(csr, torch.from_numpy(codes), n, bool(global_token), order)


#: sequence orders of :func:`sequence_order` (``engine.sequence_order``)
ORDERS = ("id", "rcm", "metis")


def sequence_order(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, method: str = "id",
                   cluster_size: int = 256, seed: int = 0) -> np.ndarray:
    """int64[N]: the order of the nodes in the transformer's sequence (``order[t]`` is the t-th node).

    ``id``: node id order. ``rcm``: reverse Cuthill-McKee of the undirected graph (neighbours end
    up close in the sequence, so the chain links nearby nodes). ``metis``: METIS clusters of about
    ``cluster_size`` nodes one after the other (TorchGT's cluster-aware sequences), node id order
    inside a cluster. The chain of the attention pattern follows this order, and ``seqpar`` gives
    each rank a contiguous piece of it.
    """
    n = int(num_nodes)
    if method not in ORDERS:
        raise ValueError(f"engine.sequence_order: must be one of {', '.join(map(repr, ORDERS))}, got {method!r}")
    if method == "id" or n <= 1:
        return np.arange(n, dtype=np.int64)
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if method == "rcm":
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import reverse_cuthill_mckee

        a = csr_matrix((np.ones(indices.shape[0], dtype=np.int8), indices, indptr), shape=(n, n))
        a = (a + a.T).tocsr()
        return np.asarray(reverse_cuthill_mckee(a, symmetric_mode=True), dtype=np.int64)
    from data_io.partitioner import assign_parts

    parts = assign_parts(indptr, indices, max(1, min(n, -(-n // int(cluster_size)))), method="metis", seed=seed)
    return np.argsort(parts, kind="stable").astype(np.int64)



def check_attention_args(mode: str, bias: torch.Tensor | None, heads: int) -> None:
    """``ValueError`` for a mode other than sparse/dense or a bias table that is not float[NUM_CODES, heads]."""
    if mode not in ("sparse", "dense"):
        raise ValueError(f"attention: mode must be 'sparse' or 'dense', got {mode!r}")
    if bias is not None and (bias.dim() != 2 or bias.shape[0] != NUM_CODES or bias.shape[1] != heads):
        raise ValueError(f"attention: bias must be [NUM_CODES={NUM_CODES}, heads={heads}], got {tuple(bias.shape)}")


def attend(pattern: AttentionPattern, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
           bias: torch.Tensor | None = None, mode: str = "sparse") -> torch.Tensor:
    """Attention of all ``pattern.num_tokens`` tokens (q, k, v float[T, H, d]) for an engine holding the whole
    sequence: the bias table float[NUM_CODES, H] gathered by the entries' codes, the ``FAR`` row for the pairs
    outside the pattern in dense mode (:func:`~hpc_graph.ops.graph_attention.pattern_attention`).
    ``mode`` and ``bias`` as checked by :func:`check_attention_args`."""
    from hpc_graph.ops.graph_attention import code_bias, pattern_attention

    check_attention_args(mode, bias, q.shape[1])
    dense = mode == "dense"
    csr = pattern.csr if pattern.csr.device == q.device else pattern.csr.to(q.device)
    return pattern_attention(csr, q, k, v, bias=None if bias is None else code_bias(bias, pattern.codes.to(q.device)),
                             dense=dense, num_nodes=pattern.num_nodes,
                             far_bias=bias[FAR] if (dense and bias is not None) else None)
