"""``HistoricalEmbeddingCache``: DistGNN-MB's per-layer cache of remote nodes' embeddings (HEC).

Each rank keeps one cache per inner layer of the model. Owners push the
embeddings of their nodes that other ranks hold as halo nodes (asynchronous
embedding push, :mod:`hpc_graph.engines.minibatch`); a rank serves its batch's
halo nodes from the cache instead of asking the owner. Entries carry the
iteration they were stored at; an entry older than ``lifespan`` iterations is
never served and its line is reused first. With the pushes of iteration k
arriving at k + d, a served embedding is at most ``lifespan + d`` iterations
old.

The lines are organised like a hardware cache (:mod:`numba_kernels.cpu.hec`):
``size`` lines in sets of ``ways``; a node lives only in its set. A store
overwrites the node's line, else takes an empty or expired line of the set,
else evicts the set's oldest line. Memory: ``size * (4 dim + 12)`` bytes
for float32 rows.
"""
from __future__ import annotations

import numpy as np
import torch

from numba_kernels.cpu.hec import hec_lookup, hec_purge, hec_store

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


class HistoricalEmbeddingCache:
    """A cache of ``dim``-wide rows keyed by global node id.

    Args:
        size: lines (rounded up to a multiple of ``ways``).
        dim: row width.
        lifespan: iterations an entry may be served after it was stored.
        ways: lines per set.
        dtype: torch dtype of the rows (float32 or float64).
    """

    def __init__(self, size: int, dim: int, lifespan: int = 2, ways: int = 8, dtype: torch.dtype = torch.float32):
        if size < 1 or dim < 0 or lifespan < 0 or ways < 1:
            raise ValueError(f"HistoricalEmbeddingCache: bad size {size}, dim {dim}, lifespan {lifespan} or "
                             f"ways {ways}")
        self.ways = int(ways)
        lines = -(-int(size) // self.ways) * self.ways
        self.lifespan, self.dim, self.dtype = int(lifespan), int(dim), dtype
        self.tags = np.full(lines, -1, dtype=np.int64)
        self.stamps = np.zeros(lines, dtype=np.int32)
        self.rows = np.zeros((lines, self.dim), dtype=_NUMPY[dtype])
        self.evictions = 0

    @property
    def lines(self) -> int:
        return int(self.tags.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held (tags, stamps and rows)."""
        return int(self.tags.nbytes + self.stamps.nbytes + self.rows.nbytes)

    def store(self, gids: torch.Tensor, rows: torch.Tensor, now: int) -> None:
        """Store ``rows`` float[m, dim] under ``gids`` int64[m] at iteration ``now``."""
        if rows.shape != (gids.shape[0], self.dim):
            raise ValueError(f"HEC store: rows {tuple(rows.shape)} for {gids.shape[0]} ids of width {self.dim}")
        if gids.shape[0]:
            g = np.ascontiguousarray(gids.detach().cpu().numpy(), dtype=np.int64)
            r = np.ascontiguousarray(rows.detach().cpu().numpy(), dtype=self.rows.dtype)
            self.evictions += int(hec_store(self.tags, self.stamps, self.rows, self.ways, g, r, int(now),
                                            self.lifespan))

    def lookup(self, gids: torch.Tensor, now: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rows float[m, dim], hit bool[m], age int64[m])`` for ``gids`` at iteration ``now``
        (rows of misses are 0, their age -1)."""
        m = int(gids.shape[0])
        out = np.zeros((m, self.dim), dtype=self.rows.dtype)
        hit = np.zeros(m, dtype=np.bool_)
        age = np.full(m, -1, dtype=np.int64)
        if m:
            g = np.ascontiguousarray(gids.detach().cpu().numpy(), dtype=np.int64)
            hec_lookup(self.tags, self.stamps, self.rows, self.ways, g, int(now), self.lifespan, out, hit, age)
        return torch.from_numpy(out), torch.from_numpy(hit), torch.from_numpy(age)

    def purge(self, now: int) -> int:
        """Empty every expired line; returns the number of valid lines left."""
        return int(hec_purge(self.tags, self.stamps, int(now), self.lifespan))

    def clear(self) -> None:
        """Forget everything (a new epoch starts from an empty cache)."""
        self.tags.fill(-1)
        self.stamps.fill(0)
