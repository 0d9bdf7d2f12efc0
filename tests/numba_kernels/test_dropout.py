"""Counter-based dropout kernel (CPU and CUDA twins) against a plain Python reference of the mask."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
import torch

from numba_kernels.cpu.dropout import dropout_apply, key_hash

M64 = (1 << 64) - 1


def _ref_mask(n: int, key: int, cut: int) -> np.ndarray:
    kh = int(key_hash(key))
    keep = np.empty(n, dtype=bool)
    for i in range(n):
        z = ((kh ^ (i // 4)) + 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        keep[i] = ((z >> (16 * (i % 4))) & 0xFFFF) >= cut
    return keep


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 1000, 70001])
def test_mask_and_scale_match_the_reference(dtype, n):
    x = np.random.default_rng(n).standard_normal(n).astype(dtype) + 3.0  # no zeros
    out = np.full(n, np.nan, dtype)
    cut = int(0.3 * 65536)
    dropout_apply(x, 12345, cut, 1 / 0.7, out)
    keep = _ref_mask(n, 12345, cut) if n <= 1000 else None
    if keep is not None:
        np.testing.assert_array_equal(out != 0, keep)
    np.testing.assert_allclose(out[out != 0], x[out != 0] * dtype(1 / 0.7), rtol=1e-6)
    if n >= 1000:
        assert abs((out != 0).mean() - 0.7) < 0.02


def test_same_key_same_mask_any_thread_count_and_in_place():
    x = np.arange(1, 300001, dtype=np.float32)
    a, b = np.empty_like(x), np.empty_like(x)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        dropout_apply(x, 7, 20000, 2.0, a)
    finally:
        numba.set_num_threads(before)
    dropout_apply(x, 7, 20000, 2.0, b)
    np.testing.assert_array_equal(a, b)
    c = x.copy()
    dropout_apply(c, 7, 20000, 2.0, c)  # in place
    np.testing.assert_array_equal(a, c)
    d = np.empty_like(x)
    dropout_apply(x, 8, 20000, 2.0, d)
    assert not np.array_equal(a, d)


def test_op_backward_redraws_the_forward_mask_and_keeps_nothing():
    from hpc_graph.ops.dropout import dropout

    torch.manual_seed(0)
    x = (torch.rand(500, 33, dtype=torch.float64) + 1).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = dropout(x, 0.4)
    assert saved == []  # no mask, no input kept for backward
    g = torch.rand_like(y)
    y.backward(g)
    kept = y != 0
    torch.testing.assert_close(x.grad, torch.where(kept, g / (1 - round(0.4 * 65536) / 65536), torch.zeros_like(g)))


@pytest.mark.parametrize("n", [3, 4096, 70001])
def test_relu_dropout_forward_and_gradient_match_numpy(n):
    from numba_kernels.cpu.dropout import act_dropout_apply, act_dropout_grad

    rng = np.random.default_rng(n)
    x = rng.standard_normal(n)
    g = rng.standard_normal(n)
    cut, scale = 20000, 1 / (1 - 20000 / 65536)
    keep = np.empty(n)
    dropout_apply(np.ones(n), 31, cut, 1.0, keep)  # the mask of key 31 alone
    out = np.empty(n)
    act_dropout_apply(x, 31, cut, scale, 1, out)
    np.testing.assert_allclose(out, np.maximum(x, 0) * keep * scale, rtol=1e-15)
    act_dropout_grad(x, g, 31, cut, scale, 1, out)
    np.testing.assert_allclose(out, g * (x > 0) * keep * scale, rtol=1e-15)
    act_dropout_apply(x, 31, cut, scale, 0, out)  # no activation: plain dropout
    np.testing.assert_allclose(out, x * keep * scale, rtol=1e-15)
    with pytest.raises(ValueError, match="activation code"):
        act_dropout_apply(x, 31, cut, scale, 2, out)


@pytest.mark.parametrize("rows, width", [(1, 1), (5, 3), (257, 7), (3000, 128), (9000, 1)])
def test_row_ids_key_each_row_on_its_id(rows, width):
    """With row ids, a row's mask is the reference mask at positions id * width + c: the rows of any subset,
    in any order, get the masks they have in the whole tensor (and ids 0..R-1 the plain mask)."""
    from numba_kernels.cpu.dropout import act_dropout_apply, act_dropout_grad

    rng = np.random.default_rng(rows * width)
    total = rows + 11  # the "whole tensor" has more rows than the subset
    x_all = rng.standard_normal((total, width))
    g_all = rng.standard_normal((total, width))
    ids = rng.choice(total, rows, replace=False)  # a subset, shuffled
    cut, scale = 25000, 1 / (1 - 25000 / 65536)
    keep = _ref_mask(total * width, 77, cut).reshape(total, width)[ids].ravel() if total * width <= 40000 else None
    x, g = x_all[ids].ravel(), g_all[ids].ravel()
    whole, out = np.empty(total * width), np.empty(rows * width)
    dropout_apply(x_all.ravel(), 77, cut, scale, whole)
    dropout_apply(x, 77, cut, scale, out, ids=ids)
    np.testing.assert_array_equal(out, whole.reshape(total, width)[ids].ravel())
    if keep is not None:
        np.testing.assert_array_equal(out != 0, keep)
    plain = np.empty(rows * width)
    dropout_apply(x, 77, cut, scale, plain)
    dropout_apply(x, 77, cut, scale, out, ids=np.arange(rows))
    np.testing.assert_array_equal(out, plain)
    for act in (0, 1):
        act_dropout_apply(x_all.ravel(), 77, cut, scale, act, whole)
        act_dropout_apply(x, 77, cut, scale, act, out, ids=ids)
        np.testing.assert_array_equal(out, whole.reshape(total, width)[ids].ravel())
        act_dropout_grad(x_all.ravel(), g_all.ravel(), 77, cut, scale, act, whole)
        act_dropout_grad(x, g, 77, cut, scale, act, out, ids=ids)
        np.testing.assert_array_equal(out, whole.reshape(total, width)[ids].ravel())


def test_row_ids_that_do_not_cut_the_array_are_refused():
    x = np.ones(10)
    with pytest.raises(ValueError, match="10 elements do not make 3 rows"):
        dropout_apply(x, 1, 100, 1.0, np.empty(10), ids=np.arange(3))
    with pytest.raises(ValueError, match="ids must be a 1-D integer array"):
        dropout_apply(x, 1, 100, 1.0, np.empty(10), ids=np.ones(5))


def test_cuda_twin_under_the_simulator_drops_the_same_elements():
    code = """
