"""What each kernel costs and what it allocates, from its arguments' shapes alone: the kernels' shape twins.

The planner (:mod:`hpc_graph.plan`) runs the engines' real training step on tensors that have shapes and no
data. There, :func:`hpc_graph.ops._bridge.get_kernel` hands every op a *shape twin* of the kernel it asks for
(:func:`shape_kernel`): a callable with the kernel's signature that computes nothing, reports the work the kernel
would do (:data:`WORK`) and returns the arrays the kernel would return (:class:`ShapeArray`, shapes only). The
arrays a kernel writes into are the caller's, allocated and counted by the caller.

Work is reported as ``(category, units)`` pairs:

* ``("spmm", edges, width)``: a pass over ``edges`` stored edges gathering rows of ``width`` values (SpMM, its
  transpose, SDDMM);
* ``("attention", edges, width)``: the fused attention kernels over ``edges`` edges of ``width`` = heads x dim
  (a backward pass's two halves count once: its rate is measured over both);
* ``("score", elements)``: per-edge score passes (edge softmax);
* ``("mask", elements)``: counter-based dropout masks applied;
* ``("codec", elements)``: values through the low-bit message codec (encode or decode);
* ``("array", a)``: an array the kernel allocates and returns (its bytes are memory of the caller's).

Keep a declaration beside its kernel's signature when either changes (tests/numba_kernels/test_work.py runs every
declared kernel's twin against the real kernel's argument list).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np


class ShapeArray:
    """An array with a shape and a dtype and no data: what a kernel's shape twin takes and returns. C-contiguous
    (``strides`` in bytes, as NumPy's)."""

    __slots__ = ("shape", "dtype", "__weakref__")

    def __init__(self, shape: Any, dtype: Any):
        self.shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        out, step = [], self.itemsize
        for s in reversed(self.shape):
            out.append(step)
            step *= max(s, 1)
        return tuple(reversed(out))

    def reshape(self, *shape: Any) -> "ShapeArray":
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shape = list(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // max(known, 1)
        return ShapeArray(tuple(shape), self.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"ShapeArray({self.shape}, {self.dtype})"


def _rows(a: Any) -> int:
    return int(a.shape[0]) if a is not None and len(a.shape) else 0


def _width(a: Any) -> int:
    """Values per row of a [rows, ...] array."""
    return int(math.prod(a.shape[1:])) if a is not None and len(a.shape) > 1 else 1


def _elements(a: Any) -> int:
    return int(math.prod(a.shape)) if a is not None else 0


def _column_blocks(indptr, indices, eids, num_src, nb, with_eids=True):
    n, E = _rows(indptr) - 1, _rows(indices)
    out = (ShapeArray(nb * n + 1, np.int64), ShapeArray(E, np.int32 if num_src < 2**31 else np.int64),
           ShapeArray(E if with_eids else 0, np.int32 if E < 2**31 else np.int64))
    return [], out


def _transpose(indptr, indices, num_src, with_perm):
    E = _rows(indices)
    idx = np.int32 if indices.dtype == np.int32 and _rows(indptr) - 1 < 2**31 else np.int64
    return [], (ShapeArray(num_src + 1, np.int64), ShapeArray(E, idx), ShapeArray(E if with_perm else 0, np.int64))


#: kernel name -> function of the kernel's arguments returning ``(work records, returned arrays or None)``
WORK: dict[str, Callable[..., tuple[list[tuple], Any]]] = {
    "spmm.spmm_sum": lambda indptr, indices, eids, w, scale, x, out, mean, epilogue=None:
        ([("spmm", _rows(indices), _width(x))], None),
    "spmm.spmm_sum_blocked": lambda indptr, bptr, bidx, beid, nb, w, scale, x, out, mean, epilogue=None:
        ([("spmm", _rows(bidx), _width(x))], None),
    "spmm.column_blocks": _column_blocks,
    "spmm.spmm_max": lambda indptr, indices, eids, w, x, out, argmax: ([("spmm", _rows(indices), _width(x))], None),
    "spmm.spmm_max_backward": lambda indptr_t, indices_t, perm, w, argmax, go, gx:
        ([("spmm", _rows(indices_t), _width(go))], None),
    "spmm.spmm_max_weight_grad": lambda indptr, indices, argmax, x, go, gw:
        ([("spmm", _rows(indices), _width(go))], None),
    "sddmm.sddmm": lambda indptr, indices, a, b, out: ([("spmm", _rows(indices), _width(a))], None),
    "edge_softmax.edge_softmax": lambda indptr, scores, out: ([("score", _elements(scores))], None),
    "edge_softmax.edge_softmax_backward": lambda indptr, out, go, gs: ([("score", _elements(out))], None),
    "gat_attention.accumulate": lambda indptr, indices, z, *a, **k: ([("attention", _rows(indices), _width(z))], None),
    "gat_attention.backward_dst": lambda indptr, indices, z, *a, **k:
        ([("attention", _rows(indices), _width(z))], None),
    # the backward pass's rate is measured over both halves (hpc_graph.plan.profile): its edges count once
    "gat_attention.backward_src": lambda indptr_t, indices_t, z, *a, **k: ([], None),
    "gat_attention.finalize": lambda m, total, acc: ([], None),
    "gat_attention.output_delta": lambda go, out, delta: ([], None),
    "dot_attention.accumulate": lambda indptr, indices, q, k, v, *a, **kw:
        ([("attention", _rows(indices), _width(q) + _width(v))], None),
    "dot_attention.backward_dst": lambda indptr, indices, q, k, v, *a, **kw:
        ([("attention", _rows(indices), _width(q) + _width(v))], None),
    "dot_attention.backward_src": lambda indptr_t, indices_t, perm, q, k, v, *a, **kw: ([], None),
    "dot_attention.finalize": lambda m, total, acc: ([], None),
    "dot_attention.output_delta": lambda go, out, delta: ([], None),
    "dense_attention.accumulate_far": lambda q, kT, vT, far, scale, mptr, mcols, n, m, total, acc:
        ([("attention", _rows(q) * n, _width(q))], None),
    "dense_attention.backward_far": lambda q, kT, vT, far, scale, mptr, mcols, n, *a, **kw:
        ([("attention", _rows(q) * n, _width(q))], None),
    "dropout.dropout_apply": lambda x, key, cut, scale, out, ids=None: ([("mask", _elements(x))], None),
    "dropout.act_dropout_apply": lambda x, key, cut, scale, act, out, ids=None: ([("mask", _elements(x))], None),
    "dropout.act_dropout_grad": lambda x, g, key, cut, scale, act, out, ids=None: ([("mask", _elements(x))], None),
    # the codec's rate is measured over an encode (its row ranges included) and a decode: each value counts once
    "quant.row_range": lambda x, rows, lo, hi: ([], None),
    "quant.quantize_pack": lambda x, rows, zero, scale, ids, key, gs, cs, codes:
        ([("codec", _rows(rows) * _width(x))], None),
    "quant.unpack_dequantize": lambda codes, zero, scale, gs, cs, out_rows, out:
        ([("codec", _rows(out_rows) * _width(out))], None),
    "_transpose.csr_transpose": _transpose,
}


class ShapeKernel:
    """The shape twin of kernel ``name``: reports its work to ``report(record)`` and returns its declared arrays."""

    def __init__(self, name: str, report: Callable[[tuple], None] | None):
        if name not in WORK:
            raise NotImplementedError(f"kernel {name!r} has no shape twin (numba_kernels.work.WORK): the planner "
                                      "cannot run the op that calls it")
        self.name, self.report = name, report

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        records, out = WORK[self.name](*args, **kwargs)
        if self.report is not None:
            for rec in records:
                self.report(rec)
            for a in (out if isinstance(out, tuple) else () if out is None else (out,)):
                self.report(("array", a))  # memory the kernel allocates (the caller may keep it)
        return out


def shape_kernel(name: str, report: Callable[[tuple], None] | None = None) -> ShapeKernel:
    """The shape twin of ``"<family>.<function>"`` (``NotImplementedError`` for a kernel without a declaration)."""
    return ShapeKernel(name, report)
