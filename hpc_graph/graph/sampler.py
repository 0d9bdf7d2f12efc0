"""``NeighborSampler``: exact neighbour sampling on a partitioned graph, shared by the sampled engines.

A rank samples the in-edges of the nodes it owns from its partition's CSR, and
asks the owners for the rest (one ``alltoallv`` of ids, one of answers). The
sample of a node is drawn by :func:`numba_kernels.cpu.sample.sample_neighbors`
from a key made of ``(seed, epoch, layer)`` and the node's source-dataset id,
over its in-neighbours in source-dataset id order, so it never depends on the
rank that draws it, the thread count or the partitioning: ``minibatch`` and
every ``apt`` strategy train on the same samples.

Counters: ``bytes_sent`` (payload bytes of remote sampling) and ``messages``
(``alltoallv`` calls), both cumulative.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from hpc_graph.options import FANOUTS, int_spec, option

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_key(*parts: int) -> int:
    """A 64-bit key from integers (seed, epoch, layer, ...): the sampler's and the batch orders' RNG keys."""
    h = 0x5A17_B10C
    for v in parts:
        h = _splitmix64(h ^ (int(v) & _MASK64))
    return h


def check_fanouts(fanouts: Any, engine: str, min_layers: int = 1) -> tuple[int, ...]:
    """``sampler.fanouts`` as a tuple of ints (positive, or -1 for every neighbour), at least ``min_layers``
    of them; ``ValueError`` naming the option otherwise."""
    if (not isinstance(fanouts, (list, tuple)) or len(fanouts) < max(min_layers, 1)
            or any(isinstance(f, bool) or not isinstance(f, int) or (f < 1 and f != -1) for f in fanouts)):
        need = f"at least {min_layers} " if min_layers > 1 else "a non-empty list of "
        raise ValueError(f"sampler.fanouts: engine {engine!r} needs {need}positive integers (or -1), one per "
                         f"layer, got {fanouts!r}")
    return tuple(int(f) for f in fanouts)


#: why a sampled block has no per-edge field the model did not ask for
NOT_CARRIED = {k: (f"message function: the sampled blocks carry no edge {k}s; declare edge_fields = ('{k}',) on the "
                   "model (the sampler carries only the per-edge fields a model asks for)") for k in ("weight", "type")}


def block_fields(fields: dict[str, np.ndarray], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A block's per-edge fields as tensors: weights in the training dtype, types int64."""
    return {k: torch.from_numpy(v).to(dtype) if k == "weight" else torch.from_numpy(v) for k, v in fields.items()}


def block_csr(counts: np.ndarray, col: np.ndarray, num_src: int) -> Any:
    """The CSR of a sampled block: ``counts[i]`` sampled in-edges of destination ``i``, columns ``col``."""
    from hpc_graph.ops.csr import CSR

    indptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return CSR(torch.from_numpy(indptr), torch.from_numpy(np.asarray(col, dtype=np.int64)), int(num_src),
               validate=False)


