"""``minibatch`` engine: sampled mini-batch training on a partitioned graph (DistGNN-MB).

Each rank trains on its own partition's training nodes: per iteration it takes
``sampler.batch_size`` seeds, samples a block per model layer outwards from
them (:mod:`numba_kernels.cpu.sample`: uniform without replacement, keyed by
(seed, epoch, layer, node id), so a node's sample does not depend on the
rank, the thread count or the partitioning), and runs the model on the
blocks (:class:`~hpc_graph.graph.block.BlockStack`). Every training node is a
seed once per epoch: every rank runs the same number of iterations (the
largest, agreed by an all-reduce; :class:`~hpc_graph.graph.sampler.SeedSchedule`)
with its seeds spread evenly over them; the trainer normalises each iteration's loss by the global batch and all-reduces
the gradients. Validation and test accuracy come from exact full-neighbour,
layer-wise inference over the halo exchange (``engine.graph`` is the ``dp``
graph of the partition).

Remote neighbours (``hec.mode``), i.e. sampled neighbours owned by another rank:

* ``exact``: their in-edges are sampled by their owners (one ``alltoallv`` per
  hop; the same key gives the same sample as locally) and every input feature
  is fetched from its owner (:class:`~hpc_graph.store.FeatureStore`). Each
  batch is computed exactly as one process holding the whole graph would
  (DistDGL-like); the reference for accuracy.
* ``drop``: they are left out of every block (local-only training).
* ``hec``: DistGNN-MB. Their rows at layer ``l`` (input features at layer 0,
  embeddings above) come from the rank's historical embedding cache for ``l``
  (:class:`~hpc_graph.store.HistoricalEmbeddingCache`), and a miss leaves the
  neighbour out of that block (mean aggregation is then over the neighbours
  that remain; sums are rescaled by the node's degree over their number); no
  feature is fetched. The caches are filled by asynchronous embedding push:
  when layer ``l``'s input rows of a rank's own nodes are known (the batch's
  input features; a layer's input during the forward pass), those nodes that
  are halo nodes of peer q (the partition's send lists) are pushed to q, at
  most ``hec.push_limit`` per peer and layer, drawn at random weighted by
  degree. A push made at iteration k is stored at k + ``hec.delay``; the last
  ``delay`` iterations of an epoch push nothing, so an epoch boundary (a
  checkpoint) has nothing in flight. The caches are made once and live across
  epochs (their clock counts iterations since the first epoch); a checkpoint
  keeps each rank's valid lines, so a resumed run serves what the
  uninterrupted one would.

Per-epoch ``engine_stats``: iterations, per-layer HEC hit rate (layer 0 first) and age
histogram, pushed rows, sampled edges, bytes by operation (feature fetch,
remote sampling, pushes) and the seconds spent sampling, fetching and pushing.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np
import torch

from hpc_graph.comm.communicator import MAX_CHANNEL
from hpc_graph.engines.base import Batch, SeedEngine
from hpc_graph.graph.block import Block, BlockStack
from hpc_graph.graph.dist_graph import load_sampled_engine_data
from hpc_graph.graph.halo_graph import HaloGraph
from hpc_graph.graph.sampler import (NOT_CARRIED, NeighborSampler, SamplerOptions, SeedSchedule, block_csr,
                                     block_fields, check_fanouts, check_fanouts_for_model, sample_key,
                                     sampled_model_problem)
from hpc_graph.options import choice_spec, int_spec, option
from hpc_graph.store.feature_store import FeatureStore
from hpc_graph.store.hec import POLICIES, HistoricalEmbeddingCache

log = logging.getLogger(__name__)

MODES = ("exact", "drop", "hec")
# pushes of layer l travel on exchange channel l + 1 (one message per peer: length, ids, rows)


@dataclasses.dataclass
class MinibatchOptions(SamplerOptions):
    """``minibatch``'s options: sampling (section ``sampler``), remote neighbours and DistGNN-MB's historical
    embedding cache (section ``hec``)."""
    feature_cache: int = option(0, int_spec(0),
                                "`exact` mode: remote nodes whose input features each rank caches at start-up "
                                "(the highest-degree halo nodes); the rest are fetched when a batch needs them.",
                                section="sampler")
    mode: str = option("hec", choice_spec(*MODES),
                       "`exact`: remote neighbours are sampled by their owners and their features fetched, "
                       "every layer exact (DistDGL-like); `drop`: remote neighbours are left out; `hec`: "
                       "their input features and embeddings come from the historical embedding caches (one per "
                       "layer, layer 0 included) filled by asynchronous pushes; a miss leaves the neighbour out.",
                       section="hec")
    size: int = option(1_000_000, int_spec(1), "`hec`: cache lines per layer (at most the partition's halo "
                                                "nodes are allocated).", section="hec")
    policy: str = option("ocf", choice_spec(*POLICIES),
                         "`hec`: line replacement: `ocf` (the paper's oldest cache-line first: a node's own line, "
                         "else an empty or expired line, else the oldest line of the cache) or `set` (8-way "
                         "set-associative, the set's oldest line; no hash table).", section="hec")
    lifespan: int = option(2, int_spec(0), "`hec`: iterations an embedding may be served after it arrived.",
                           section="hec")
    push_limit: int = option(2000, int_spec(0),
                             "`hec`: most embeddings pushed to each peer per layer and iteration (chosen at "
                             "random, weighted by degree).", section="hec")
    delay: int = option(1, int_spec(1), "`hec`: iterations a push travels: pushed at iteration k, stored at "
                                        "k + delay.", section="hec")


class _Push:
    """One layer's push of one iteration in flight: the bounded exchange and the clock it was made at."""

    def __init__(self, request: Any, iteration: int):
        self.request, self.iteration = request, iteration


