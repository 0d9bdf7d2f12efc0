"""``minibatch`` engine: sampled mini-batch training on a partitioned graph (DistGNN-MB).

Each rank trains on its own partition's training nodes: per iteration it takes
``sampler.batch_size`` seeds, samples a block per model layer outwards from
them (:mod:`numba_kernels.cpu.sample`: uniform without replacement, keyed by
(seed, epoch, layer, node id), so a node's sample does not depend on the
rank, the thread count or the partitioning), and runs the model on the
blocks (:class:`~hpc_graph.graph.block.BlockStack`). Every rank runs the same
number of iterations per epoch (the smallest, agreed by an all-reduce); the
trainer normalises each iteration's loss by the global batch and all-reduces
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
* ``hec``: DistGNN-MB. Their input features (layer 0) are fetched exactly;
  their embeddings at inner layer ``l`` come from the rank's historical
  embedding cache for ``l`` (:class:`~hpc_graph.store.HistoricalEmbeddingCache`),
  and a miss leaves the neighbour out of that block (mean aggregation is then
  over the neighbours that remain; sums are rescaled by the node's degree over
  their number). The caches are filled by asynchronous embedding push: when
  layer ``l``'s input rows of a rank's own nodes are computed, those nodes
  that are halo nodes of peer q (the partition's send lists) are pushed to q,
  at most ``hec.push_limit`` per peer and layer, drawn at random weighted by
  degree. A push made at iteration k is stored at k + ``hec.delay``; the last
  ``delay`` iterations of an epoch push nothing, and each epoch starts with
  empty caches, so an epoch boundary (a checkpoint) has nothing in flight.

Per-epoch ``engine_stats``: iterations, per-layer HEC hit rate and age
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

from hpc_graph.engines.base import Batch, SeedEngine
from hpc_graph.graph.block import Block, BlockStack
from hpc_graph.graph.dist_graph import load_sampled_engine_data
from hpc_graph.graph.halo_graph import HaloGraph
from hpc_graph.graph.sampler import (NOT_CARRIED, NeighborSampler, SamplerOptions, SeedSchedule, block_csr,
                                     block_fields, check_fanouts, check_fanouts_for_model, sample_key,
                                     sampled_model_problem)
from hpc_graph.options import choice_spec, int_spec, option
from hpc_graph.store.feature_store import FeatureStore
from hpc_graph.store.hec import HistoricalEmbeddingCache

log = logging.getLogger(__name__)

MODES = ("exact", "drop", "hec")
# pushes of inner layer l travel on exchange channels 2l - 1 (row counts) and 2l (ids and rows)


@dataclasses.dataclass
class MinibatchOptions(SamplerOptions):
    """``minibatch``'s options: sampling (section ``sampler``), remote neighbours and DistGNN-MB's historical
    embedding cache (section ``hec``)."""
    feature_cache: int = option(0, int_spec(0),
                                "Remote nodes whose input features each rank caches at start-up (the "
                                "highest-degree halo nodes); the rest are fetched when a batch needs them.",
                                section="sampler")
    mode: str = option("hec", choice_spec(*MODES),
                       "`exact`: remote neighbours are sampled by their owners and their features fetched, "
                       "every layer exact (DistDGL-like); `drop`: remote neighbours are left out; `hec`: "
                       "their embeddings come from the historical embedding cache filled by asynchronous "
                       "pushes (a miss leaves the neighbour out; input features are always fetched exactly).",
                       section="hec")
    size: int = option(1_000_000, int_spec(1), "`hec`: cache lines per layer.", section="hec")
    lifespan: int = option(2, int_spec(0), "`hec`: iterations an embedding may be served after it arrived.",
                           section="hec")
    push_limit: int = option(2000, int_spec(0),
                             "`hec`: most embeddings pushed to each peer per layer and iteration (chosen at "
                             "random, weighted by degree).", section="hec")
    delay: int = option(1, int_spec(1), "`hec`: iterations a push travels: pushed at iteration k, stored at "
                                        "k + delay.", section="hec")


class _Push:
    """One layer's push of one iteration, in flight: counts, then rows."""

    def __init__(self, sends: Any, counts: Any, iteration: int):
        self.sends, self.counts, self.iteration = sends, counts, iteration


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

    @classmethod
    def model_problem(cls, model: Any, mc: Any) -> str | None:
        return sampled_model_problem(model, mc)

    @classmethod
    def check_config(cls, config: Any, model: Any) -> None:
        check_fanouts_for_model(config.sampler.fanouts, model, config.model)

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
        self.mode = o.mode
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
        if self.feature_cache and self.mode != "drop":
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
        self._width: dict[int, int] = {}
        self._iteration = 0
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
                   "dropped_edges": 0, "hec_evictions": 0}

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
            out["hec_evictions"] = sum(c.evictions for c in self.caches.values())
        return out

    # -- epochs and iterations ----------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        super().begin_epoch(epoch)
        self._iters = self.iterations(epoch)
        self._iteration = 0
        for cache in self.caches.values():
            cache.clear()

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
        s = self._s
        s["iterations"] += 1
        if self.mode == "hec":
            self._arrive(iteration)
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
            elif self.mode == "hec" and layer > 0 and remote.any():
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
        feat, in_deg = self._input_rows(hops[-1][5])
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

    def _input_rows(self, gids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Input features and degrees of block 0's sources (a collective fetch unless ``drop``)."""
        t0 = time.perf_counter()
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
        _, hit, age = cache.lookup(torch.from_numpy(gids), self._iteration)
        h = hit.numpy()
        s["hec_hits"][layer] += int(h.sum())
        for a, c in zip(*np.unique(age.numpy()[h], return_counts=True)):
            s["hec_age"][int(a)] = s["hec_age"].get(int(a), 0) + int(c)
        return h

    def _completer(self, layer: int, local_gids: np.ndarray, remote_gids: np.ndarray):
        """``layer_input`` of block ``layer``: push my rows, append the cached rows of remote sources."""
        cached = None
        if remote_gids.size:
            rows, hit, _ = self.caches[layer].lookup(torch.from_numpy(remote_gids), self._iteration)
            if not bool(hit.all()):
                raise RuntimeError("minibatch: a cached row expired between sampling and the forward pass")
            cached = rows

        def complete(h: torch.Tensor) -> torch.Tensor:
            if h.shape[0] != local_gids.size:
                raise RuntimeError(f"minibatch: layer {layer} got {h.shape[0]} rows, its block expects "
                                   f"{local_gids.size}")
            self._width[layer] = int(h.shape[1])
            self._push(layer, h, local_gids)
            return h if cached is None else torch.cat([h, cached.to(device=h.device, dtype=h.dtype)], 0)
        return complete

    def _push(self, layer: int, h: torch.Tensor, gids: np.ndarray) -> None:
        """Start sending my rows of ``h`` that peers hold as halo rows (asynchronous embedding push)."""
        if self.comm.size == 1 or not h.requires_grad and not torch.is_grad_enabled():
            return
        if self._iteration >= self._iters - self.delay:
            return  # nothing may be in flight at the end of the epoch
        t0 = time.perf_counter()
        lids = gids - self.first
        hd = h.detach().contiguous()
        sends, count_sends = {}, {}
        rng = np.random.default_rng(sample_key(self.seed, self._epoch, self._iteration, layer, self.comm.rank))
        for q in self.push_peers:
            cand = np.flatnonzero(self._is_halo_on[q].numpy()[lids])
            if cand.size > self.push_limit:
                w = self.owned_degree.numpy()[lids[cand]].astype(np.float64) + 1.0
                keys = np.log(rng.random(cand.size)) / w  # Efraimidis-Spirakis: the largest keys win
                cand = np.sort(cand[np.argpartition(-keys, self.push_limit - 1)[:self.push_limit]])
            sends[q] = _as_bytes(torch.from_numpy(gids[cand].astype(np.int64)), hd[torch.from_numpy(cand)])
            count_sends[q] = torch.tensor([cand.size], dtype=torch.int64)
            self._s["pushed_rows"][layer] += int(cand.size)
        b0 = self.comm.bytes_sent
        counts = self.comm.exchange_start(count_sends, {q: ((1,), torch.int64) for q in self.pull_peers},
                                          channel=2 * layer - 1)
        data = self.comm.exchange_start(sends, {}, channel=2 * layer)
        self._s["bytes"]["push"] += int(self.comm.bytes_sent - b0)
        self._pending.setdefault(layer, []).append(_Push(data, counts, self._iteration))
        self._s["push_seconds"] += time.perf_counter() - t0

    def _receive(self, layer: int, push: _Push, store: bool = True) -> None:
        got = push.counts.wait()
        width = self._width[layer]
        item = torch.empty((), dtype=self.dtype).element_size()
        specs = {q: ((int(got[q][0]) * (8 + width * item),), torch.uint8) for q in self.pull_peers}
        arrived = self.comm.exchange_start({}, specs, channel=2 * layer).wait()
        push.sends.wait()
        if not store:
            return
        cache = self.caches.get(layer)
        if cache is None:
            cache = self.caches[layer] = HistoricalEmbeddingCache(self.size, width, self.lifespan, dtype=self.dtype)
        for q in self.pull_peers:
            c = int(got[q][0])
            if c:
                buf = arrived[q]
                cache.store(buf[:8 * c].view(torch.int64), buf[8 * c:].view(self.dtype).view(c, width),
                            self._iteration)

    def _arrive(self, iteration: int) -> None:
        """Store the pushes that were sent ``delay`` iterations ago."""
        t0 = time.perf_counter()
        for layer, queue in self._pending.items():
            while queue and queue[0].iteration + self.delay <= iteration:
                self._receive(layer, queue.pop(0))
        self._s["push_seconds"] += time.perf_counter() - t0


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
