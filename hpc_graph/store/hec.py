"""``HistoricalEmbeddingCache``: DistGNN-MB's per-layer cache of remote nodes' embeddings (HEC).

Each rank keeps one cache per layer of the model (layer 0 holds input
features). Owners push the rows of their nodes that other ranks hold as halo
nodes (asynchronous embedding push, :mod:`hpc_graph.engines.minibatch`); a
rank serves its batch's halo nodes from the cache instead of asking the
owner. Entries carry the iteration they were stored at; an entry older than
``lifespan`` iterations is never served and its line is reused first. With
the pushes of iteration k arriving at k + d, a served embedding is at most
``lifespan + d`` iterations old. The cache lives as long as the engine (across
epochs): its iteration clock must not go backwards.

Two replacement policies (:mod:`numba_kernels.cpu.hec`):

* ``ocf`` (default; the paper's *oldest cache-line first*): a store
  overwrites the node's line, else takes an expired or empty line, else
  evicts the oldest line of the whole cache. Lines form an age list behind a
  hash table; a store or lookup is O(1). Memory ``lines * (itemsize dim + 44)``
  plus 16 bytes per hash slot (two to four per line).
* ``set``: a hardware-like ``ways``-way set-associative cache: a node lives
  only in its set, and the *set's* oldest line is evicted. No hash table
  (``lines * (itemsize dim + 12)`` bytes), but a full set evicts younger
  lines than ``ocf`` would.
"""
from __future__ import annotations

import numpy as np
import torch

from numba_kernels.cpu.hec import (hec_lookup, hec_purge, hec_store, ocf_lookup, ocf_purge, ocf_store)

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
POLICIES = ("ocf", "set")


