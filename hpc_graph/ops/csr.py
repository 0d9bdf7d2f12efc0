"""``CSR``: the sparse structure every op in :mod:`hpc_graph.ops` takes.

A CSR over destinations: row ``i`` (a destination node) lists the source
columns ``indices[indptr[i]:indptr[i+1]]`` of its in-edges. Sources and
destinations may be different sets (a SAR block G_{p,q} has ``num_dst`` owned
rows and ``num_src`` columns of partition q), so both counts are stored.

The transposed copy (CSC: for each source, its destinations, plus the edge
permutation when a caller needs per-edge values) is built once, on first use,
and cached: backward passes walk it instead of using atomics.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch


def column_dtype(num_src: int) -> type:
    """The NumPy type loaders give a CSR's column indices: int32 when the ``num_src`` column ids fit (half the
    bytes of the structure every layer reads), else int64."""
    return np.int32 if int(num_src) < 2**31 else np.int64


class CSR:
    """Sparse destination-major adjacency with a cached transpose.

    Args:
        indptr: int64[num_dst + 1] row pointer.
        indices: int[E] source column of each edge, in ``[0, num_src)``: kept as int32 when given as
            int32 (half the bytes of the structure every layer reads; loaders pass :func:`column_dtype`),
            else converted to int64.
        num_src: number of source columns (defaults to ``num_dst``).
        edge_weight: optional float[E] per-edge weight.
        validate: check shapes and index ranges now (raises ``ValueError``).

    Tensors are kept on the device they were given on; ``to(device)`` moves all.
    """

    def __init__(self, indptr, indices, num_src: int | None = None, edge_weight=None,
                 validate: bool = True):
        self.indptr = torch.as_tensor(indptr, dtype=torch.int64)
        indices = torch.as_tensor(indices)
        self.indices = indices if indices.dtype == torch.int32 else indices.to(torch.int64)
        self.num_dst = int(self.indptr.shape[0] - 1)
        self.num_src = int(self.num_dst if num_src is None else num_src)
        self.edge_weight = None if edge_weight is None else torch.as_tensor(edge_weight)
        # (indptr_t, indices_t, perm or None): perm (8 bytes per edge) only once someone asked for it
        self._csc: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        self._cache: dict = {}
        if validate:
            self.validate()

    @classmethod
    def of_shape(cls, num_dst: int, num_src: int | None = None, num_edges: int = 0, *, symmetric: bool = False,
                 index_dtype: torch.dtype | None = None) -> "CSR":
        """A CSR with sizes and no data, on the ``meta`` device (what the planner runs the ops on): ``num_dst``
        rows over ``num_src`` columns, ``num_edges`` stored edges, int32 column indices where the ids fit.
        ``symmetric``: the graph equals its transpose (an undirected graph in ascending row order), which the
        data would tell (:meth:`is_symmetric`)."""
        num_src = int(num_dst if num_src is None else num_src)
        if index_dtype is None:
            index_dtype = torch.int32 if num_src < 2**31 else torch.int64
        g = cls(torch.empty(int(num_dst) + 1, dtype=torch.int64, device="meta"),
                torch.empty(int(num_edges), dtype=index_dtype, device="meta"), num_src, validate=False)
        g._cache["symmetric"] = bool(symmetric) and g.num_src == g.num_dst
        return g

    @property
    def is_shape_only(self) -> bool:
        """Sizes without data (:meth:`of_shape`)."""
        return self.indptr.is_meta

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when the structure is inconsistent."""
        if self.is_shape_only:
            return
        if self.indptr.dim() != 1 or self.indptr.shape[0] < 1:
            raise ValueError(f"CSR.indptr: expected a 1-D tensor of length num_dst+1, got {tuple(self.indptr.shape)}")
        if self.indices.dim() != 1:
            raise ValueError(f"CSR.indices: expected a 1-D tensor, got {tuple(self.indices.shape)}")
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != self.num_edges:
            raise ValueError(f"CSR.indptr: must start at 0 and end at len(indices)={self.num_edges}, "
                             f"got {int(self.indptr[0])}..{int(self.indptr[-1])}")
        if self.num_dst and bool((self.indptr[1:] < self.indptr[:-1]).any()):
            raise ValueError("CSR.indptr: not non-decreasing")
        if self.num_edges:
            lo, hi = int(self.indices.min()), int(self.indices.max())
            if lo < 0 or hi >= self.num_src:
                raise ValueError(f"CSR.indices: index out of range [0, {self.num_src}): min {lo}, max {hi}")
        if self.edge_weight is not None and tuple(self.edge_weight.shape) != (self.num_edges,):
            raise ValueError(f"CSR.edge_weight: expected shape ({self.num_edges},), "
                             f"got {tuple(self.edge_weight.shape)}")

    def csc(self, perm: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The transpose, built once: ``(indptr_t int64[num_src+1], indices_t int[E], perm int64[E])``
        (``indices_t`` int32 when this CSR's indices are).

        ``indices_t[k]`` is the destination row of the k-th edge in source-major
        order and ``perm[k]`` its position in this CSR's edge order (to gather
        per-edge values such as weights). With ``perm=False`` the permutation is
        neither built nor kept (the third item may be None): callers that only
        walk the structure (unweighted sums, fused attention) save 8 bytes per
        edge for as long as the graph lives. A later ``csc()`` builds it then.
        """
        if self._csc is not None and (not perm or self._csc[2] is not None):
            return self._csc
        if self.is_shape_only:
            p = torch.empty(self.num_edges, dtype=torch.int64, device="meta") if perm else None
            if self.is_symmetric():
                self._csc = (self.indptr, self.indices, p)
            else:
                idx = self.indices.dtype if self.num_dst < 2**31 else torch.int64
                self._csc = (torch.empty(self.num_src + 1, dtype=torch.int64, device="meta"),
                             torch.empty(self.num_edges, dtype=idx, device="meta"), p)
            return self._csc
        if self.device.type == "cpu":
            # numba counting sort: several times faster than a torch sort on large graphs
            from numba_kernels.cpu._transpose import csr_transpose

            indptr, indices = self.indptr.contiguous().numpy(), self.indices.contiguous().numpy()
            if indices.dtype == np.int32 and self.num_dst >= 2**31:  # row ids of the transpose need int64
                indices = indices.astype(np.int64)
            if self.is_symmetric():
                # the transpose is this CSR: share its arrays (only the permutation is new)
                p = torch.from_numpy(csr_transpose(indptr, indices, self.num_src, True)[2]) if perm else None
                self._csc = (self.indptr, self.indices, p)
                return self._csc
            t = csr_transpose(indptr, indices, self.num_src, perm)
            self._csc = (torch.from_numpy(t[0]), torch.from_numpy(t[1]), torch.from_numpy(t[2]) if perm else None)
        else:
            dst = torch.repeat_interleave(torch.arange(self.num_dst, device=self.device),
                                          self.indptr[1:] - self.indptr[:-1])
            order = torch.argsort(self.indices, stable=True)
            counts = torch.bincount(self.indices, minlength=self.num_src)
            indptr_t = torch.zeros(self.num_src + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(counts, 0, out=indptr_t[1:])
            rows = dst[order]
            if self.indices.dtype == torch.int32 and self.num_dst < 2**31:
                rows = rows.to(torch.int32)
            self._csc = (indptr_t, rows.contiguous(), order if perm else None)
        return self._csc

    def is_symmetric(self) -> bool:
        """Whether this (square, CPU) CSR equals its transpose: rows ascending and ``i -> j`` as often as
        ``j -> i`` (checked once, cached). Then :meth:`csc` returns this CSR's own arrays, and kernels
        that cache per-direction data (the blocked SpMM) share one copy for both directions."""
        if "symmetric" not in self._cache:
            sym = False
            if self.device.type == "cpu" and self.num_src == self.num_dst:
                from numba_kernels.cpu._transpose import is_symmetric

                sym = bool(is_symmetric(self.indptr.contiguous().numpy(), self.indices.contiguous().numpy()))
            self._cache["symmetric"] = sym
        return self._cache["symmetric"]

    def in_degree(self) -> torch.Tensor:
        """int64[num_dst]: number of in-edges of each destination row."""
        return self.indptr[1:] - self.indptr[:-1]

    def with_self_loops(self) -> "CSR":
        """This CSR with an edge ``i -> i`` appended after the in-edges of every row ``i`` (the first
        ``num_dst`` columns are the rows' own nodes: a whole graph, or a block whose destinations come first
        among its sources); built once and cached."""
        if "self_loops" not in self._cache and self.is_shape_only:
            self._cache["self_loops"] = CSR.of_shape(self.num_dst, self.num_src, self.num_edges + self.num_dst,
                                                     index_dtype=self.indices.dtype)
        if "self_loops" not in self._cache:
            n, dev = self.num_dst, self.device
            ar = torch.arange(n + 1, device=dev)
            indptr = self.indptr + ar
            indices = torch.empty(self.num_edges + n, dtype=self.indices.dtype, device=dev)
            rows = torch.repeat_interleave(ar[:-1], self.in_degree())
            indices[torch.arange(self.num_edges, device=dev) + rows] = self.indices
            indices[indptr[1:] - 1] = ar[:-1].to(indices.dtype)
            self._cache["self_loops"] = CSR(indptr, indices, self.num_src, validate=False)
        return self._cache["self_loops"]

    def out_degree(self) -> torch.Tensor:
        """int64[num_src]: number of out-edges of each source column (from the cached transpose)."""
        indptr_t = self.csc(perm=False)[0]
        return indptr_t[1:] - indptr_t[:-1]

    def to(self, device) -> "CSR":
        out = CSR(self.indptr.to(device), self.indices.to(device), self.num_src,
                  None if self.edge_weight is None else self.edge_weight.to(device), validate=False)
        if self._csc is not None and self._csc[1] is self.indices:  # symmetric: keep sharing the arrays
            out._csc = (out.indptr, out.indices, None if self._csc[2] is None else self._csc[2].to(device))
        elif self._csc is not None:
            out._csc = tuple(None if t is None else t.to(device) for t in self._csc)
        return out

    @classmethod
    def from_edges(cls, src: np.ndarray, dst: np.ndarray, num_dst: int, num_src: int | None = None,
                   edge_weight=None) -> "CSR":
        """Build from edge lists ``src -> dst`` (int arrays of length E), sorted by destination (stable)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        order = np.argsort(dst, kind="stable")
        indptr = np.zeros(num_dst + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
        w = None if edge_weight is None else np.asarray(edge_weight)[order]
        return cls(indptr, src[order], num_src, w)

    @classmethod
    def permuted(cls, indptr: np.ndarray, indices: np.ndarray, order: np.ndarray) -> "CSR":
        """A square graph with node ``order[k]`` renamed ``k`` (rows and columns; columns ascending in each row).

        Args:
            indptr: int64[N+1], indices: int[E] (row i lists the sources of i's in-edges); order: int64[N], a
                permutation of the nodes.
        Returns: the renamed CSR, its columns int32 where the ids fit (:func:`column_dtype`).
        """
        indptr = np.asarray(indptr, dtype=np.int64)
        indices = np.asarray(indices, dtype=np.int64)
        order = np.asarray(order, dtype=np.int64)
        n = indptr.shape[0] - 1
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n, dtype=np.int64)
        deg = np.diff(indptr)[order]
        new_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(deg, out=new_ptr[1:])
        rows = np.repeat(np.arange(n, dtype=np.int64), deg)
        take = np.arange(int(new_ptr[-1]), dtype=np.int64) + np.repeat(indptr[order] - new_ptr[:-1], deg)
        cols = pos[indices[take]]
        del take
        cols = cols[np.lexsort((cols, rows))].astype(column_dtype(n), copy=False)
        return cls(torch.from_numpy(new_ptr), torch.from_numpy(cols), n, validate=False)

    def __repr__(self) -> str:
        return f"CSR(num_dst={self.num_dst}, num_src={self.num_src}, edges={self.num_edges})"


def relational_csr(indptr, indices, edge_type, num_relations: int, num_src: int | None = None) -> CSR:
    """The relation-expanded CSR of a typed graph: row ``i * R + r`` lists the in-edges of ``i`` of type ``r``.

    A typed aggregation ``out[i, r] = reduce_{j -r-> i} x_j`` is then one plain SpMM over this CSR,
    ``spmm(rel, x).view(num_dst, R, F)`` (the "typed SpMM"): one pass over the edges for all relations,
    and a ``mean`` divides by the per-relation in-degree, the row's length.

    Args:
        indptr: int64[num_dst + 1]; indices: int[E] (CSR over destinations, as :class:`CSR`).
        edge_type: int[E] relation of each edge, in ``[0, num_relations)``.
        num_relations: R >= 1.
        num_src: source columns (default ``num_dst``).
    Returns:
        CSR with ``num_dst * R`` rows and ``num_src`` columns; within a row the edges keep their
        order. Built with one stable counting sort (O(E + num_dst * R)).
    Raises:
        ValueError naming ``edge_type`` for a wrong length or a type outside ``[0, R)``.
    """
    indptr = np.asarray(torch.as_tensor(indptr).cpu(), dtype=np.int64)
    indices = np.asarray(torch.as_tensor(indices).cpu())
    edge_type = np.asarray(torch.as_tensor(edge_type).cpu()).astype(np.int64, copy=False)
    r = int(num_relations)
    n = len(indptr) - 1
    if r < 1:
        raise ValueError(f"num_relations: must be >= 1, got {num_relations}")
    if edge_type.shape != indices.shape:
        raise ValueError(f"edge_type: expected {indices.shape[0]} values (one per edge), got {edge_type.shape}")
    if edge_type.size and (edge_type.min() < 0 or edge_type.max() >= r):
        raise ValueError(f"edge_type: types must lie in [0, {r}), got {edge_type.min()}..{edge_type.max()}")
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    key = dst * r + edge_type
    del dst
    order = np.argsort(key, kind="stable")
    rel_indptr = np.zeros(n * r + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=n * r), out=rel_indptr[1:])
    return CSR(rel_indptr, indices[order].astype(np.int64, copy=False), n if num_src is None else num_src,
               validate=False)


