"""``FeatureStore``: node features (and in-degrees) by global id, wherever they live.

A rank owns a contiguous range of global ids (the partition book). A
:meth:`FeatureStore.fetch` of any ids is served from the owned rows, from a
static cache of remote rows (filled once by :meth:`FeatureStore.cache`), and
for the rest by two ``alltoallv`` calls: the ids go to their owners, the rows
(with each node's global in-degree) come back. Byte counts are exact and
known in advance: ``8`` bytes per requested id, ``F * itemsize + 8`` per
returned row; ``stats()`` reports them. Every rank must call :meth:`fetch`
together (it is collective, even with nothing to ask).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


class FeatureStore:
    """Features and in-degrees of a rank's owned nodes, plus cached and fetched remote rows.

    Args:
        feat: float[n, F] rows of the owned nodes (global ids ``first .. first+n-1``).
        degree: int64[n] global in-degree of the owned nodes.
        node_ranges: int64[P+1] partition book (part p owns ``[node_ranges[p], node_ranges[p+1])``).
        comm: the communicator (rank = part).
    """

    def __init__(self, feat: torch.Tensor, degree: torch.Tensor, node_ranges: np.ndarray, comm: Any):
        self.feat, self.degree, self.comm = feat, degree.to(torch.int64), comm
        self.node_ranges = np.asarray(node_ranges, dtype=np.int64)
        self.rank = int(comm.rank)
        self.first = int(self.node_ranges[self.rank])
        self.num_owned = int(self.node_ranges[self.rank + 1] - self.first)
        if feat.shape[0] != self.num_owned or degree.shape[0] != self.num_owned:
            raise ValueError(f"FeatureStore: {feat.shape[0]} feature rows and {degree.shape[0]} degrees for "
                             f"{self.num_owned} owned nodes")
        self.width = int(feat.shape[1])
        self._row_bytes = self.width * feat.element_size() + 8
        self.cache_gid = np.zeros(0, dtype=np.int64)  # sorted
        self.cache_feat = feat.new_zeros((0, self.width))
        self.cache_degree = torch.zeros(0, dtype=torch.int64)
        self.reset_stats()

    def reset_stats(self) -> None:
        self._stats = {"owned": 0, "cached": 0, "fetched": 0, "served": 0, "bytes_sent": 0}

    def stats(self) -> dict[str, int]:
        """Rows served from owned data, from the cache, fetched from owners, served to other ranks,
        and the payload bytes this rank sent for fetches (ids and rows)."""
        return dict(self._stats)

    # ------------------------------------------------------------------ fetch
    def owner(self, gids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.node_ranges, gids, side="right") - 1

    def cache(self, gids: torch.Tensor | np.ndarray) -> None:
        """Fetch the rows of ``gids`` once and keep them (a static cache of remote rows; collective)."""
        g = np.unique(np.asarray(gids, dtype=np.int64))
        g = g[self.owner(g) != self.rank] if g.size else g
        feat, degree = self.fetch(torch.from_numpy(g))
        self.cache_gid, self.cache_feat, self.cache_degree = g, feat, degree
        self.reset_stats()

    def fetch(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(float[m, F], int64[m])``: features and global in-degrees of ``gids`` int64[m] (collective)."""
        g = np.ascontiguousarray(gids.detach().cpu().numpy(), dtype=np.int64)
        m = g.shape[0]
        out = self.feat.new_empty((m, self.width))
        deg = torch.empty(m, dtype=torch.int64)
        own = self.owner(g) if m else np.zeros(0, np.int64)
        mine = own == self.rank
        if mine.any():
            idx = torch.from_numpy(np.flatnonzero(mine))
            local = torch.from_numpy(g[mine] - self.first)
            # index_select / index_copy_, not advanced indexing: 4x faster on feature rows
            out.index_copy_(0, idx, self.feat.index_select(0, local))
            deg.index_copy_(0, idx, self.degree.index_select(0, local))
        rest = np.flatnonzero(~mine)
        if self.cache_gid.size and rest.size:
            pos = np.searchsorted(self.cache_gid, g[rest])
            pos_c = np.minimum(pos, self.cache_gid.size - 1)
            hit = self.cache_gid[pos_c] == g[rest]
            if hit.any():
                idx = torch.from_numpy(rest[hit])
                at = torch.from_numpy(pos_c[hit])
                out.index_copy_(0, idx, self.cache_feat.index_select(0, at))
                deg.index_copy_(0, idx, self.cache_degree.index_select(0, at))
                self._stats["cached"] += int(hit.sum())
            rest = rest[~hit]
        self._stats["owned"] += int(mine.sum())
        self._remote(g, own, rest, out, deg)
        return out, deg

    def _remote(self, g: np.ndarray, own: np.ndarray, rest: np.ndarray, out: torch.Tensor,
                deg: torch.Tensor) -> None:
        """Ask the owners for rows ``rest`` of ``g`` (two alltoallv; every rank takes part)."""
        comm, size = self.comm, int(self.comm.size)
        if size == 1:
            if rest.size:
                raise ValueError(f"FeatureStore: global id {int(g[rest[0]])} is not owned by this single rank")
            return
        order = rest[np.argsort(own[rest], kind="stable")]
        counts = np.bincount(own[order], minlength=size).astype(np.int64)
        before = comm.bytes_sent
        asked, asked_counts = comm.alltoallv(torch.from_numpy(g[order]), counts)
        # answer: each row packed as [feature bytes | int64 degree bytes]
        lid = asked - self.first
        if asked.numel() and (int(lid.min()) < 0 or int(lid.max()) >= self.num_owned):
            raise RuntimeError(f"FeatureStore: rank {self.rank} was asked for ids it does not own")
        packed = torch.empty((asked.shape[0], self._row_bytes), dtype=torch.uint8)
        fb = self.width * self.feat.element_size()
        if asked.numel():
            packed[:, :fb] = self.feat.index_select(0, lid).view(torch.uint8).view(-1, fb) if fb else packed[:, :0]
            packed[:, fb:] = self.degree.index_select(0, lid).view(torch.uint8).view(-1, 8)
        got, _ = comm.alltoallv(packed, asked_counts)
        self._stats["bytes_sent"] += int(comm.bytes_sent - before)
        self._stats["served"] += int(asked.shape[0])
        self._stats["fetched"] += int(order.size)
        if order.size:
            idx = torch.from_numpy(order)
            # copies start at offset 0, as a dtype view needs
            rows = got[:, :fb].clone(memory_format=torch.contiguous_format)
            if fb:
                out.index_copy_(0, idx, rows.view(self.feat.dtype).view(-1, self.width))
            deg.index_copy_(0, idx, got[:, fb:].clone(memory_format=torch.contiguous_format).view(torch.int64).view(-1))
