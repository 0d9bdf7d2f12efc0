"""What a rank's training step allocates and computes, followed on tensors that have shapes and no data.

:class:`StepTracker` is a torch dispatch mode: while it is active every tensor an op creates on the ``meta``
device is counted from its birth to the death of its storage (what autograd saves lives until the backward
pass frees it), under the *component* that was current when it was made (:meth:`StepTracker.component`:
``graph``, ``features``, ``params``, ``activations``, ``halo``, ``workspace``), and the high-water mark of the
live bytes is kept with what was live at that moment and where the step was (:meth:`StepTracker.at`). The
arrays the kernels' shape twins return (:mod:`numba_kernels.work`) are counted the same way.

It also counts the work of the step by phase (``forward``, ``backward``, ``evaluation``; :meth:`StepTracker.phase`):
dense GEMM flops and the bytes of elementwise passes from the ops it sees, the kernels' records (SpMM edges x
width, attention, dropout masks, codec values), and the messages a planning communicator reports
(:meth:`StepTracker.message`). :mod:`hpc_graph.plan.rank` turns that into memory and time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

COMPONENTS = ("graph", "features", "params", "activations", "halo", "workspace")
PHASES = ("load", "forward", "backward", "optimizer", "evaluation")

_aten = torch.ops.aten
# ops that make no new data (views, metadata) or that only allocate: no elementwise pass to count
_FREE = {"view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand", "slice", "select", "alias",
         "detach", "squeeze", "unsqueeze", "unbind", "split", "split_with_sizes", "narrow", "reshape", "empty",
         "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh", "_to_copy", "clone",
         "unfold", "chunk", "view_as", "expand_as", "_reshape_alias", "diagonal", "set_", "resize_", "numel",
         "sym_size", "sym_stride", "sym_numel", "is_same_size", "equal", "_local_scalar_dense", "item",
         "lift_fresh_copy", "scalar_tensor", "arange", "to", "contiguous"}


def _op_name(func: Any) -> str:
    return func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)


def _bytes(t: Any) -> int:
    return int(t.numel()) * t.element_size() if isinstance(t, torch.Tensor) else 0


@dataclasses.dataclass
class Work:
    """One phase's work: ``spmm``/``attention``: ``[(edges, width)]``; ``flops``: dense GEMM flops; ``stream``:
    bytes read and written by elementwise passes; ``mask``/``score``/``codec``: elements; ``exchanges``:
    ``[(bytes out, bytes in, peers)]`` of point-to-point exchanges the step waits for; ``background``: the same
    for exchanges that travel behind the computation; ``allreduce``: ``[(bytes, ranks)]``."""

    spmm: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    attention: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    flops: float = 0.0
    stream: float = 0.0
    mask: float = 0.0
    score: float = 0.0
    codec: float = 0.0
    exchanges: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    background: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    allreduce: list[tuple[int, int]] = dataclasses.field(default_factory=list)


class StepTracker(TorchDispatchMode):
    """Live bytes by component with their high-water mark, and work by phase, of shape-only tensors (module
    docstring). Use as a context manager around the work; nest :meth:`component`, :meth:`phase` and :meth:`at`."""

    def __init__(self, device: str = "meta") -> None:
        super().__init__()
        self.device = device  # the tensors followed: "meta" (a plan), or "cpu" (a real step, to check a plan)
        self.live: dict[str, int] = {c: 0 for c in COMPONENTS}
        self.peak = 0
        self.peak_parts: dict[str, int] = dict(self.live)
        self.peak_where = ""
        self.where = "load"
        self.work: dict[str, Work] = {p: Work() for p in PHASES}
        self._component = "workspace"
        self._phase = "load"
        self._storages: dict[int, tuple[Any, int, str]] = {}  # storage key -> (weakref, bytes, component)
        self._arrays: dict[int, tuple[Any, int, str]] = {}
        self._marks: list[tuple[str, int]] = []

    # -- where, what, which phase ------------------------------------------------------------------------
    @contextlib.contextmanager
    def component(self, name: str) -> Iterator[None]:
        """Tensors made inside belong to component ``name`` (:data:`COMPONENTS`)."""
        if name not in COMPONENTS:
            raise ValueError(f"component: one of {COMPONENTS}, got {name!r}")
        before, self._component = self._component, name
        try:
            yield
        finally:
            self._component = before

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Work done inside counts for phase ``name`` (:data:`PHASES`)."""
        before, self._phase = self._phase, name
        try:
            with self.at(name):
                yield
        finally:
            self._phase = before

    @contextlib.contextmanager
    def at(self, where: str) -> Iterator[None]:
        """A high-water mark reached inside is reported as ``where``."""
        before, self.where = self.where, where
        try:
            yield
        finally:
            self.where = before

    @property
    def current_phase(self) -> str:
        return self._phase

    # -- allocations ------------------------------------------------------------------------------------
    def _count(self, component: str, nbytes: int) -> None:
        self.live[component] += nbytes
        total = sum(self.live.values())
        if total > self.peak:
            self.peak, self.peak_parts, self.peak_where = total, dict(self.live), self.where

    def adopt(self, t: torch.Tensor, component: str | None = None) -> None:
        """Count tensor ``t`` (made before tracking began, e.g. parameters) under ``component``."""
        if not isinstance(t, torch.Tensor) or t.device.type != self.device or t.is_sparse or \
                t.layout != torch.strided:
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._storages:
            return
        comp = component or self._component
        nbytes = int(storage.nbytes())

        def _free(_ref: Any, key: int = key) -> None:
            entry = self._storages.pop(key, None)
            if entry is not None:
                self.live[entry[2]] -= entry[1]

        self._storages[key] = (weakref.ref(storage, _free), nbytes, comp)
        self._count(comp, nbytes)

    def relabel(self, t: torch.Tensor, component: str) -> None:
        """Move tensor ``t``'s bytes to ``component`` (parameter gradients once the step made them)."""
        if not isinstance(t, torch.Tensor) or t.device.type != self.device:
            return
        key = t.untyped_storage()._cdata
        entry = self._storages.get(key)
        if entry is None:
            self.adopt(t, component)
            return
        ref, nbytes, old = entry
        self.live[old] -= nbytes
        self.live[component] += nbytes
        self._storages[key] = (ref, nbytes, component)

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting tensor ``t`` (a parameter an engine released: on the ``meta`` device in a real run too)."""
        if isinstance(t, torch.Tensor) and t.device.type == self.device:
            entry = self._storages.pop(t.untyped_storage()._cdata, None)
            if entry is not None:
                self.live[entry[2]] -= entry[1]

    def relabel_all(self, old: str, new: str) -> None:
        """Move everything live under component ``old`` to ``new`` (what a first step built and keeps: caches)."""
        for table in (self._storages, self._arrays):
            for key, (ref, nbytes, comp) in list(table.items()):
                if comp == old:
                    table[key] = (ref, nbytes, new)
                    self.live[old] -= nbytes
                    self.live[new] += nbytes

    def array(self, a: Any) -> None:
        """Count a kernel's returned :class:`~numba_kernels.work.ShapeArray` until it is collected."""
        key = id(a)
        comp, nbytes = self._component, int(a.nbytes)

        def _free(_ref: Any, key: int = key) -> None:
            entry = self._arrays.pop(key, None)
            if entry is not None:
                self.live[entry[2]] -= entry[1]

        self._arrays[key] = (weakref.ref(a, _free), nbytes, comp)
        self._count(comp, nbytes)

    def live_bytes(self, component: str | None = None) -> int:
        return sum(self.live.values()) if component is None else self.live[component]

    def reset_peak(self) -> None:
        """Start a new high-water mark from what is live now."""
        self.peak, self.peak_parts, self.peak_where = sum(self.live.values()), dict(self.live), self.where

    # -- work ----------------------------------------------------------------------------------------------
    def kernel(self, record: tuple) -> None:
        """A work record of a kernel's shape twin (:mod:`numba_kernels.work`)."""
        w = self.work[self._phase]
        kind = record[0]
        if kind in ("spmm", "attention"):
            getattr(w, kind).append((int(record[1]), int(record[2])))
        elif kind in ("mask", "score", "codec"):
            setattr(w, kind, getattr(w, kind) + float(record[1]))
        elif kind == "array":
            self.array(record[1])

    def message(self, out_bytes: int, in_bytes: int, peers: int, background: bool = False) -> None:
        """A point-to-point exchange this rank takes part in (``background``: it travels behind the compute)."""
        if peers > 0 and (out_bytes or in_bytes):
            w = self.work[self._phase]
            (w.background if background else w.exchanges).append((int(out_bytes), int(in_bytes), int(peers)))

    def allreduce(self, nbytes: int, ranks: int) -> None:
        if ranks > 1 and nbytes > 0:
            self.work[self._phase].allreduce.append((int(nbytes), int(ranks)))

    # -- the dispatch mode -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = _op_name(func)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        for t in outs:
            self.adopt(t)
        w = self.work[self._phase]
        if name in ("mm", "addmm", "bmm", "baddbmm", "addbmm"):
            a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "addbmm") else (args[0], args[1])
            inner = a.shape[-1]
            w.flops += 2.0 * math.prod(outs[0].shape) * inner if outs else 0.0
        elif name not in _FREE:
            ins = sum(_bytes(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            w.stream += ins + sum(_bytes(t) for t in outs)
        return out