import numpy as np
from numba import cuda
from numba_kernels.cpu import dropout as c
from numba_kernels.cuda import dropout as g
x = np.random.default_rng(1).standard_normal(1003).astype(np.float32) + 3  # blocks of threads and a tail
a = np.empty_like(x); c.dropout_apply(x, 99, 30000, 1.5, a)
dx, do = cuda.to_device(x), cuda.device_array_like(x)
g.dropout_apply(dx, 99, 30000, 1.5, do)
b = do.copy_to_host()
assert np.array_equal(a, b), (a[:8], b[:8])
xs = np.random.default_rng(2).standard_normal(1003).astype(np.float32)  # both signs: the ReLU matters
gr = np.random.default_rng(3).standard_normal(1003).astype(np.float32)
for act in (0, 1):
    a = np.empty_like(xs); c.act_dropout_apply(xs, 5, 20000, 1.25, act, a)
    do = cuda.device_array_like(xs); g.act_dropout_apply(cuda.to_device(xs), 5, 20000, 1.25, act, do)
    assert np.array_equal(a, do.copy_to_host()), act
    a = np.empty_like(xs); c.act_dropout_grad(xs, gr, 5, 20000, 1.25, act, a)
    do = cuda.device_array_like(xs); g.act_dropout_grad(cuda.to_device(xs), cuda.to_device(gr), 5, 20000, 1.25, act, do)
    assert np.array_equal(a, do.copy_to_host()), act
ids = np.random.default_rng(4).permutation(1200)[:13].astype(np.int64)  # 13 rows of 77 (1001 elements)
xr, grr = xs[:13 * 77], gr[:13 * 77]
a = np.empty_like(xr); c.dropout_apply(xr, 9, 30000, 1.5, a, ids=ids)
do = cuda.device_array_like(xr); g.dropout_apply(cuda.to_device(xr), 9, 30000, 1.5, do, ids=cuda.to_device(ids))
assert np.array_equal(a, do.copy_to_host())
for act in (0, 1):
    a = np.empty_like(xr); c.act_dropout_apply(xr, 5, 20000, 1.25, act, a, ids=ids)
    do = cuda.device_array_like(xr)
    g.act_dropout_apply(cuda.to_device(xr), 5, 20000, 1.25, act, do, ids=cuda.to_device(ids))
    assert np.array_equal(a, do.copy_to_host()), ("ids", act)
    a = np.empty_like(xr); c.act_dropout_grad(xr, grr, 5, 20000, 1.25, act, a, ids=ids)
    do = cuda.device_array_like(xr)
    g.act_dropout_grad(cuda.to_device(xr), cuda.to_device(grr), 5, 20000, 1.25, act, do, ids=cuda.to_device(ids))
    assert np.array_equal(a, do.copy_to_host()), ("ids grad", act)
print("ok")
"""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
