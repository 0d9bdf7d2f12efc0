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
distance, capped at ``max_dist``): ``0`` self, ``d`` for ``d <= max_dist`` hops, ``max_dist + 1``
farther (:func:`far_code`; also every pair outside the pattern in dense attention),
``max_dist + 2`` to or from a global token (:func:`global_code`), ``max_dist + 3`` unreachable
(:func:`unreachable_code`): :func:`num_codes` ``= max_dist + 4`` rows of a per-head bias table,
the model's ``model.max_spd`` choosing ``max_dist``. A graph's pattern knows distances up to 2
only (2 = a chain pair with a common neighbour; its "farther" bucket also holds the pairs that
are unreachable): :data:`SELF` 0, :data:`HOP1` 1, :data:`HOP2` 2, :data:`FAR` 3,
:data:`GLOBAL` 4 (:data:`NUM_CODES` = 6 with the unused unreachable row), remapped to a bias
table of another ``max_dist`` by :meth:`AttentionPattern.codes_for`.

**Graph batches** (graph-level tasks, many small graphs in one file, ``/graphs/ptr``):
:func:`build_graph_batch_pattern` gives every graph its own global token (token ``N + g``,
the graph's readout) and exact shortest-path codes (a BFS inside each graph); "dense"
attention there is every pair inside a graph (``full=True``), never across graphs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpc_graph.ops.csr import CSR

#: codes of a graph's pattern (``max_dist`` 2)
SELF, HOP1, HOP2, FAR, GLOBAL, UNREACHABLE = 0, 1, 2, 3, 4, 5
NUM_CODES = 6
#: ``max_dist`` of a whole graph's pattern (the node-level builder knows up to 2 hops)
GRAPH_MAX_DIST = 2


def num_codes(max_dist: int) -> int:
    """Rows of a bias table for distances capped at ``max_dist``: self, 1..max_dist, farther, global, unreachable."""
    return int(max_dist) + 4


def far_code(max_dist: int) -> int:
    return int(max_dist) + 1


def global_code(max_dist: int) -> int:
    return int(max_dist) + 2


def unreachable_code(max_dist: int) -> int:
    return int(max_dist) + 3


def max_dist_of(bias: torch.Tensor) -> int:
    """The ``max_dist`` a bias table float[num_codes, H] was made for."""
    return int(bias.shape[0]) - 4


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
        max_dist: the distance cap of ``codes`` (:data:`GRAPH_MAX_DIST` for a graph's pattern).
        graph_ptr: int64[G + 1] for a graph batch (graph ``g`` = nodes ``graph_ptr[g]:graph_ptr[g+1]``,
            its global token ``num_nodes + g``), else None.
        full: a graph batch's pattern of every pair inside each graph (its dense attention).
    """

    csr: CSR
    codes: torch.Tensor
    num_nodes: int
    global_token: bool
    order: np.ndarray
    max_dist: int = GRAPH_MAX_DIST
    graph_ptr: np.ndarray | None = None
    full: bool = False

    def __post_init__(self):
        self._codes_for: dict[int, torch.Tensor] = {self.max_dist: self.codes}

    @property
    def num_graphs(self) -> int:
        return 0 if self.graph_ptr is None else int(self.graph_ptr.shape[0] - 1)

    @property
    def num_tokens(self) -> int:
        return self.num_nodes + (self.num_graphs if self.graph_ptr is not None else int(self.global_token))

    def entries_per_code(self) -> list[int]:
        """How many entries fall in each bias bucket (``num_codes(max_dist)`` counts)."""
        return np.bincount(self.codes.numpy(), minlength=num_codes(self.max_dist)).tolist()

    def codes_for(self, max_dist: int) -> torch.Tensor:
        """uint8[E] the codes in the layout of a bias table for ``max_dist`` (distances this pattern
        did not resolve stay in the farther bucket); built once per ``max_dist``."""
        max_dist = int(max_dist)
        if max_dist not in self._codes_for:
            m = self.max_dist
            lut = np.empty(num_codes(m), dtype=np.uint8)
            for d in range(m + 1):
                lut[d] = d if d <= max_dist else far_code(max_dist)
            lut[far_code(m)] = far_code(max_dist)
            lut[global_code(m)] = global_code(max_dist)
            lut[unreachable_code(m)] = unreachable_code(max_dist)
            self._codes_for[max_dist] = torch.from_numpy(lut)[self.codes.long()]
        return self._codes_for[max_dist]


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
    """``ValueError`` for a mode other than sparse/dense or a bias table that is not
    float[num_codes(max_dist), heads] for some ``max_dist >= 0``."""
    if mode not in ("sparse", "dense"):
        raise ValueError(f"attention: mode must be 'sparse' or 'dense', got {mode!r}")
    if bias is not None and (bias.dim() != 2 or bias.shape[0] < num_codes(0) or bias.shape[1] != heads):
        raise ValueError(f"attention: bias must be [max_dist + 4, heads={heads}] (self, 1..max_dist hops, farther, "
                         f"global, unreachable), got {tuple(bias.shape)}")


def attend(pattern: AttentionPattern, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
           bias: torch.Tensor | None = None, mode: str = "sparse") -> torch.Tensor:
    """Attention of all ``pattern.num_tokens`` tokens (q, k, v float[T, H, d]) for an engine holding the whole
    sequence: the bias table float[max_dist + 4, H] gathered by the entries' codes
    (:meth:`AttentionPattern.codes_for`), the farther row for the pairs outside the pattern in dense mode
    (:func:`~hpc_graph.ops.graph_attention.pattern_attention`). A graph batch's pattern attends inside each
    graph only: pass its ``full`` pattern for dense attention (``mode`` must then be ``"sparse"``).
    ``mode`` and ``bias`` as checked by :func:`check_attention_args`."""
    from hpc_graph.ops.graph_attention import code_bias, pattern_attention

    check_attention_args(mode, bias, q.shape[1])
    dense = mode == "dense"
    if dense and pattern.graph_ptr is not None:
        raise ValueError("attention: a graph batch has no dense mode over the whole sequence; "
                         "attend over its full pattern (build_graph_batch_pattern(full=True))")
    csr = pattern.csr if pattern.csr.device == q.device else pattern.csr.to(q.device)
    m = None if bias is None else max_dist_of(bias)
    return pattern_attention(csr, q, k, v,
                             bias=None if bias is None else code_bias(bias, pattern.codes_for(m).to(q.device)),
                             dense=dense, num_nodes=pattern.num_nodes,
                             far_bias=bias[far_code(m)] if (dense and bias is not None) else None)


def check_graph_ptr(graph_ptr: np.ndarray, indptr: np.ndarray, indices: np.ndarray, where: str = "graph_ptr") -> None:
    """``ValueError`` unless ``graph_ptr`` int[G+1] splits the nodes into non-empty graphs with no edge between two."""
    n = int(indptr.shape[0] - 1)
    gp = np.asarray(graph_ptr)
    if gp.ndim != 1 or gp.shape[0] < 2 or gp[0] != 0 or gp[-1] != n:
        raise ValueError(f"{where}: must be G + 1 >= 2 offsets from 0 to num_nodes = {n}")
    if (np.diff(gp) <= 0).any():
        raise ValueError(f"{where}: graph {int(np.argmax(np.diff(gp) <= 0))} is empty (offsets must increase)")
    if indices.shape[0]:
        node_graph = np.repeat(np.arange(gp.shape[0] - 1), np.diff(gp))
        dst = np.repeat(np.arange(n), np.diff(indptr))
        cross = node_graph[np.asarray(indices, dtype=np.int64)] != node_graph[dst]
        if cross.any():
            e = int(np.argmax(cross))
            raise ValueError(f"{where}: edge {int(indices[e])} -> {int(dst[e])} joins two graphs "
                             f"({int(node_graph[indices[e]])} and {int(node_graph[dst[e]])})")


def build_graph_batch_pattern(indptr: np.ndarray, indices: np.ndarray, graph_ptr: np.ndarray, *, full: bool,
                              max_dist: int) -> AttentionPattern:
    """The attention pattern of a batch of small graphs, one global token per graph.

    Args:
        indptr: int[N + 1], indices: int[E]: all graphs as one CSR over destinations (block diagonal).
        graph_ptr: int[G + 1]: graph ``g`` is nodes ``graph_ptr[g]:graph_ptr[g+1]``; no edge joins two graphs.
        full: every pair inside each graph (dense attention per graph); else in-neighbours, self, the chain
            ``i - 1, i + 1`` inside the graph.
        max_dist: the distance cap of the codes (a bias table of ``num_codes(max_dist)`` rows).
    Returns:
        the pattern over ``N + G`` tokens (token ``N + g``: graph ``g``'s global token), exact shortest-path
        codes (BFS along the edges inside each graph; unreachable pairs in their own bucket).
    Raises:
        ValueError: inconsistent arrays, an empty graph, or an edge between two graphs.
    """
    from numba_kernels.cpu.pattern import graph_batch_pattern, is_sorted_rows

    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    gp = np.asarray(graph_ptr, dtype=np.int64)
    n = int(indptr.shape[0] - 1)
    check_graph_ptr(gp, indptr, indices)
    if not is_sorted_rows(indptr, indices):
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        indices = indices[np.lexsort((indices, dst))]
    rowptr, cols, codes = graph_batch_pattern(indptr, indices, gp, bool(full), int(max_dist))
    csr = CSR(torch.from_numpy(rowptr), torch.from_numpy(cols), n + gp.shape[0] - 1, validate=False)
    return AttentionPattern(csr, torch.from_numpy(codes), n, True, np.arange(n, dtype=np.int64), int(max_dist),
                            gp, bool(full))
