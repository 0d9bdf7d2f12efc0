"""Partitioned dataset format (version 1): a directory with ``partition.json`` and one HDF5 file per part.

Nodes are relabelled so that part ``p`` owns the contiguous new-global-id range
``[node_ranges[p], node_ranges[p+1])``; owner lookup is
``searchsorted(node_ranges, gid, side="right") - 1``. Every edge ``j -> i`` is
stored once, in the part that owns its destination ``i``.

Local ids of part ``p``: owned nodes ``0 .. num_owned-1`` (new gid minus
``node_ranges[p]``), then halo nodes ``num_owned .. num_owned+num_halo-1`` in
the order of ``halo_gid`` (sorted, hence grouped by owner). The halo nodes
owned by part ``q`` are ``halo_gid[halo_offsets[q]:halo_offsets[q+1]]`` and
form columns ``num_owned + halo_offsets[q] ..`` of the local CSR: exactly the
SAR block G_{p,q}.

The implementation of writers and readers lives here too (see ``read_partition``,
``write_partition``, ``PartitionBook``).
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Partition:
    """One part of a partitioned dataset, in memory (NumPy arrays).

    Fields (P = num_parts, n = num_owned, h = num_halo, E_p = edges into owned nodes):

    * ``part_id`` int, ``num_parts`` int, ``node_ranges`` int64[P+1]
    * ``orig_id`` int64[n]: id of each owned node in the source dataset
    * ``halo_gid`` int64[h]: new global ids of halo nodes, sorted ascending
    * ``halo_offsets`` int64[P+1]: halo nodes owned by q are ``halo_gid[halo_offsets[q]:halo_offsets[q+1]]``
      (empty for q == part_id)
    * ``indptr`` int64[n+1], ``indices`` int64[E_p]: CSR over owned destinations,
      columns are local ids in ``[0, n+h)``
    * ``edge_weight`` float32[E_p] | None, ``edge_type`` int16[E_p] | None
    * ``feat`` float32[n, F] | None, ``label`` int64[n] | None,
      ``train_mask`` / ``val_mask`` / ``test_mask`` bool[n] | None
    * ``send_offsets`` int64[P+1], ``send_lid`` int64[S]: owned local ids to send to
      part q are ``send_lid[send_offsets[q]:send_offsets[q+1]]``, in the order of q's
      halo block for p (ascending gid)
    * ``num_classes`` int, ``global_num_nodes`` int, ``global_num_edges`` int, ``name`` str
    """

    part_id: int
    num_parts: int
    node_ranges: np.ndarray
    orig_id: np.ndarray
    halo_gid: np.ndarray
    halo_offsets: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    send_offsets: np.ndarray
    send_lid: np.ndarray
    edge_weight: np.ndarray | None = None
    edge_type: np.ndarray | None = None
    feat: np.ndarray | None = None
    label: np.ndarray | None = None
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    num_classes: int = 0
    global_num_nodes: int = 0
    global_num_edges: int = 0
    name: str = "graph"

    @property
    def num_owned(self) -> int:
        return int(self.node_ranges[self.part_id + 1] - self.node_ranges[self.part_id])

    @property
    def num_halo(self) -> int:
        return int(len(self.halo_gid))

    @property
    def first_gid(self) -> int:
        return int(self.node_ranges[self.part_id])