def relabel(dst: np.ndarray, nbrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(src, col)`` of a block: ``src`` = ``dst`` (distinct) then each new id of ``nbrs`` in order of first
    appearance; ``src[col[i]] == nbrs[i]``."""
    from numba_kernels.cpu.sample import unique_relabel

    src = np.empty(dst.size + nbrs.size, dtype=np.int64)
    col = np.empty(nbrs.size, dtype=np.int64)
    return src[:unique_relabel(dst, nbrs, src, col)].copy(), col


class NeighborSampler:
    """Uniform neighbour sampling without replacement over a :class:`~hpc_graph.graph.dist_graph.DistGraph`.

    Args:
        dg: this rank's partition (owned CSR rows, global ids, source-dataset ids).
        comm: the communicator (remote sampling is collective).
    """

    def __init__(self, dg: Any, comm: Any):
        self.dg, self.comm = dg, comm
        self.first, self.num_owned = int(dg.first_gid), int(dg.num_owned)
        self.node_ranges = np.asarray(dg.node_ranges, dtype=np.int64)
        g = dg.local
        self.indptr = g.indptr.cpu().numpy().astype(np.int64)
        order = self._neighbour_order()
        self.nbrs = np.ascontiguousarray(dg.local_gid.cpu().numpy()[g.indices.cpu().numpy()[order]])
        self.orig = dg.orig_id.cpu().numpy().astype(np.int64)
        self.bytes_sent = 0
        self.messages = 0
        # with keep_served, the last :meth:`remote` call's ``(ids, counts, neighbours)`` it sampled for the other
        # ranks (in the order asked, every asking rank's in turn; None until then)
        self.keep_served = False
        self.served: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # per-edge dataset fields carried with the sampled edges (:meth:`carry`), in ``nbrs``' order
        self.edge_data: dict[str, np.ndarray] = {}
        self._pos: np.ndarray | None = None

    def carry(self, names: tuple[str, ...]) -> dict[str, str]:
        """Carry the per-edge fields ``names`` (``"weight"``: ``/graph/edge_weight``, ``"type"``:
        ``/graph/edge_type``) with every sampled edge from now on (:meth:`hop` with ``fields``); remote
        answers grow by 8 bytes per edge and field. Returns ``{name: why}`` for the fields this partition lacks
        (not carried)."""
        dg, g = self.dg, self.dg.local
        order = self._neighbour_order()
        missing, data = {}, {}
        for name in names:
            if name == "weight" and g.edge_weight is not None:
                data[name] = g.edge_weight.cpu().numpy().astype(np.float64)[order]
            elif name == "type" and dg.edge_type is not None:
                data[name] = dg.edge_type.astype(np.int64)[order]
            elif name in ("weight", "type"):
                missing[name] = f"the dataset has no /graph/edge_{name}"
            else:
                raise ValueError(f"edge_fields: unknown per-edge field {name!r} (known: weight, type)")
        self.edge_data = data
        self._pos = np.arange(len(self.nbrs), dtype=np.int64) if data else None
        return missing

    def _neighbour_order(self) -> np.ndarray:
        """int64[E]: the local CSR's edges with each row's neighbours in source-dataset id order (``nbrs``'
        order)."""
        dg = self.dg
        cols = dg.local.indices.cpu().numpy()
        rows = np.repeat(np.arange(self.num_owned, dtype=np.int64), np.diff(self.indptr))
        return np.lexsort((dg.local_orig_id.cpu().numpy()[cols], rows))

    def owner(self, gids: np.ndarray) -> np.ndarray:
        """int64 owning rank of each global id."""
        return np.searchsorted(self.node_ranges, gids, side="right") - 1

    def is_owned(self, gids: np.ndarray) -> np.ndarray:
        return (gids >= self.first) & (gids < self.first + self.num_owned)

    def degree(self, gids: np.ndarray) -> np.ndarray:
        """In-degrees of owned nodes ``gids``."""
        rows = gids - self.first
        return self.indptr[rows + 1] - self.indptr[rows]

    def local(self, gids: np.ndarray, fanout: int, key: int, fields: bool = False) -> tuple:
        """``(counts, nbrs, degree)`` of owned nodes ``gids`` (neighbours as global ids, flat, node by node);
        with ``fields`` a fourth item, ``{name: per-edge values}`` of the carried fields (:meth:`carry`)."""
        from numba_kernels.cpu.sample import sample_neighbors, sample_width

        carried = fields and self._pos is not None
        if gids.size == 0:
            empty = np.zeros(0, np.int64)
            out = (empty, empty, empty)
            return out + ({k: v[:0] for k, v in self.edge_data.items()},) if fields else out
        rows = gids - self.first
        width = sample_width(self.indptr, rows, fanout)
        counts = np.empty(rows.shape[0], dtype=np.int64)
        slots = np.empty(rows.shape[0] * max(width, 1), dtype=np.int64)
        # the chosen positions depend on (key, node, degree, fanout) only: sampling positions picks the same edges
        sample_neighbors(self.indptr, self._pos if carried else self.nbrs, rows,
                         np.ascontiguousarray(self.orig[rows]), fanout, np.uint64(key), counts, slots)
        keep = (np.arange(max(width, 1))[None, :] < counts[:, None]).reshape(-1)
        deg = self.indptr[rows + 1] - self.indptr[rows]
        if not carried:
            return (counts, slots[keep], deg) + (({},) if fields else ())
        pos = slots[keep]
        return counts, self.nbrs[pos], deg, {k: v[pos] for k, v in self.edge_data.items()}

    def remote(self, gids: np.ndarray, fanout: int, key: int, fields: bool = False) -> tuple:
        """Sample other ranks' nodes at their owners (collective: one alltoallv of ids, one of answers).

        The answer to each asking rank is ``[degrees, counts, neighbours, carried fields]`` of the nodes it asked
        (2 + count * (1 + fields) int64 per node). ``fields``: as for :meth:`local`.
        """
        comm, size = self.comm, int(self.comm.size)
        owner = self.owner(gids)
        order = np.argsort(owner, kind="stable")
        b0 = comm.bytes_sent
        ask = np.bincount(owner, minlength=size).astype(np.int64)
        asked, asked_counts = comm.alltoallv(torch.from_numpy(gids[order]), ask)
        c, nbrs, deg, carried = self.local(asked.numpy(), fanout, key, fields=True)
        if not fields:
            carried = {}
        if self.keep_served:
            self.served = (asked.numpy(), c, nbrs)
        names = sorted(carried)
        answer, sizes = _pack_answers(deg, c, [nbrs] + [carried[k].view(np.int64) for k in names], asked_counts)
        got, got_sizes = comm.alltoallv(torch.from_numpy(answer), sizes)
        self.bytes_sent += int(comm.bytes_sent - b0)
        self.messages += 2
        d_o, c_o, per_edge = _unpack_answers(got.numpy(), ask, got_sizes, 1 + len(names))
        n_o = per_edge[0]
        out_c = np.empty(gids.size, np.int64)
        out_d = np.empty(gids.size, np.int64)
        out_c[order], out_d[order] = c_o, d_o
        src_start = np.cumsum(c_o) - c_o  # answer j's neighbours in n_o
        dst_start = np.cumsum(out_c) - out_c  # node i's neighbours in the result
        flat = np.empty(int(out_c.sum()), np.int64)
        at = np.repeat(dst_start[order] - src_start, c_o) + np.arange(flat.size)
        if flat.size:
            flat[at] = n_o
        if not fields:
            return out_c, flat, out_d
        got_fields = {}
        for name, values in zip(names, per_edge[1:]):
            arr = np.empty(flat.size, self.edge_data[name].dtype)
            arr[at] = values.view(arr.dtype)
            got_fields[name] = arr
        return out_c, flat, out_d, got_fields

    def hop(self, dst: np.ndarray, fanout: int, key: int, exact: bool = True, fields: bool = False) -> tuple:
        """Sampled in-neighbours of every node of ``dst`` (``counts``, flat ``nbrs`` in dst order, degrees;
        with ``fields`` a fourth item, the carried per-edge fields in ``nbrs``' order).

        ``exact``: remote nodes are sampled by their owners (collective); otherwise every node of
        ``dst`` must be owned.
        """
        if not exact or self.comm.size == 1:
            return self.local(dst, fanout, key, fields)
        mine = self.is_owned(dst)
        lc, ln, ld, lf = self.local(dst[mine], fanout, key, fields=True)
        rc, rn, rd, rf = self.remote(dst[~mine], fanout, key, fields=True)
        counts = np.empty(dst.size, np.int64)
        deg = np.empty(dst.size, np.int64)
        counts[mine], counts[~mine], deg[mine], deg[~mine] = lc, rc, ld, rd
        nbrs = np.empty(int(counts.sum()), np.int64)
        out_f = {k: np.empty(nbrs.size, v.dtype) for k, v in lf.items()} if fields else {}
        starts = np.cumsum(counts) - counts
        for sel, flat, cnt, per in ((np.flatnonzero(mine), ln, lc, lf), (np.flatnonzero(~mine), rn, rc, rf)):
            if sel.size:
                at = np.repeat(starts[sel] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
                nbrs[at] = flat
                for k in out_f:
                    out_f[k][at] = per[k]
        return (counts, nbrs, deg, out_f) if fields else (counts, nbrs, deg)


def _pack_answers(deg: np.ndarray, counts: np.ndarray, per_edge: list[np.ndarray], per_rank: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The answers to each asking rank ``p`` (``per_rank[p]`` nodes, in order): ``[degrees, counts, then each
    per-edge int64 array (neighbours, carried fields)]`` of its nodes, concatenated over ``p``; int64 sizes per
    asking rank (``2 + count * len(per_edge)`` per node)."""
    bounds = np.concatenate([[0], np.cumsum(per_rank)]).astype(np.int64)
    edge_bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)[bounds]
    parts = []
    for p in range(per_rank.size):
        lo, hi = bounds[p], bounds[p + 1]
        parts += [deg[lo:hi], counts[lo:hi]] + [a[edge_bounds[p]:edge_bounds[p + 1]] for a in per_edge]
    out = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return out, (2 * np.diff(bounds) + len(per_edge) * np.diff(edge_bounds)).astype(np.int64)


def _unpack_answers(buf: np.ndarray, asked: np.ndarray, sizes: np.ndarray, arrays: int = 1
                    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Inverse of :func:`_pack_answers` at the asking rank: ``asked[q]`` nodes asked of rank ``q`` and the
    ``sizes[q]`` int64 received from it -> ``(degrees, counts, [each of the ``arrays`` per-edge arrays])``, in
    the order asked."""
    degs, cnts, per, off = [], [], [[] for _ in range(arrays)], 0
    for q in range(asked.size):
        n, seg = int(asked[q]), buf[off:off + int(sizes[q])]
        degs.append(seg[:n])
        cnts.append(seg[n:2 * n])
        e = (seg.size - 2 * n) // arrays
        for i in range(arrays):
            per[i].append(seg[2 * n + i * e:2 * n + (i + 1) * e])
        off += int(sizes[q])
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(degs), cat(cnts), [cat(xs) for xs in per]


class SeedSchedule:
    """Which training nodes each rank takes as seeds at each iteration of an epoch.

    Every training node of every rank is a seed exactly once per epoch. Every rank runs the same number of
    iterations: the largest ``ceil(train nodes / batch_size)`` over the ranks, agreed by an all-reduce when the
    schedule is made (construct it on every rank). A rank spreads its ``t`` training nodes evenly over them
    (``ceil(t / iterations)`` seeds in the first ``t % iterations`` iterations, ``floor`` in the rest; never more
    than ``batch_size``), in an order drawn from ``(seed, epoch, rank)``: a rank with fewer training nodes runs
    smaller batches, one with none runs empty ones, and the trainer divides every iteration's loss by the
    iteration's global batch (:meth:`batch_sizes`). On one rank, ``t = 100`` and ``batch_size = 64`` give two
    batches of 50.

    Args:
        train_idx: int64[t] local ids of the rank's training nodes.
        batch_size: seeds per rank per iteration.
        seed: the training seed.
        comm: the communicator.
    """

    def __init__(self, train_idx: torch.Tensor, batch_size: int, seed: int, comm: Any):
        self.train_idx, self.batch_size, self.seed, self.comm = train_idx, int(batch_size), int(seed), comm
        mine = torch.tensor([-(-self.train_idx.numel() // self.batch_size)], dtype=torch.float64)
        if comm.size > 1:
            comm.allreduce_(mine, "max")
        self._iterations = int(mine.item())
        n, i = int(self.train_idx.numel()), max(self._iterations, 1)
        sizes = np.full(i, n // i, dtype=np.int64)
        sizes[:n % i] += 1
        self._offsets = np.zeros(i + 1, dtype=np.int64)
        np.cumsum(sizes, out=self._offsets[1:])

    def iterations(self) -> int:
        """Iterations of every rank per epoch (agreed when the schedule was made; not collective)."""
        return self._iterations

    def sizes(self) -> list[int]:
        """This rank's seeds at each iteration of an epoch (they add up to its training nodes)."""
        return np.diff(self._offsets)[:self._iterations].tolist()

    def span(self, iteration: int) -> tuple[int, int]:
        """``(start, stop)`` of iteration ``iteration``'s seeds in :meth:`order`."""
        if not 0 <= iteration < self._iterations:
            raise IndexError(f"SeedSchedule: iteration {iteration} of an epoch of {self._iterations}")
        return int(self._offsets[iteration]), int(self._offsets[iteration + 1])

    def order(self, epoch: int) -> torch.Tensor:
        """The rank's training nodes (local ids) in epoch ``epoch``'s order."""
        gen = torch.Generator().manual_seed(sample_key(self.seed, epoch, self.comm.rank) & (2**63 - 1))
        return self.train_idx[torch.randperm(self.train_idx.numel(), generator=gen)]

    def batch_sizes(self, iterations: int) -> tuple[list[int], list[float]]:
        """This rank's seeds per iteration and the global (all-reduced) batch of every iteration."""
        if iterations != self._iterations:
            raise ValueError(f"SeedSchedule: an epoch has {self._iterations} iterations, not {iterations}")
        mine = self.sizes()
        total = torch.tensor(mine, dtype=torch.float64)
        if self.comm.size > 1 and iterations:
            self.comm.allreduce_(total)
        return mine, total.tolist()


@dataclasses.dataclass
class SamplerOptions:
    """The sampling options of the engines that train on sampled mini-batches (``minibatch``, ``apt``)."""
    fanouts: tuple = option((15, 10, 5), FANOUTS,
                            "Neighbours sampled per node at each hop, seed hop first (PyG's order: `[15, 10, 5]` "
                            "gives each seed 15 neighbours, and the input layer's nodes 5); -1 takes all. One "
                            "entry per message-passing layer of the model: `model.num_layers` (`gcn`, `sage`, `gat`, "
                            "`gcn2`, `jknet`) or K = `model.hops` (`appnp`, `sgc`, `dagnn`).", section="sampler")
    batch_size: int = option(1024, int_spec(1), "Seed (training) nodes per rank per iteration.", section="sampler")


def sampled_model_problem(model: Any, mc: Any) -> str | None:
    """For the engines that train on sampled blocks: the model must run on them (its registry entry's
    ``sampled``)."""
    if getattr(model, "sampled", True):
        return None
    return f"{mc.name!r} needs the whole graph at every layer (a full-graph engine)"


def check_fanouts_for_model(fanouts: Any, model: Any, mc: Any) -> None:
    """One fan-out per message-passing layer of the model (``ConfigError`` naming ``sampler.fanouts``)."""
    from hpc_graph.options import ConfigError

    layers = model.message_passing_layers(mc)
    hops_models = ("appnp", "sgc", "dagnn")
    if mc.name not in hops_models:
        field = "model.num_layers"
    else:
        field = "model.hops" if mc.hops is not None else f"model.hops, the default of {mc.name!r}"
    if len(fanouts) != layers:
        raise ConfigError(f"sampler.fanouts: one fan-out per model layer is needed ({layers} for {field}), "
                          f"got {list(fanouts)}")