_DENSE_COLUMNS = "_hpc_dense_columns"
#: (lo, width, device) -> (crow int64[R + 1], col int64[R * width]) of the tallest column slice made so far
_SLICE_STRUCTURE: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _slice_structure(rows: int, w: int, lo: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(crow, col)`` of a [rows, *] CSR holding columns ``lo .. lo + w - 1`` of every row densely: prefixes
    (views) of the arrays kept for the tallest such slice so far, which grow by a quarter when outgrown. A
    block's slice and its destination rows' slice are made on every forward pass, and ``col`` has as many
    entries as the slice has values: built once, not per call."""
    key = (int(lo), int(w), str(device))
    have = _SLICE_STRUCTURE.get(key)
    if have is None or have[0].numel() < rows + 1:
        n = max(rows, (have[0].numel() - 1) * 5 // 4 if have is not None else 0)
        have = (torch.arange(n + 1, dtype=torch.int64, device=device) * w,
                (torch.arange(w, dtype=torch.int64, device=device) + lo).repeat(n))
        _SLICE_STRUCTURE[key] = have
    return have[0][:rows + 1], have[1][:rows * w]


def column_slice_csr(values: torch.Tensor, lo: int, num_cols: int) -> torch.Tensor:
    """A sparse CSR tensor [rows, num_cols] holding the dense block ``values`` [rows, w] in columns
    ``lo .. lo + w - 1`` and zeros elsewhere (a rank's column slice of the input features under NFP).

    It is an ordinary CSR tensor (every operation gives the right result), marked so that
    :func:`dense_columns` can hand the dense block to a projection instead: ``x @ W^T`` is then
    ``values @ W[:, lo:lo+w]^T``, a dense GEMM.
    """
    rows, w = int(values.shape[0]), int(values.shape[1])
    crow, col = _slice_structure(rows, w, int(lo), values.device)
    with warnings.catch_warnings():  # torch's one-time "sparse CSR support is in beta" notice
        warnings.simplefilter("ignore", UserWarning)
        x = torch.sparse_csr_tensor(crow, col, values.reshape(-1), (rows, int(num_cols)), check_invariants=False)
    setattr(x, _DENSE_COLUMNS, (int(lo), values))
    return x


def dense_columns(x: torch.Tensor) -> tuple[int, torch.Tensor] | None:
    """``(lo, values)`` of a tensor made by :func:`column_slice_csr`, else None."""
    return getattr(x, _DENSE_COLUMNS, None) if x.layout == torch.sparse_csr else None


def first_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` rows of ``t`` (dense: a view; sparse CSR: a prefix of its arrays; a column-slice CSR
    stays one)."""
    if t.layout == torch.strided:
        return t.narrow(0, 0, n)
    if t.layout == torch.sparse_csr and dense_columns(t) is not None:  # a column slice stays one
        lo, values = dense_columns(t)
        return column_slice_csr(values[:n], lo, t.shape[1])
    if t.layout == torch.sparse_csr:  # the first n rows of a CSR matrix: a prefix of its arrays
        crow = t.crow_indices()[:n + 1]
        nnz = int(crow[-1])
        with warnings.catch_warnings():  # torch's one-time "sparse CSR support is in beta" notice
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(crow, t.col_indices()[:nnz], t.values()[:nnz], (n, t.shape[1]),
                                           check_invariants=False)
    return t[:n]
