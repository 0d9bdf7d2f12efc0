"""Epoch breakdown from a torch.profiler trace: self CPU time per category (shared by the runners).

Works with the torch of every baseline environment (2.2 and 2.13): it only reads
``FunctionEvent.name``, ``.self_cpu_time_total`` (microseconds) and ``.cpu_parent``.

Categories (first match wins, by the event's own name, except that everything
below an ``Optimizer.step`` range counts as ``optimizer``):

* ``spmm_fwd`` / ``spmm_bwd``: sparse aggregation (ours ``_SpMMSum``/``_SpMMMax``,
  DGL ``GSpMM``, PyG/torch ``scatter``/``index_add``/``sparse`` ops), split by a
  ``Backward`` in the name;
* ``attention``: SDDMM, edge softmax and fused GAT attention (ours ``_GATAttention``,
  DGL ``GSDDMM``/``EdgeSoftmax``), forward and backward;
* ``gemm``: ``aten::mm``/``addmm``/``bmm``/``matmul``/``linear`` self time;
* ``elementwise``: activations, dropout (ours counter-based dropout and the fused
  dropout-linear passes included), add/mul/copy and reductions;
* ``alloc``: ``aten::empty``/``zeros``/``fill_``/``zero_``;
* ``other``: the rest (loss, indexing, autograd bookkeeping).
"""
from __future__ import annotations

CATEGORIES = ("spmm_fwd", "spmm_bwd", "attention", "gemm", "elementwise", "alloc", "optimizer", "other")

_SPMM = ("spmm", "gspmm", "scatter", "index_add", "segment", "sparse", "sar", "aggregate", "halo")
_ATTN = ("sddmm", "gsddmm", "edgesoftmax", "edge_softmax", "gatattention", "gat_attention", "attention")
_GEMM = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::matmul", "aten::linear",
         "aten::baddbmm")
_ALLOC = ("aten::empty", "aten::empty_strided", "aten::zeros", "aten::zero_", "aten::fill_", "aten::ones",
          "aten::new_zeros", "aten::new_empty", "aten::empty_like", "aten::zeros_like")
_ELEM = ("relu", "elu", "threshold", "dropout", "add", "mul", "div", "sub", "copy", "clamp", "sum", "mean",
         "where", "exp", "neg", "leaky", "rsqrt", "pow", "bernoulli", "mask", "random", "sign", "cat", "stack")


def categorise(name: str, under_optimizer: bool, in_backward: bool = False) -> str:
    """Category of one profiler event (see the module docstring); ``in_backward``: the event or one of its
    ancestors is a backward node (DGL's ``GSpMMBackward`` calls ``GSpMM`` again)."""
    if under_optimizer:
        return "optimizer"
    low = name.lower()
    if any(k in low for k in _ATTN):
        return "attention"
    if any(k in low for k in _SPMM):
        return "spmm_bwd" if in_backward or "backward" in low else "spmm_fwd"
    if name in _GEMM:
        return "gemm"
    if name in _ALLOC:
        return "alloc"
    if any(k in low for k in _ELEM):
        return "elementwise"
    return "other"


def breakdown(events) -> dict:
    """``{category: seconds}`` (self CPU time) of a profiler's ``events()``; plus ``total``."""
    out = {c: 0.0 for c in CATEGORIES}
    for ev in events:
        parent, under = getattr(ev, "cpu_parent", None), ev.name.startswith("Optimizer.")
        back = "Backward" in ev.name
        while parent is not None:
            under = under or parent.name.startswith("Optimizer.")
            back = back or "Backward" in parent.name
            parent = getattr(parent, "cpu_parent", None)
        out[categorise(ev.name, under, back)] += ev.self_cpu_time_total / 1e6
    out["total"] = sum(out[c] for c in CATEGORIES)
    return out


def profile_step(step) -> dict:
    """Run ``step()`` once under torch.profiler (CPU) and return :func:`breakdown` of it, with ``wall``."""
    import time

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        step()
        wall = time.perf_counter() - t
    res = breakdown(prof.events())
    res["wall"] = wall
    res["top"] = [(e.key, e.self_cpu_time_total / 1e6) for e in
                  sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]]
    return res
