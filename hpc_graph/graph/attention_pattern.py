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

import dataclasses

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from hpc_graph.ops.csr import CSR
from hpc_graph.options import BOOL, CLUSTER_BETA, choice_spec, int_spec, option

log = logging.getLogger(__name__)

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
        self._on: dict = {}  # copies on other devices, made once

    def csr_on(self, device: torch.device) -> CSR:
        """``csr`` on ``device`` (the pattern is built on the host; a GPU copy is made once and kept)."""
        device = torch.device(device)
        if self.csr.device == device:
            return self.csr
        if ("csr", device) not in self._on:
            self._on[("csr", device)] = self.csr.to(device)
        return self._on[("csr", device)]

    def codes_on(self, max_dist: int, device: torch.device) -> torch.Tensor:
        """:meth:`codes_for` on ``device`` (copied once per device and ``max_dist``)."""
        codes = self.codes_for(max_dist)
        device = torch.device(device)
        if codes.device == device:
            return codes
        key = ("codes", int(max_dist), device)
        if key not in self._on:
            self._on[key] = codes.to(device)
        return self._on[key]

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
                  order: np.ndarray | None = None, chain: bool = True) -> AttentionPattern:
    """The sparse pattern of a graph: self loops + edges + the chain through ``order`` + the global token.

    Args:
        indptr: int[num_nodes + 1], indices: int[E]: the graph as a CSR over destinations.
        num_nodes: nodes N.
        global_token: add token N, attending to and attended by every node (and itself).
        order: a permutation of ``range(N)``, the sequence order (default: node id order).
        chain: add the chain (False: self loops + edges (+ the token) only, the pattern that engines
            holding a part of the graph, ``dp``/``sar``, attend over).
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
    rowptr, cols, codes = attention_pattern(indptr, indices, order, global_token, chain)
    csr = CSR(torch.from_numpy(rowptr), torch.from_numpy(cols), n + int(global_token), validate=False)
    return AttentionPattern(csr, torch.from_numpy(codes), n, bool(global_token), order)


#: sequence orders of :func:`sequence_order` (``engine.sequence_order``)
ORDERS = ("id", "rcm", "metis")


def sequence_order(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, method: str = "id",
                   cluster_size: int = 256, seed: int = 0) -> np.ndarray:
    """int64[N]: the order of the nodes in the sequence (:func:`sequence_clusters` without the clusters)."""
    return sequence_clusters(indptr, indices, num_nodes, method, cluster_size, seed)[0]


def sequence_clusters(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, method: str = "id",
                      cluster_size: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(order int64[N], cluster_ptr int64[K+1])``: the order of the nodes in the transformer's sequence
    (``order[t]`` is the t-th node) and its clusters (contiguous ranges of the sequence; the METIS
    clusters for ``metis``, ranges of ``cluster_size`` otherwise), which the cluster-sparse layout uses.

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
        return np.arange(n, dtype=np.int64), cluster_ptr_of(n, cluster_size)
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if method == "rcm":
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import reverse_cuthill_mckee

        a = csr_matrix((np.ones(indices.shape[0], dtype=np.int8), indices, indptr), shape=(n, n))
        a = (a + a.T).tocsr()
        order = np.asarray(reverse_cuthill_mckee(a, symmetric_mode=True), dtype=np.int64)
        return order, cluster_ptr_of(n, cluster_size)
    from data_io.partitioner import assign_parts

    parts = assign_parts(indptr, indices, max(1, min(n, -(-n // int(cluster_size)))), method="metis", seed=seed)
    order = np.argsort(parts, kind="stable").astype(np.int64)
    return order, cluster_ptr_of(n, cluster_size, parts[order])



def check_attention_args(mode: str, bias: torch.Tensor | None, heads: int) -> None:
    """``ValueError`` for a mode other than sparse/dense or a bias table that is not
    float[num_codes(max_dist), heads] for some ``max_dist >= 0``."""
    if mode not in ("sparse", "dense"):
        raise ValueError(f"attention: mode must be 'sparse' or 'dense', got {mode!r}")
    if bias is not None and (bias.dim() != 2 or bias.shape[0] < num_codes(0) or bias.shape[1] != heads):
        raise ValueError(f"attention: bias must be [max_dist + 4, heads={heads}] (self, 1..max_dist hops, farther, "
                         f"global, unreachable), got {tuple(bias.shape)}")


def far_count_prior(pattern: AttentionPattern) -> float:
    """``ln((n - e) / e)`` for ``n`` node tokens and ``e`` pattern entries per token: the count prior that dense
    mode subtracts from the far pairs' scores (``far_prior=True``), so that at equal scores a token's far
    pairs together weigh as much as its pattern entries instead of ``(n - e) / e`` times more."""
    e = pattern.csr.num_edges / max(pattern.num_tokens, 1)
    return math.log(max(pattern.num_nodes - e, 1.0) / max(e, 1e-12))


def attend(pattern: AttentionPattern, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
           bias: torch.Tensor | None = None, mode: str = "sparse", layout: "ClusterLayout | None" = None,
           far_prior: bool = True) -> torch.Tensor:
    """Attention of all ``pattern.num_tokens`` tokens (q, k, v float[T, H, d]) for an engine holding the whole
    sequence: the bias table float[max_dist + 4, H] gathered by the entries' codes
    (:meth:`AttentionPattern.codes_for`), the farther row for the pairs outside the pattern in dense mode
    (:func:`~hpc_graph.ops.graph_attention.pattern_attention`). A graph batch's pattern attends inside each
    graph only: pass its ``full`` pattern for dense attention (``mode`` must then be ``"sparse"``).
    ``layout``: the pattern's :class:`ClusterLayout` to run sparse mode through (the same result).
    ``far_prior``: in dense mode, subtract :func:`far_count_prior` from the far pairs' scores (else plain dense).
    ``mode`` and ``bias`` as checked by :func:`check_attention_args`."""
    from hpc_graph.ops.graph_attention import code_bias, pattern_attention

    check_attention_args(mode, bias, q.shape[1])
    dense = mode == "dense"
    if layout is not None and not dense:
        return attend_layout(layout, pattern.codes_for(GRAPH_MAX_DIST if bias is None else max_dist_of(bias)),
                             q, k, v, bias)
    if dense and pattern.graph_ptr is not None:
        raise ValueError("attention: a graph batch has no dense mode over the whole sequence; "
                         "attend over its full pattern (build_graph_batch_pattern(full=True))")
    csr = pattern.csr_on(q.device)
    prior = -far_count_prior(pattern) if dense and far_prior else 0.0
    if bias is None:
        far = torch.full((q.shape[1],), prior, dtype=q.dtype, device=q.device) if dense else None
        return pattern_attention(csr, q, k, v, dense=dense, num_nodes=pattern.num_nodes, far_bias=far)
    m = max_dist_of(bias)
    codes = pattern.codes_on(m, q.device)
    if not dense:  # the table and 1-byte codes go into the kernels: no [E, H] bias is made or kept
        return pattern_attention(csr, q, k, v, bias=bias, codes=codes)
    return pattern_attention(csr, q, k, v, bias=code_bias(bias, codes), dense=True, num_nodes=pattern.num_nodes,
                             far_bias=bias[far_code(m)] + prior)


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


# -- the cluster-sparse layout and its tuner ------------------------------------------------------
@dataclass
class ClusterLayout:
    """A pattern split into dense cluster-pair blocks and a CSR rest (TorchGT's cluster-sparse layout).

    The node tokens are cut into clusters (contiguous ranges of the sequence order, ``cluster_ptr``); the
    pattern's entries between cluster ``I`` and cluster ``J`` form block ``(I, J)`` of density
    ``entries / (|I| |J|)``. Blocks denser than ``beta`` run as dense tiles (matrix products over the
    whole block, every pair that is not an entry masked: a superset computed, nothing added or lost),
    the rest (and the global token's entries) through the CSR kernels. ``beta >= 1``: no dense block;
    ``beta = 0``: every non-empty block dense. The attention result does not depend on ``beta``; only
    the time does.

    Attributes:
        beta: the density threshold; cluster_ptr: int64[K + 1];
        sparse: CSR of the rest; sparse_ids: int64[E_s] their pattern-order indices;
        blocks: ``(rid, cid, rows, cols, ids)`` per dense block (see
            :func:`~hpc_graph.ops.graph_attention.cluster_attention`);
        dense_entries: pattern entries inside dense blocks; tile_pairs: pairs the dense tiles compute.
    """

    beta: float
    cluster_ptr: np.ndarray
    sparse: CSR
    sparse_ids: torch.Tensor
    blocks: list
    dense_entries: int
    tile_pairs: int

    def on(self, device: torch.device) -> "ClusterLayout":
        """This layout with its CSR, ids and blocks on ``device`` (built on the host; a copy made once per device)."""
        device = torch.device(device)
        if self.sparse.device == device:
            return self
        cache = self.__dict__.setdefault("_on", {})
        if device not in cache:
            cache[device] = dataclasses.replace(
                self, sparse=self.sparse.to(device), sparse_ids=self.sparse_ids.to(device),
                blocks=[tuple(t.to(device) for t in b) for b in self.blocks])
        return cache[device]

    def describe(self) -> dict:
        return {"beta": self.beta, "dense_blocks": len(self.blocks), "dense_entries": self.dense_entries,
                "sparse_entries": int(self.sparse.num_edges), "tile_pairs": self.tile_pairs}


def cluster_ptr_of(num_nodes: int, cluster_size: int, parts: np.ndarray | None = None) -> np.ndarray:
    """int64[K + 1]: cluster boundaries over the node tokens in sequence order: the runs of equal
    ``parts`` (METIS clusters laid one after the other), else fixed ranges of ``cluster_size``."""
    n = int(num_nodes)
    if parts is not None and len(parts):
        cuts = np.flatnonzero(np.diff(np.asarray(parts))) + 1
        return np.concatenate(([0], cuts, [n])).astype(np.int64)
    return np.unique(np.concatenate((np.arange(0, n, max(1, int(cluster_size))), [n]))).astype(np.int64)


def pattern_density(pattern: AttentionPattern) -> float:
    """beta_G: the fraction of node-token pairs that are pattern entries."""
    n = pattern.num_nodes
    return float(pattern.csr.num_edges) / float(max(1, n) ** 2)


def build_cluster_layout(pattern: AttentionPattern, cluster_ptr: np.ndarray, beta: float) -> ClusterLayout:
    """Split ``pattern`` into dense blocks (density > ``beta``) and a CSR rest; see :class:`ClusterLayout`.

    ``cluster_ptr`` cuts the *sequence* (``pattern.order``: cluster ``I`` is the nodes
    ``order[cluster_ptr[I]:cluster_ptr[I+1]]``).

    Raises:
        ValueError: ``beta`` outside [0, 1] or cluster boundaries that do not cover the node tokens.
    """
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"engine.cluster_beta: must be in [0, 1] (or 'auto'), got {beta}")
    n, T = pattern.num_nodes, pattern.num_tokens
    cp = np.asarray(cluster_ptr, dtype=np.int64)
    if cp.ndim != 1 or cp.shape[0] < 2 or cp[0] != 0 or cp[-1] != n or (np.diff(cp) <= 0).any():
        raise ValueError(f"build_cluster_layout: cluster boundaries must increase from 0 to {n}")
    K = cp.shape[0] - 1
    order = np.asarray(pattern.order, dtype=np.int64)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n, dtype=np.int64)  # token -> place in the sequence
    cluster = np.repeat(np.arange(K, dtype=np.int64), np.diff(cp))  # sequence place -> cluster
    indptr = pattern.csr.indptr.cpu().numpy()
    cols = pattern.csr.indices.cpu().numpy()
    rows = np.repeat(np.arange(T, dtype=np.int64), np.diff(indptr))
    node = (rows < n) & (cols < n)
    pr = pos[np.minimum(rows, n - 1)]
    pc = pos[np.minimum(cols, n - 1)]
    cr, cc = cluster[pr], cluster[pc]
    block = np.where(node, cr * K + cc, -1)
    size = np.diff(cp)
    counts = np.bincount(block[node], minlength=K * K)
    density = counts / (size[:, None] * size[None, :]).reshape(-1).astype(np.float64)
    dense_block = (counts > 0) & (density > beta)
    in_dense = node & dense_block[np.where(node, block, 0)]
    ids = np.flatnonzero(in_dense)
    by_block = ids[np.argsort(block[ids], kind="stable")]
    members = [torch.from_numpy(order[cp[i]:cp[i + 1]]) for i in range(K)]
    blocks, tile_pairs = [], 0
    if by_block.size:
        b_of = block[by_block]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(b_of)) + 1, [by_block.size]))
        for a, b in zip(starts[:-1], starts[1:]):
            e = by_block[a:b]
            bi, bj = divmod(int(b_of[a]), K)
            blocks.append((members[bi], members[bj], torch.from_numpy(pr[e] - cp[bi]),
                           torch.from_numpy(pc[e] - cp[bj]), torch.from_numpy(e)))
            tile_pairs += int(size[bi] * size[bj])
    rest = np.flatnonzero(~in_dense)
    sp_ptr = np.zeros(T + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows[rest], minlength=T), out=sp_ptr[1:])
    sparse = CSR(torch.from_numpy(sp_ptr), torch.from_numpy(cols[rest]), T, validate=False)
    return ClusterLayout(beta, cp, sparse, torch.from_numpy(rest), blocks, int(ids.size), tile_pairs)


def attend_layout(layout: ClusterLayout, codes: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse-mode attention through a :class:`ClusterLayout` (``codes``: the pattern's uint8 codes in the
    bias table's layout, :meth:`AttentionPattern.codes_for`)."""
    from hpc_graph.ops.graph_attention import cluster_attention, code_bias

    layout = layout.on(q.device)
    return cluster_attention(layout.sparse, layout.sparse_ids, layout.blocks, q, k, v,
                             None if bias is None else code_bias(bias, codes.to(q.device)))


#: the thresholds the tuner walks: TorchGT's multiples of beta_G, then absolute densities up to 1 (no tile)
BETA_LADDER = (("abs", 0.0), ("rel", 1.0), ("rel", 5.0), ("rel", 10.0), ("abs", 0.05), ("abs", 0.2), ("abs", 1.0))


def beta_ladder(beta_g: float) -> list[float]:
    """The ascending, distinct thresholds of :data:`BETA_LADDER` for a pattern of density ``beta_g``."""
    out: list[float] = []
    for kind, x in BETA_LADDER:
        b = min(1.0, x * float(beta_g) if kind == "rel" else x)
        if not out or b > out[-1]:
            out.append(b)
    return out


class BetaTuner:
    """Chooses the cluster-sparse threshold ``beta`` from the training loss and the epoch time.

    TorchGT's auto tuner: a running loss ``F_t = 0.9 F_{t-1} + 0.1 L_t`` and the loss-descent rate
    ``LDR_t = (F_{t-1} - F_t) / e_t`` (``e_t`` the epoch's seconds). ``beta`` walks the ladder
    ``{0, beta_G, 5 beta_G, 10 beta_G, 0.05, 0.2, 1}`` (:func:`beta_ladder`) from its top, 1 (no dense
    tile: the plain CSR kernels, never slower than where it starts), towards denser tiling. After every
    ``window`` epochs at one value the window's mean LDR is compared with the previous window's: better
    by more than ``hysteresis`` (relative) keeps walking in the same direction, worse by more reverses
    the direction and steps back, anything in between stays (hysteresis: noise does not flip-flop it),
    and worse again right after turning back also stays (the loss flattening with time makes every
    later window look worse; without this the walk would oscillate between two values).
    The first epoch after a change is left out of the mean (it rebuilds the layout). Fed the same
    (loss, seconds) on every rank (the global loss, the slowest rank's time), every rank takes the
    same decisions. Each decision is logged; :attr:`history` keeps ``(epoch, beta)`` per epoch.

    Our layout is exact (a dense tile masks what is not an entry), so ``beta`` trades only time,
    never accuracy: the walk settles where an epoch is fastest. TorchGT's beta has the opposite
    sense (clusters *sparser* than it are rewired into compact blocks, which moves edges) and starts
    at beta_G; with ours, beta_G tiles nearly every block, the slow end on a CPU.
    """

    def __init__(self, beta_g: float, window: int = 10, hysteresis: float = 0.05, start: int | None = None):
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ValueError(f"engine.tuner_window: must be an integer >= 2, got {window!r}")
        self.ladder = beta_ladder(beta_g)
        self.index = len(self.ladder) - 1 if start is None else int(start)
        self.direction = -1  # towards denser tiling
        self.window, self.hysteresis = int(window), float(hysteresis)
        self.F: float | None = None
        self.rates: list[float] = []
        self.previous: float | None = None
        self.turned = False
        self.history: list[tuple[int, float]] = []

    @property
    def beta(self) -> float:
        return self.ladder[self.index]

    def update(self, epoch: int, loss: float, seconds: float) -> float:
        """Feed epoch ``epoch``'s global loss and time; return the ``beta`` of the next epoch."""
        self.history.append((int(epoch), self.beta))
        if not np.isfinite(loss) or seconds <= 0:
            return self.beta
        F_prev, self.F = self.F, (loss if self.F is None else 0.9 * self.F + 0.1 * loss)
        if F_prev is None:
            return self.beta
        self.rates.append((F_prev - self.F) / seconds)
        if len(self.rates) < self.window:
            return self.beta
        mean = float(np.mean(self.rates[1:]))  # the first epoch at a new beta rebuilt the layout
        old = self.beta
        if self.previous is None:
            why = "first window: try the next value"
        elif mean - self.previous > self.hysteresis * abs(self.previous):
            why = f"LDR {self.previous:.3g} -> {mean:.3g}: better, keep going"
        elif self.previous - mean > self.hysteresis * abs(self.previous):
            if self.turned:  # worse right after turning back: the loss is flattening, not beta; stay
                log.info("beta tuner: epoch %d: LDR %.3g -> %.3g: worse again after turning back: beta settles "
                         "at %.3g", epoch, self.previous, mean, old)
                self.previous, self.rates, self.turned = mean, [], False
                return self.beta
            why = f"LDR {self.previous:.3g} -> {mean:.3g}: worse, turn back"
            self.direction = -self.direction
        else:
            log.info("beta tuner: epoch %d: LDR %.3g -> %.3g within %.0f %%: beta stays %.3g", epoch, self.previous,
                     mean, 100 * self.hysteresis, old)
            self.previous, self.rates, self.turned = mean, [], False
            return self.beta
        self.turned = why.endswith("turn back")
        nxt = self.index + self.direction
        if not 0 <= nxt < len(self.ladder):
            self.direction = -self.direction
            nxt = self.index + self.direction
        self.index = nxt
        self.previous, self.rates = mean, []
        log.info("beta tuner: epoch %d: %s: beta %.3g -> %.3g", epoch, why, old, self.beta)
        return self.beta

    def state_dict(self) -> dict:
        return {"ladder": list(self.ladder), "index": self.index, "direction": self.direction, "F": self.F,
                "rates": list(self.rates), "previous": self.previous, "turned": self.turned,
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.ladder = [float(x) for x in state["ladder"]]
        self.index, self.direction, self.F = int(state["index"]), int(state["direction"]), state["F"]
        self.rates, self.previous, self.turned = list(state["rates"]), state["previous"], bool(state["turned"])
        self.history = [tuple(h) for h in state["history"]]


class ClusterLayoutControl:
    """An engine's cluster-sparse settings (``engine.cluster_beta``, ``cluster_size``, ``tuner_window``) and
    state: the layout of the current ``beta`` per pattern, and the :class:`BetaTuner` when ``beta`` is
    ``"auto"``. Shared by the engines that run graph transformers (``single``, ``seqpar``).

    ``cluster_beta``: None (off: every entry through the CSR kernels), a number in [0, 1] (fixed), or
    ``"auto"`` (tuned, starting at beta_G).
    """

    def __init__(self, cluster_beta=None, cluster_size: int = 256, tuner_window: int = 10):
        if cluster_beta is not None and cluster_beta != "auto":
            if isinstance(cluster_beta, bool) or not isinstance(cluster_beta, (int, float)) \
                    or not 0 <= cluster_beta <= 1:
                raise ValueError(f"engine.cluster_beta: must be null, 'auto' or a number in [0, 1], "
                                 f"got {cluster_beta!r}")
        if isinstance(cluster_size, bool) or not isinstance(cluster_size, int) or cluster_size < 1:
            raise ValueError(f"engine.cluster_size: must be a positive integer, got {cluster_size!r}")
        self.setting, self.cluster_size, self.window = cluster_beta, int(cluster_size), tuner_window
        self.tuner: BetaTuner | None = None
        self.beta: float | None = None if cluster_beta in (None, "auto") else float(cluster_beta)
        self._layouts: dict = {}
        self._used: dict = {}

    @property
    def enabled(self) -> bool:
        return self.setting is not None

    def layout_in(self, pattern: AttentionPattern, cluster_ptr: np.ndarray, mode: str) -> ClusterLayout | None:
        """The layout attention in ``mode`` runs through (:meth:`layout_for`), or None: off, or dense mode."""
        return self.layout_for(pattern, cluster_ptr) if self.enabled and mode == "sparse" else None

    def layout_for(self, pattern: AttentionPattern, cluster_ptr: np.ndarray) -> ClusterLayout:
        """The layout of ``pattern`` at the current beta (built on first use after each change)."""
        if self.setting == "auto" and self.tuner is None:
            self.tuner = BetaTuner(pattern_density(pattern), window=self.window)
            self.beta = self.tuner.beta
            log.info("beta tuner: beta_G = %.3g, ladder %s", pattern_density(pattern),
                     ", ".join(f"{b:.3g}" for b in self.tuner.ladder))
        key = (id(pattern), self.beta)
        if key not in self._layouts:
            self._layouts = {k: v for k, v in self._layouts.items() if k[0] != id(pattern)}  # one beta at a time
            self._layouts[key] = build_cluster_layout(pattern, cluster_ptr, self.beta)
        layout = self._layouts[key]
        self._used = layout.describe()
        return layout

    def end_epoch(self, epoch: int, loss: float, seconds: float) -> None:
        """Feed the tuner (the same global loss and time on every rank)."""
        if self.tuner is not None:
            self.beta = self.tuner.update(epoch, loss, seconds)

    def stats(self) -> dict:
        """The layout of the last attention call: beta, dense blocks and entries, CSR entries."""
        return dict(self._used)

    def state_dict(self) -> dict:
        return {} if self.tuner is None else {"tuner": self.tuner.state_dict(), "beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        if state and "tuner" in state:
            self.tuner = BetaTuner(0.0, window=self.window)
            self.tuner.load_state_dict(state["tuner"])
            self.beta = self.tuner.beta


def engine_attention_options(options: dict) -> tuple[ClusterLayoutControl, bool]:
    """The graph-transformer options of the engines holding the whole sequence (``single``, ``seqpar``):
    their :class:`ClusterLayoutControl` (``cluster_beta``, ``cluster_size``, ``tuner_window``) and whether
    the pattern has its chain (``attention_chain``). ``ValueError`` naming the option otherwise."""
    clusters = ClusterLayoutControl(options.get("cluster_beta"), options.get("cluster_size", 256),
                                    options.get("tuner_window", 10))
    chain = options.get("attention_chain", True)
    if not isinstance(chain, bool):
        raise ValueError(f"engine.attention_chain: must be true or false, got {chain!r}")
    return clusters, chain



@dataclasses.dataclass
class SequenceOptions:
    """The options of the engines that hold the whole token sequence of a graph transformer (``single``,
    ``seqpar``): its order, its pattern's chain and the cluster-sparse layout of its sparse attention."""
    sequence_order: str = option("id", choice_spec("id", "rcm", "metis"),
                                 "Graph transformers (`gt`, `graphormer`): the order of the nodes in the sequence, "
                                 "which the attention pattern's chain follows and `seqpar` cuts into one piece per "
                                 "rank. `id`: node ids; `rcm`: reverse Cuthill-McKee (neighbours close together); "
                                 "`metis`: METIS clusters of ~256 nodes one after the other.", section="engine")
    cluster_beta: object = option(None, CLUSTER_BETA,
                                  "Graph transformers' sparse attention in TorchGT's cluster-sparse layout: the "
                                  "sequence cut into clusters of `cluster_size` (METIS clusters with `sequence_order: "
                                  "metis`), every cluster pair denser than this threshold computed as one dense tile "
                                  "(exact: the tile's pairs that are not pattern entries are masked), the rest through "
                                  "the CSR kernels. `null`: off; a number in [0, 1]: fixed; `auto`: TorchGT's tuner "
                                  "walks {0, b, 5b, 10b, 0.05, 0.2, 1} (b = the pattern's density) from 1 by the "
                                  "smoothed loss-descent rate per second, with hysteresis, the same on every rank. "
                                  "Changes time only, never results.", section="engine")
    attention_chain: bool = option(True, BOOL,
                                   "Graph transformers: the sparse pattern's chain through the sequence order (a "
                                   "Hamiltonian path, TorchGT's expressiveness condition). `false`: self loops, "
                                   "edges (and the global token) only: the pattern `dp`, `sar` and `sylvie` attend "
                                   "over, so the engines agree.", section="engine")
    cluster_size: int = option(256, int_spec(1),
                               "Nodes per cluster of the cluster-sparse layout (and of `sequence_order: metis`).",
                               section="engine")
    tuner_window: int = option(10, int_spec(2),
                               "`cluster_beta: auto`: epochs at one threshold before the tuner compares "
                               "(TorchGT's delta).", section="engine")
