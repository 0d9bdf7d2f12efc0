"""What a real training step holds, tensor by tensor, beside what ``hpc_graph.plan.fullbatch`` predicts for it.

Shared by ``tests/plan/test_fullbatch.py`` (engine ``single``, one process) and
``tests/mpi/scripts/plan_components.py`` (``dp`` and ``sar`` on 2 and 4 ranks):

* ``graph``: every tensor and array reachable from ``engine.graph`` (CSR structures, their
  transposes and column-blocked copies, SAR blocks, node ids, send lists), each storage once;
* ``features``: features (the engine's and the trainer's copy), labels, masks, training ids;
* ``params``: parameters, gradients, optimiser state and a best-validation copy (one more set of
  parameters, which the trainer keeps after its first evaluation);
* ``saved``: what autograd saves during one training step (``saved_tensors_hooks``), each storage
  once, without parameters, the storages above and 0-d/1-element tensors;
* ``halo_recv_max``: the largest receive of one ``exchange`` (all peers of the call together);
* ``bytes_sent``: what the rank's communicator sent during the step (halo exchanges, gradient all-reduce);
* ``sylvie`` only: ``codec_state`` (its exchange plan, node importances and bit tables, beyond the graph's
  storages) and ``slots`` (halo rows and gradients its pipeline slots hold after the step, kept or in flight).
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

from hpc_graph.plan import fullbatch as fb

KEYS = ("saved", "graph", "features", "params", "halo_recv_max", "bytes_sent")


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
    mod = type(obj).__module__ or ""
    if mod.startswith(("hpc_graph", "data_io")) and not mod.startswith("hpc_graph.comm") and hasattr(obj, "__dict__"):
        if id(obj) in objs:
            return seen
        objs.add(id(obj))
        for k, v in vars(obj).items():
            if k not in ("comm", "engine"):  # sylvie's graph refers back to its engine
                storages(v, seen, objs, depth + 1)
    return seen


class _NoCount:
    """Stands in for ``SavedBytes`` in the pipeline loop while :func:`measure` counts."""

    bytes = 0

    def __init__(self, *args: Any) -> None:
        pass

    def __enter__(self) -> "_NoCount":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


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
    import hpc_graph.train.pipeline as pipeline

    counter = pipeline.SavedBytes
    pipeline.SavedBytes = _NoCount  # the pipeline's own count would hide the saves from this one (innermost wins)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            trainer.step()
    finally:
        comm.exchange_start = start
        pipeline.SavedBytes = counter
    sent = int(getattr(comm, "bytes_sent", 0)) - sent0
    graph: dict[int, int] = {}
    storages(trainer.engine.graph, graph)
    for k in feats:
        graph.pop(k, None)
    p = sum(x.nbytes for x in own)
    g = sum(x.grad.nbytes for x in own)
    opt = sum(v.nbytes for st in trainer.optimizer.state.values() for v in st.values()
              if torch.is_tensor(v) and v.dim() > 0)
    out = {"saved": sum(saved.values()), "graph": sum(graph.values()), "features": sum(feats.values()),
           "params": p + g + opt + p, "halo_recv_max": recv[0], "bytes_sent": sent}
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


def predict(trainer: Any) -> dict[str, int]:
    """The planner's numbers for the same rank, engine, model and data."""
    cfg = trainer.config
    data = cfg.data.path
    stage = None
    if os.path.isdir(data):
        graph = fb.graph_from_partition(data)
        rank = fb.layout_from_partition(data).parts[trainer.rank]
    else:
        graph = fb.graph_from_dataset(data)
        rank = fb.single_layout(graph).parts[0]
        if trainer.engine_name == "flow":
            eng = trainer.engine
            stage = fb.FlowStage(eng.units[0], eng.units[1], cfg.model.num_layers, eng.num_microbatches,
                                 eng.stage_split)
    spec = fb.model_spec(cfg.model, graph.features, graph.classes, dtype=cfg.train.dtype, optimizer=cfg.optim.name,
                         momentum=cfg.optim.momentum, feature_norm=cfg.data.feature_norm)
    w = fb.walk_step(trainer.engine_name, spec, graph, rank, trainer.size, prefetch=cfg.engine.prefetch,
                     codec=fb.engine_codec(trainer.engine_name, cfg.engine), stage=stage)
    m = fb.memory_of(w, 0)
    rates = fb.Rates(spmm_fwd=(0, 0), spmm_bwd=(0, 0), gat_fwd=(0, 0), gat_bwd=(0, 0), gemm_flops=1.0, stream=1.0)
    t = fb.time_of(w, rates, threads=1, cores_share=1.0, ranks=trainer.size)
    out = {"saved": m.saved, "graph": m.graph, "features": m.features, "params": m.params,
           "halo_recv_max": m.halo_recv_max, "bytes_sent": int(t.bytes_sent)}
    if w.codec is not None:
        out["codec_state"] = w.codec_state()
        out["slots"] = w.slot_bytes  # after the first step, and after a later one
    return out


def compare(trainer: Any) -> list[str]:
    """Measured vs predicted components of one step; the mismatches as text (empty: all equal)."""
    got, want = measure(trainer), predict(trainer)
    return [f"{k}: measured {got[k]} predicted {want[k]}" for k in KEYS if got[k] != want[k]]