class MinibatchEngine(SeedEngine):
    """Sampled mini-batch engine (module docstring). ``source``: a partition directory, or a dataset file
    on one process.

    Options: ``fanouts`` (seed hop first), ``batch_size``, ``feature_cache``, ``mode``, ``size``,
    ``lifespan``, ``push_limit``, ``delay``, ``seed``, ``feature_norm`` (``row``: every rank divides
    its rows by their sums before serving them, so fetched and cached rows are normalised too).
    """

    name = "minibatch"
    summary = ("sampled mini-batches; remote neighbours exact, dropped or from DistGNN-MB's historical embedding cache "
               "(sections `sampler`, `hec`; docs/minibatch.md).")
    data_source = "partition_or_file"
    Options = MinibatchOptions
    malloc_mmap_threshold = 0  # per-batch tensors of changing sizes: reuse the heap's pages
    rank_state = True  # each rank's historical embedding caches

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        return sampled_model_problem(model, mc)

    @classmethod
    def check_config(cls, config: Any, model: Any) -> None:
        check_fanouts_for_model(config.sampler.fanouts, model, config.model)
        if config.sampler.feature_cache and config.hec.mode != "exact":
            from hpc_graph.options import ConfigError
            raise ConfigError(f"sampler.feature_cache: only used by hec.mode 'exact' (mode {config.hec.mode!r} "
                              "reads no remote feature from its owner)")

    def check_model(self, model: torch.nn.Module) -> None:
        """Carry the per-edge fields the model's messages read (its ``edge_fields``, e.g. ``("weight",)``)
        with every sampled edge; nothing extra is sampled or sent for a model that reads none."""
        names = tuple(getattr(model, "edge_fields", ()) or ())
        if names:
            missing = self.sampler.carry(names)
            self._edge_missing = {k: why for k, why in NOT_CARRIED.items() if k not in names}
            self._edge_missing.update({k: f"message function: no edge {k}s: {why}" for k, why in missing.items()})

    def __init__(self, source: str, comm: Any, device: torch.device, dtype: torch.dtype,
                 options: dict[str, Any] | None = None):
        super().__init__(source, comm, device, dtype, options)
        o = self.opts
        self.fanouts = check_fanouts(o.fanouts, "minibatch")
        for name in ("batch_size", "feature_cache", "size", "lifespan", "push_limit", "delay"):
            setattr(self, name, int(getattr(o, name)))
        self.mode, self.policy = o.mode, o.policy
        if self.mode == "hec" and len(self.fanouts) > MAX_CHANNEL:
            raise ValueError(f"hec.mode: 'hec' pushes on one channel per layer; {len(self.fanouts)} layers, at most "
                             f"{MAX_CHANNEL}")
        self.seed = int(self.options["seed"])
        # sampling, the feature store and the batches on the host; evaluation on the model's device
        dg, data, edg, edata = load_sampled_engine_data(self.source, comm, self.device, dtype, self.name,
                                                        self.options["feature_norm"])
        self.dg = dg
        self.graph = HaloGraph(edg, comm)  # evaluation: exact, full neighbourhoods
        self.feat, self.label, self.masks = edata["feat"], edata["label"], edata["masks"]
        self.host_feat, self.host_label, host_masks = data["feat"], data["label"], data["masks"]
        self.num_classes, self.num_features = data["num_classes"], data["num_features"]
        self.first, self.num_owned = dg.first_gid, dg.num_owned
        self.sampler = NeighborSampler(dg, comm)
        self._edge_missing = dict(NOT_CARRIED)  # why a block has no per-edge field (check_model may carry them)
        self.owned_degree = dg.in_degree.to(torch.int64)
        self.halo_degree = self._halo_degrees()
        self.store = FeatureStore(self.host_feat, self.owned_degree, dg.node_ranges, comm)
        if self.feature_cache and self.mode == "exact":
            top = torch.argsort(self.halo_degree, descending=True)[:self.feature_cache]
            self.store.cache(dg.halo_gid[top])
        self.train_idx = (host_masks["train"] & (self.host_label >= 0)).nonzero().squeeze(1)
        self.schedule = SeedSchedule(self.train_idx, self.batch_size, self.seed, comm)
        self.push_peers = sorted(q for q in dg.send_lid)  # ranks that hold some of my nodes as halo
        self.pull_peers = sorted(q for q in dg.recv_count)  # ranks whose nodes I hold as halo
        # send-list membership per peer: owned local id -> bool
        self._is_halo_on = {q: torch.zeros(self.num_owned, dtype=torch.bool) for q in self.push_peers}
        for q in self.push_peers:
            self._is_halo_on[q][dg.send_lid[q]] = True
        self.caches: dict[int, HistoricalEmbeddingCache] = {}
        self._pending: dict[int, list[_Push]] = {}
        self._width: dict[int, int] = {0: int(self.num_features)}  # row width of each layer's pushes
        self._iteration = 0
        self._iters = self.schedule.iterations()
        self._now = 0  # the caches' clock: iterations since the first epoch (epoch * iterations + iteration)
        self._stats_reset()
        self.reset_stats()

    # -- set-up -------------------------------------------------------------------------------------
    def _halo_degrees(self) -> torch.Tensor:
        """Global in-degrees of the halo nodes (one exchange with the owners)."""
        dg = self.dg
        got = self.comm.exchange({q: self.owned_degree[lid].contiguous() for q, lid in dg.send_lid.items()},
                                 {q: ((c,), torch.int64) for q, c in dg.recv_count.items()})
        parts = [got[q] for q in sorted(dg.recv_count)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    # -- statistics ---------------------------------------------------------------------------------
    def _stats_reset(self) -> None:
        L = len(self.fanouts)
        self._s = {"iterations": 0, "seeds": 0, "sampled_edges": 0, "sample_seconds": 0.0, "fetch_seconds": 0.0,
                   "push_seconds": 0.0, "bytes": {"fetch": 0, "sample": 0, "push": 0},
                   "hec_lookups": [0] * L, "hec_hits": [0] * L, "hec_age": {}, "pushed_rows": [0] * L,
                   "dropped_edges": 0, "hec_evictions": 0, "push_wait_seconds": [0.0] * L}

    def reset_stats(self) -> None:
        super().reset_stats()
        if hasattr(self, "fanouts"):
            self._stats_reset()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(super().stats())
        s = self._s
        out.update({k: s[k] for k in ("iterations", "seeds", "sampled_edges", "sample_seconds", "fetch_seconds",
                                      "push_seconds", "dropped_edges")})
        out["bytes_by_op"] = dict(s["bytes"])
        if self.mode == "hec":
            out["hec_hit_rate"] = [h / n if n else None for h, n in zip(s["hec_hits"], s["hec_lookups"])]
            out["hec_lookups"] = list(s["hec_lookups"])
            out["hec_age"] = {str(a): c for a, c in sorted(s["hec_age"].items())}
            out["pushed_rows"] = list(s["pushed_rows"])
            out["push_wait_seconds"] = list(s["push_wait_seconds"])
            out["hec_evictions"] = sum(c.evictions for c in self.caches.values())
        return out

    # -- epochs and iterations ----------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        super().begin_epoch(epoch)
        self._iteration = 0
        self._now = int(epoch) * self._iters

    def state_dict(self) -> dict[str, Any]:
        """Each layer's valid cache lines (nothing is in flight at an epoch's end)."""
        return {"caches": {layer: {"width": c.dim, **c.state_dict(self._now + 1)}
                           for layer, c in self.caches.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for layer, s in (state or {}).get("caches", {}).items():
            self._cache(int(layer), int(s["width"])).load_state_dict(s)

    def _cache(self, layer: int, width: int) -> HistoricalEmbeddingCache:
        """Layer ``layer``'s cache, made at its first use (rows ``width`` wide; lines: ``hec.size``, at most the
        halo nodes)."""
        cache = self.caches.get(layer)
        if cache is None:
            lines = max(1, min(self.size, int(self.dg.halo_gid.numel())))
            cache = self.caches[layer] = HistoricalEmbeddingCache(lines, width, self.lifespan, dtype=self.dtype,
                                                                  policy=self.policy)
        return cache

    def end_epoch(self, epoch: int, loss: float, seconds: float) -> None:
        self.close()

    def close(self) -> None:
        """Complete every push still in flight (there is none at an epoch's end by construction)."""
        for layer in list(self._pending):
            for push in self._pending.pop(layer):
                self._receive(layer, push, store=False)

    # -- one iteration ------------------------------------------------------------------------------
    def batch(self, epoch: int, iteration: int) -> Batch:
        """Sample iteration ``iteration`` of ``epoch`` (collective in modes ``exact`` and ``hec``)."""
        seeds = self.seeds(epoch, iteration)
        self._iteration = iteration
        self._now = int(epoch) * self._iters + int(iteration)
        s = self._s
        s["iterations"] += 1
        if self.mode == "hec":
            self._poll()
            self._arrive(self._now)
        s["seeds"] += int(seeds.numel())
        t0 = time.perf_counter()
        fetch0 = s["fetch_seconds"]
        blocks, feat = self._sample(seeds + self.first, epoch)
        s["sample_seconds"] += time.perf_counter() - t0 - (s["fetch_seconds"] - fetch0)
        return Batch(BlockStack(blocks), feat, self.host_label[seeds], seeds)

    # -- sampling ----------------------------------------------------------------------------------
    def _sample(self, seed_gid: torch.Tensor, epoch: int) -> tuple[list[Block], torch.Tensor]:
        """Blocks (input layer first) and the input features of block 0's sources (fetched as needed).

        Hops go outwards from the seeds (``fanouts[0]`` first); the blocks are built afterwards,
        input layer first, once every source's global in-degree is known (block 0's from the fetch).
        """
        from numba_kernels.cpu.sample import unique_relabel

        L = len(self.fanouts)
        first, last = self.first, self.first + self.num_owned
        dst = seed_gid.numpy().astype(np.int64)
        hops = []
        for hop, fanout in enumerate(self.fanouts):
            layer = L - 1 - hop
            b0 = self.sampler.bytes_sent
            counts, nbrs, dst_deg, fields = self.sampler.hop(dst, fanout, sample_key(self.seed, epoch, layer),
                                                             exact=self.mode == "exact", fields=True)
            self._s["bytes"]["sample"] += self.sampler.bytes_sent - b0
            self._s["sampled_edges"] += int(nbrs.size)
            remote = (nbrs < first) | (nbrs >= last)
            keep = None
            if self.mode == "drop":
                keep = ~remote
            elif self.mode == "hec" and remote.any():
                keep = np.ones(nbrs.size, dtype=bool)
                keep[remote] = self._hec_hits(layer, nbrs[remote])
            if keep is not None and not keep.all():
                self._s["dropped_edges"] += int((~keep).sum())
                counts = np.bincount(np.repeat(np.arange(dst.size), counts)[keep], minlength=dst.size).astype(np.int64)
                nbrs = nbrs[keep]
                fields = {k: v[keep] for k, v in fields.items()}
            src = np.empty(dst.size + nbrs.size, dtype=np.int64)
            col = np.empty(nbrs.size, dtype=np.int64)
            src = src[:unique_relabel(dst, nbrs, src, col)]
            n_local = src.size
            if self.mode != "exact":
                # sources: destinations, then other owned nodes, then remote ones (served by the cache)
                extra = src[dst.size:]
                far = (extra < first) | (extra >= last)
                perm = np.concatenate([np.arange(dst.size), dst.size + np.flatnonzero(~far),
                                       dst.size + np.flatnonzero(far)])
                inv = np.empty_like(perm)
                inv[perm] = np.arange(perm.size)
                src, col = src[perm], inv[col]
                n_local = dst.size + int((~far).sum())
            hops.append((layer, dst, dst_deg, counts, col, src, n_local, fields))
            dst = src[:n_local]
        feat, in_deg = self._input_rows(hops[-1][5], hops[-1][6])
        blocks_rev: list[Block] = []
        next_deg = in_deg.numpy()  # degrees of block 0's sources
        prev_dst_deg = None  # degrees of the previous (lower) block's destinations: this block's owned sources
        for layer, dst_, dst_deg, counts, col, src, n_local, fields in reversed(hops):
            if layer == 0:
                src_deg = next_deg
            else:
                src_deg = np.empty(src.size, np.int64)
                src_deg[:n_local] = prev_dst_deg
                if src.size > n_local:
                    src_deg[n_local:] = self._halo_degree_of(src[n_local:])
            csr = block_csr(counts, col, src.size)
            src_t = torch.from_numpy(src)
            complete = self._completer(layer, src[:n_local], src[n_local:]) if self.mode == "hec" and layer > 0 \
                else None
            blocks_rev.append(Block(csr, src_t, self.dg.orig_ids_of(src_t), torch.from_numpy(src_deg), self.comm,
                                    complete, edge_fields=block_fields(fields, self.dtype),
                                    missing=self._edge_missing))
            prev_dst_deg = dst_deg
        return blocks_rev, feat

    def _input_rows(self, gids: np.ndarray, n_local: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Input features and degrees of block 0's sources (``gids``; in ``hec`` mode the first ``n_local`` are
        owned): a collective fetch in ``exact`` mode; in ``hec`` mode the owned rows, then the layer-0 cache's
        rows of the remote ones, and the owned rows peers hold as halo nodes are pushed."""
        t0 = time.perf_counter()
        if self.mode == "hec" and self.comm.size > 1:
            lid = torch.from_numpy(gids[:n_local] - self.first)
            own = self.host_feat.index_select(0, lid)
            deg = torch.from_numpy(np.concatenate([self.owned_degree.numpy()[lid.numpy()],
                                                   self._halo_degree_of(gids[n_local:])]))
            self._push(0, own, gids[:n_local])
            feat = own
            if gids.size > n_local:
                rows, hit, _ = self._cache(0, own.shape[1]).lookup(torch.from_numpy(gids[n_local:]), self._now)
                if not bool(hit.all()):
                    raise RuntimeError("minibatch: a cached input row expired between sampling and its use")
                feat = torch.cat([own, rows.to(own.dtype)], 0)
            self._s["fetch_seconds"] += time.perf_counter() - t0
            return feat, deg
        if self.mode == "drop" or (self.comm.size == 1):
            lid = torch.from_numpy(gids - self.first)
            feat, deg = self.host_feat.index_select(0, lid), self.owned_degree.index_select(0, lid)
        else:
            b0 = self.store.stats()["bytes_sent"]
            feat, deg = self.store.fetch(torch.from_numpy(gids))
            self._s["bytes"]["fetch"] += self.store.stats()["bytes_sent"] - b0
        self._s["fetch_seconds"] += time.perf_counter() - t0
        return feat, deg

    def _halo_degree_of(self, gids: np.ndarray) -> np.ndarray:
        hg = self.dg.halo_gid.numpy()
        pos = np.searchsorted(hg, gids)
        if gids.size and (pos.max() >= hg.size or not np.array_equal(hg[pos], gids)):
            raise RuntimeError("minibatch: a cached neighbour is not a halo node of this partition")
        return self.halo_degree.numpy()[pos]

    # -- historical embedding cache -------------------------------------------------------------
    def _hec_hits(self, layer: int, gids: np.ndarray) -> np.ndarray:
        """Which of ``gids`` (remote neighbours, duplicates allowed) layer ``layer``'s cache serves now."""
        s = self._s
        s["hec_lookups"][layer] += int(gids.size)
        cache = self.caches.get(layer)
        if cache is None:
            return np.zeros(gids.size, dtype=bool)
        _, hit, age = cache.lookup(torch.from_numpy(gids), self._now)
        h = hit.numpy()
        s["hec_hits"][layer] += int(h.sum())
        for a, c in zip(*np.unique(age.numpy()[h], return_counts=True)):
            s["hec_age"][int(a)] = s["hec_age"].get(int(a), 0) + int(c)
        return h

    def _completer(self, layer: int, local_gids: np.ndarray, remote_gids: np.ndarray):
        """``layer_input`` of block ``layer``: push my rows, append the cached rows of remote sources."""
        cached = None
        if remote_gids.size:
            rows, hit, _ = self.caches[layer].lookup(torch.from_numpy(remote_gids), self._now)
            if not bool(hit.all()):
                raise RuntimeError("minibatch: a cached row expired between sampling and the forward pass")
            cached = rows

        def complete(h: torch.Tensor) -> torch.Tensor:
            if h.shape[0] != local_gids.size:
                raise RuntimeError(f"minibatch: layer {layer} got {h.shape[0]} rows, its block expects "
                                   f"{local_gids.size}")
            self._poll()
            self._push(layer, h, local_gids)
            return h if cached is None else torch.cat([h, cached.to(device=h.device, dtype=h.dtype)], 0)
        return complete

    def _push(self, layer: int, h: torch.Tensor, gids: np.ndarray) -> None:
        """Start sending my rows of ``h`` that peers hold as halo rows (asynchronous embedding push), and post
        the receives of what the peers push here at the same layer: a bounded exchange
        (:meth:`~hpc_graph.comm.Communicator.exchange_start_bounded`, room for ``push_limit`` rows or the
        peer's halo nodes here, whichever is fewer), so the rows travel while this rank computes."""
        if self.comm.size == 1 or layer > 0 and not h.requires_grad and not torch.is_grad_enabled():
            return
        if self._iteration >= self._iters - self.delay:
            return  # nothing may be in flight at the end of the epoch
        t0 = time.perf_counter()
        self._width[layer] = int(h.shape[1])
        row = self._row_bytes(layer)
        lids = gids - self.first
        hd = h.detach().to(self.dtype).contiguous()
        sends = {}
        rng = np.random.default_rng(sample_key(self.seed, self._epoch, self._iteration, layer, self.comm.rank))
        for q in self.push_peers:
            cand = np.flatnonzero(self._is_halo_on[q].numpy()[lids])
            if cand.size > self.push_limit:
                w = self.owned_degree.numpy()[lids[cand]].astype(np.float64) + 1.0
                cand = cand[weighted_choice(w, self.push_limit, rng)]
            sends[q] = _as_bytes(torch.from_numpy(gids[cand].astype(np.int64)), hd[torch.from_numpy(cand)])
            self._s["pushed_rows"][layer] += int(cand.size)
        bounds = {q: min(self.push_limit, int(self.dg.recv_count[q])) * row for q in self.pull_peers}
        b0 = self.comm.bytes_sent
        request = self.comm.exchange_start_bounded(sends, bounds, channel=layer + 1)
        self._s["bytes"]["push"] += int(self.comm.bytes_sent - b0)
        self._pending.setdefault(layer, []).append(_Push(request, self._now))
        self._s["push_seconds"] += time.perf_counter() - t0

    def _row_bytes(self, layer: int) -> int:
        """Bytes of one pushed row of ``layer``: its node id and its values."""
        return 8 + self._width[layer] * torch.empty((), dtype=self.dtype).element_size()

    def _poll(self) -> None:
        """Drive the pushes in flight (MPI libraries move a large message only inside MPI calls)."""
        for queue in self._pending.values():
            for push in queue:
                push.request.test()

    def _receive(self, layer: int, push: _Push, store: bool = True) -> None:
        t0 = time.perf_counter()
        arrived = push.request.wait()
        self._s["push_wait_seconds"][layer] += time.perf_counter() - t0
        if not store:
            return
        width, row = self._width[layer], self._row_bytes(layer)
        cache = self._cache(layer, width)
        for q in self.pull_peers:
            buf = arrived[q]
            c, rest = divmod(int(buf.numel()), row)
            if rest:
                raise RuntimeError(f"minibatch: rank {q} pushed {buf.numel()} bytes at layer {layer}, not whole "
                                   f"rows of {row}")
            if c:
                cache.store(buf[:8 * c].view(torch.int64), buf[8 * c:].view(self.dtype).view(c, width), self._now)

    def _arrive(self, now: int) -> None:
        """Store the pushes that were sent ``delay`` iterations ago."""
        t0 = time.perf_counter()
        for layer, queue in self._pending.items():
            while queue and queue[0].iteration + self.delay <= now:
                self._receive(layer, queue.pop(0))
        self._s["push_seconds"] += time.perf_counter() - t0


def weighted_choice(weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct indices of ``weights`` (float64[n] > 0), ascending, drawn without replacement with
    probability proportional to the weights of those not drawn yet (Efraimidis and Spirakis: the ``k`` largest
    ``log(u) / w``; one pass, the same distribution as ``k`` successive weighted draws)."""
    if k >= weights.size:
        return np.arange(weights.size)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.log(rng.random(weights.size)) / weights
    return np.sort(np.argpartition(-keys, k - 1)[:k])


def _as_bytes(*parts: torch.Tensor) -> torch.Tensor:
    """The elements of ``parts`` back to back as one uint8[sum of nbytes] tensor.

    Copied into fresh buffers first: a tensor of 0 or 1 element may carry a stride
    of 0, which ``Tensor.view(torch.uint8)`` refuses.
    """
    out = []
    for t in parts:
        buf = torch.empty(t.numel(), dtype=t.dtype)
        buf.copy_(t.reshape(-1))
        out.append(buf.view(torch.uint8))
    return torch.cat(out)
