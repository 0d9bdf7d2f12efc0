"""The kernels' shape twins (numba_kernels/work.py) see the calls the kernels see: a model's training step on
tensors without data makes the same kernel calls, in the same order, at the same sizes, as the real step on
random data, and gives outputs and gradients of the same shapes."""
import numpy as np
import pytest
import torch

import hpc_graph.ops._bridge as bridge
from hpc_graph.graph.whole_graph import WholeGraph
from hpc_graph.nn.models import build_model
from hpc_graph.ops.csr import CSR
from hpc_graph.plan.tracker import StepTracker
from numba_kernels.work import WORK


def _random_csr(n: int, e: int, seed: int) -> CSR:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = src != dst
    src, dst = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])  # undirected
    pairs = np.unique(np.stack([dst, src], 1), axis=0)
    return CSR.from_edges(pairs[:, 1], pairs[:, 0], n)


def _recorded_real_step(model, graph, x, calls):
    """One forward/backward on real data; every kernel call's declared work appended to ``calls``."""
    real = bridge._twin

    def recording(name, device="cpu"):
        fn = real(name, device)

        def call(*args, **kwargs):
            if name in WORK:
                recs, _ = WORK[name](*args, **kwargs)
                calls.extend(recs)
            return fn(*args, **kwargs)
        return call

    bridge._twin = recording
    try:
        out = model(graph, x)
        out.sum().backward()
    finally:
        bridge._twin = real
    return out


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_a_training_step_on_shapes_makes_the_real_steps_kernel_calls(name):
    n, e, f, c = 300, 1500, 24, 5
    g = _random_csr(n, e, seed=1)
    torch.manual_seed(0)
    kw = {"heads": 2} if name == "gat" else {}
    model = build_model(name, f, 16, c, num_layers=3, dropout=0.5, **kw)
    calls: list = []
    x = torch.randn(n, f)
    out = _recorded_real_step(model, WholeGraph(g), x, calls)
    grads = {k: tuple(p.grad.shape) for k, p in model.named_parameters()}

    meta_model = build_model(name, f, 16, c, num_layers=3, dropout=0.5, **kw).to("meta")
    sym = bool(g.is_symmetric())
    shape_g = CSR.of_shape(n, n, g.num_edges, symmetric=sym)
    tracker, seen = StepTracker(), []
    previous = bridge.set_work_hook(lambda rec: seen.append(rec) if rec[0] != "array" else tracker.kernel(rec))
    try:
        with tracker:
            mout = meta_model(WholeGraph(shape_g), torch.empty(n, f, device="meta"))
            mout.sum().backward()
    finally:
        bridge.set_work_hook(previous)
    assert seen == calls and len(calls) > 0
    assert tuple(mout.shape) == tuple(out.shape) and mout.dtype == out.dtype
    assert {k: tuple(p.grad.shape) for k, p in meta_model.named_parameters()} == grads