class HistoricalEmbeddingCache:
    """A cache of ``dim``-wide rows keyed by global node id.

    Args:
        size: lines (``set``: rounded up to a multiple of ``ways``).
        dim: row width.
        lifespan: iterations an entry may be served after it was stored.
        ways: lines per set (``set`` only).
        dtype: torch dtype of the rows (float32 or float64).
        policy: ``"ocf"`` or ``"set"`` (module docstring).
    """

    def __init__(self, size: int, dim: int, lifespan: int = 2, ways: int = 8, dtype: torch.dtype = torch.float32,
                 policy: str = "ocf"):
        if size < 1 or dim < 0 or lifespan < 0 or ways < 1:
            raise ValueError(f"HistoricalEmbeddingCache: bad size {size}, dim {dim}, lifespan {lifespan} or "
                             f"ways {ways}")
        if policy not in POLICIES:
            raise ValueError(f"HistoricalEmbeddingCache: policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.ways = int(ways)
        lines = -(-int(size) // self.ways) * self.ways if policy == "set" else int(size)
        self.lifespan, self.dim, self.dtype = int(lifespan), int(dim), dtype
        self.tags = np.full(lines, -1, dtype=np.int64)
        self.stamps = np.zeros(lines, dtype=np.int32)
        self.rows = np.zeros((lines, self.dim), dtype=_NUMPY[dtype])
        if policy == "ocf":
            slots = 1 << max(1, int(2 * lines - 1).bit_length())  # a power of two >= 2 lines
            self.keys = np.full(slots, -1, dtype=np.int64)
            self.slots = np.zeros(slots, dtype=np.int64)
            self.order = np.full((3, max(lines, 3)), -1, dtype=np.int64)  # age list: previous, next; first, last, free
            self.free = np.arange(lines - 1, -1, -1, dtype=np.int64)  # a stack of empty lines, line 0 on top
            self.order[2, 2] = lines
        self.evictions = 0

    @property
    def lines(self) -> int:
        return int(self.tags.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held (tags, stamps, rows and, for ``ocf``, the hash table)."""
        n = self.tags.nbytes + self.stamps.nbytes + self.rows.nbytes
        if self.policy == "ocf":
            n += self.keys.nbytes + self.slots.nbytes + self.order.nbytes + self.free.nbytes
        return int(n)

    def store(self, gids: torch.Tensor, rows: torch.Tensor, now: int) -> None:
        """Store ``rows`` float[m, dim] under ``gids`` int64[m] at iteration ``now`` (in order: of two rows of one
        node, the later one stays)."""
        if rows.shape != (gids.shape[0], self.dim):
            raise ValueError(f"HEC store: rows {tuple(rows.shape)} for {gids.shape[0]} ids of width {self.dim}")
        if gids.shape[0]:
            g = np.ascontiguousarray(gids.detach().cpu().numpy(), dtype=np.int64)
            r = np.ascontiguousarray(rows.detach().cpu().numpy(), dtype=self.rows.dtype)
            if self.policy == "ocf":
                n = ocf_store(self.tags, self.stamps, self.rows, self.order, self.free, self.keys, self.slots, g, r,
                              int(now), self.lifespan)
            else:
                n = hec_store(self.tags, self.stamps, self.rows, self.ways, g, r, int(now), self.lifespan)
            self.evictions += int(n)

    def lookup(self, gids: torch.Tensor, now: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rows float[m, dim], hit bool[m], age int64[m])`` for ``gids`` at iteration ``now``
        (rows of misses are 0, their age -1)."""
        m = int(gids.shape[0])
        out = np.zeros((m, self.dim), dtype=self.rows.dtype)
        hit = np.zeros(m, dtype=np.bool_)
        age = np.full(m, -1, dtype=np.int64)
        if m:
            g = np.ascontiguousarray(gids.detach().cpu().numpy(), dtype=np.int64)
            if self.policy == "ocf":
                ocf_lookup(self.tags, self.stamps, self.rows, self.keys, self.slots, g, int(now), self.lifespan,
                           out, hit, age)
            else:
                hec_lookup(self.tags, self.stamps, self.rows, self.ways, g, int(now), self.lifespan, out, hit, age)
        return torch.from_numpy(out), torch.from_numpy(hit), torch.from_numpy(age)

    def purge(self, now: int) -> int:
        """Empty every expired line; returns the number of valid lines left."""
        if self.policy == "ocf":
            return int(ocf_purge(self.tags, self.stamps, self.order, self.free, self.keys, self.slots, int(now),
                                 self.lifespan))
        return int(hec_purge(self.tags, self.stamps, int(now), self.lifespan))

    def clear(self) -> None:
        """Forget everything."""
        self.tags.fill(-1)
        self.stamps.fill(0)
        if self.policy == "ocf":
            self.keys.fill(-1)
            self.order.fill(-1)
            self.free[:] = np.arange(self.lines - 1, -1, -1)
            self.order[2, 2] = self.lines

    def state_dict(self, now: int) -> dict[str, torch.Tensor]:
        """The lines still valid at iteration ``now``, oldest first (what a checkpoint keeps):
        ``{"lines": int64[v], "gids": int64[v], "stamps": int64[v], "rows": float[v, dim]}``."""
        if self.policy == "ocf":  # the age list, oldest first
            chain, line = [], int(self.order[2, 0])
            while line >= 0:
                chain.append(line)
                line = int(self.order[1, line])
            live = np.asarray(chain, dtype=np.int64)
        else:
            live = np.flatnonzero(self.tags >= 0)
            live = live[np.argsort(self.stamps[live], kind="stable")]
        live = live[int(now) - self.stamps[live].astype(np.int64) <= self.lifespan]
        return {"lines": torch.from_numpy(live.copy()), "gids": torch.from_numpy(self.tags[live].copy()),
                "stamps": torch.from_numpy(self.stamps[live].astype(np.int64)),
                "rows": torch.from_numpy(self.rows[live].copy())}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Empty the cache, then hold ``state``'s lines: ``set`` puts them back where they were, ``ocf`` stores
        them oldest first (the same age order)."""
        self.clear()
        gids, stamps, rows = state["gids"], state["stamps"], state["rows"]
        if self.policy == "set":
            lines = state["lines"].numpy()
            self.tags[lines] = gids.numpy()
            self.stamps[lines] = stamps.numpy().astype(np.int32)
            self.rows[lines] = rows.numpy().astype(self.rows.dtype)
            return
        for s in torch.unique_consecutive(stamps).tolist():
            sel = stamps == s
            self.store(gids[sel], rows[sel].to(self.dtype), int(s))
