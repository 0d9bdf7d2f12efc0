"""What a real training step holds, tensor by tensor, beside what the planner (``hpc_graph.plan.predict``) predicts.

Shared by ``tests/plan/test_predict.py`` (engine ``single``, one process) and
``tests/mpi/scripts/plan_components.py`` (``dp`` and ``sar`` on 2 and 4 ranks):

* ``graph``: every tensor and array reachable from ``engine.graph`` (CSR structures, their
  transposes and column-blocked copies, SAR blocks, node ids, send lists), each storage once (the planner
  leaves out the partition's two NumPy index arrays ``node_ranges`` and ``halo_offsets``, 16 (P + 1) bytes);
* ``features``: features (the engine's and the trainer's copy), labels, masks, training ids;
* ``params``: parameters, gradients, optimiser state and a best-validation copy (one more set of
  parameters, which the trainer keeps after its first evaluation);
* ``saved``: what autograd saves during one training step (``saved_tensors_hooks``), each storage
  once, without parameters, the storages above and 0-d/1-element tensors; for a pipeline stage, what the
  engine's own count of its pass reports (``stats()["saved_bytes"]``, which the planner reads too);
* ``halo_recv_max``: the largest receive of one ``exchange`` (all peers of the call together);
* ``bytes_sent``: what the rank's communicator sent during the step (halo exchanges, gradient all-reduce);
* ``sylvie`` only: ``codec_state`` (its exchange plan, node importances and bit tables, beyond the graph's
  storages) and ``slots`` (halo rows and gradients its pipeline slots hold after the step, kept or in flight).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np
import torch

from hpc_graph.plan import shapes
from hpc_graph.plan.rank import plan_rank

KEYS = ("saved", "graph", "features", "params", "halo_recv_max", "bytes_sent")
INDEX_ARRAYS = 16  # a partition's node_ranges and halo_offsets: two int64 per part boundary, NumPy, not planned


def _np_key(a: np.ndarray) -> tuple[int, int]:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.__array_interface__["data"][0], a.nbytes


def storages(obj: Any, seen: dict[int, int], objs: set[int] | None = None, depth: int = 0) -> dict[int, int]:
    """Add every tensor/array storage reachable from ``obj`` to ``seen`` (data pointer -> bytes)."""
    objs = set() if objs is None else objs
    if depth > 12 or obj is None:
        return seen
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            for t in (obj.crow_indices(), obj.col_indices(), obj.values()):
                storages(t, seen, objs, depth + 1)
            return seen
        st = obj.untyped_storage()
        if st.data_ptr():
            seen.setdefault(st.data_ptr(), st.nbytes())
        return seen
    if isinstance(obj, np.ndarray):
        ptr, nbytes = _np_key(obj)
        seen.setdefault(ptr, nbytes)
        return seen
    if isinstance(obj, dict):
        for v in obj.values():
            storages(v, seen, objs, depth + 1)
        return seen
    if isinstance(obj, (list, tuple)):
        for v in obj:
            storages(v, seen, objs, depth + 1)
        return seen
    from hpc_graph.graph.base import GraphContext

    mod = type(obj).__module__ or ""
    ours = mod.startswith(("hpc_graph", "data_io")) and not mod.startswith("hpc_graph.comm")
    if (ours or isinstance(obj, GraphContext)) and hasattr(obj, "__dict__"):  # a plug-in engine's graph too
        if id(obj) in objs:
            return seen
        objs.add(id(obj))
        for k, v in vars(obj).items():
            if k not in ("comm", "engine"):  # sylvie's graph refers back to its engine
                storages(v, seen, objs, depth + 1)
    return seen


def measure(trainer: Any) -> dict[str, int]:
    """Run one training step of ``trainer`` and measure the components (see the module docstring)."""
    comm = trainer.comm
    recv = [0]
    start = comm.exchange_start

    def exchange_start(sends, specs, **kw):
        total = sum(math.prod(shape) * torch.empty(0, dtype=dt).element_size() for shape, dt in specs.values())
        recv[0] = max(recv[0], total)
        return start(sends, specs, **kw)

    comm.exchange_start = exchange_start
    feats: dict[int, int] = {}
    for t in (trainer.engine.feat, trainer.feat, trainer.engine.label, trainer.label, trainer.train_idx,
              *trainer.masks.values(), *trainer.engine.masks.values()):
        storages(t, feats)
    own = [p for p in trainer.model.parameters() if not p.is_meta]  # a flow stage holds its own layers only
    params = {p.untyped_storage().data_ptr() for p in own}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        key = st.data_ptr()
        if t.numel() > 1 and key not in params and key not in feats:
            saved.setdefault(key, st.nbytes())
        return t

    sent0 = int(getattr(comm, "bytes_sent", 0))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            trainer.step()
    finally:
        comm.exchange_start = start
    if trainer.engine.kind == "pipeline":  # its pass counts inside (innermost hooks win): read its count
        saved = {0: int(trainer.engine.stats().get("saved_bytes", 0))}
    sent = int(getattr(comm, "bytes_sent", 0)) - sent0
    graph: dict[int, int] = {}
    storages(trainer.engine.graph, graph)
    for k in feats:
        graph.pop(k, None)
    p = sum(x.nbytes for x in own)
    g = sum(x.grad.nbytes for x in own)
    opt = sum(v.nbytes for st in trainer.optimizer.state.values() for v in st.values()
              if torch.is_tensor(v) and v.dim() > 0)
    out = {"source": str(trainer.config.data.path), "saved": sum(saved.values()), "graph": sum(graph.values()),
           "features": sum(feats.values()), "params": p + g + opt + p, "halo_recv_max": recv[0], "bytes_sent": sent}
    eng = trainer.engine
    if trainer.engine_name == "sylvie":
        state: dict[int, int] = {}
        for obj in (eng.plan, eng.send_p, eng.recv_p, eng._tables):
            storages(obj, state)
        out["codec_state"] = sum(v for k, v in state.items() if k not in graph and k not in feats)
        held: dict[int, int] = {}
        for slot in eng._slots.values():
            storages((slot.halo, slot.grad), held)
            for pending in (slot.pending_fwd, slot.pending_bwd):
                if pending is not None:
                    storages(pending[1], held)  # the buffers it decodes into
        out["slots"] = sum(held.values())
    return out


def edges_from(parts: str, p: int, P: int) -> tuple[int, ...]:
    """In-edges of part ``p`` by the part owning their source (the SAR blocks' sizes), from its part file."""
    from data_io.partition import read_partition

    part = read_partition(str(parts), p, features=False)
    n = int(part.num_owned)
    cols = np.asarray(part.indices)
    out = [0] * P
    out[p] = int((cols < n).sum())
    halo = cols[cols >= n] - n
    for q in range(P):
        if q != p:
            lo, hi = int(part.halo_offsets[q]), int(part.halo_offsets[q + 1])
            out[q] = int(((halo >= lo) & (halo < hi)).sum())
    return tuple(out)


def predict(trainer: Any) -> dict[str, int]:
    """The planner's numbers for the same rank, engine, model and data (the rank's step run on shapes)."""
    cfg = trainer.config
    data = cfg.data.path
    cls = type(trainer.engine)
    hints = None
    if os.path.isdir(data):
        graph = shapes.graph_from_partition(data)
        rank = shapes.layout_from_partition(data).parts[trainer.rank]
        rank = dataclasses.replace(rank, edges_from=edges_from(data, trainer.rank, trainer.size))
    else:
        graph = shapes.graph_from_dataset(data)
        rank = (shapes.single_layout(graph) if cls.max_ranks == 1 else
                shapes.replicated_layout(graph, trainer.size)).parts[trainer.rank]
        if cls.kind == "pipeline":
            hints = {"boundaries": list(trainer.engine.boundaries)}
    plan = plan_rank(cls, cls.options_from_config(cfg), cfg.model, graph, rank, trainer.size, dtype=cfg.train.dtype,
                     optimizer=cfg.optim.name, momentum=cfg.optim.momentum, feature_norm=cfg.data.feature_norm,
                     hints=hints)
    return {"saved": plan.saved, "graph": plan.held["graph"], "features": plan.held["features"],
            "params": plan.held["params"], "halo_recv_max": plan.halo_recv_max, "bytes_sent": plan.bytes_sent}


def compare(trainer: Any) -> list[str]:
    """Measured vs predicted components of one step; the mismatches as text (empty: all equal)."""
    return mismatches(measure(trainer), predict(trainer), trainer.size)


def mismatches(got: dict[str, int], want: dict[str, int], ranks: int) -> list[str]:
    """What differs between measured ``got`` and predicted ``want`` on a ``ranks``-rank job (the measured graph
    may hold the partition's two index arrays beyond the prediction, :data:`INDEX_ARRAYS` bytes per rank + 1)."""
    def same(k: str) -> bool:
        if k == "graph" and os.path.isdir(str(got.get("source", ""))):
            return 0 <= got[k] - want[k] <= INDEX_ARRAYS * (ranks + 1)
        return got[k] == want[k]

    return [f"{k}: measured {got[k]} predicted {want[k]}" for k in KEYS if not same(k)]
