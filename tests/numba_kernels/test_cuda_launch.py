"""``numba_kernels/cuda/_launch.py``: the per-dtype compile cache and the thread-safe CUDA-simulator swap.

The simulator runs a block's GPU threads as Python threads and swaps a fake
``cuda`` module into a device function's globals for each call; its own swap
races when the device function lives in another module than the kernel (a
thread left calling the real module, or the globals dict resized while another
thread iterates it). These tests drive :func:`thread_safe_swap` through the
interleaving that breaks the simulator's swap, under a many-thread stress, and
end to end: a kernel calling a device function from a second module, under
``NUMBA_ENABLE_CUDASIM=1``, with a sleep inside the device function that makes
the race near-certain without the fix.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
from numba import float32, float64

from numba_kernels.cuda._launch import compiled, thread_safe_swap

ROOT = Path(__file__).resolve().parents[2]


def test_compiled_builds_each_dtype_and_parameters_once_and_refuses_other_dtypes():
    built = []

    def build(nbtype, *params):
        built.append((nbtype, params))
        return object()

    get = compiled("toy", build)
    a = get(np.float32)
    assert get("float32") is a and get(np.dtype(np.float32)) is a
    b = get(np.float64, 4)
    assert get(np.float64, 4) is b and get(np.float64, 8) is not b
    assert built == [(float32, ()), (float64, (4,)), (float64, (8,))]
    with pytest.raises(ValueError, match="toy CUDA kernels support float32/float64, got float16"):
        get(np.float16)
    assert len(built) == 3


def _device_fn(real):
    """A function whose module globals hold ``cuda = real`` (as a device function's module does)."""
    module = types.ModuleType("fake_device_module")
    module.cuda = real
    exec("def f():\n    return cuda\n", module.__dict__)
    return module.f


def test_overlapping_calls_keep_the_fake_until_the_last_exit():
    real, fake = object(), object()
    f = _device_fn(real)
    swap = thread_safe_swap(real)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with swap(f, fake):
            seen["a"] = f()
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def thread_b():
        a_in.wait(5)
        with swap(f, fake):
            b_in.set()
            a_out.wait(5)  # a has left: the simulator's own swap has put the real module back here
            seen["b"] = f()

    ts = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert seen == {"a": fake, "b": fake}
    assert f() is real


def test_many_threads_two_modules_always_see_the_fake_and_restore():
    real, fake = object(), object()
    fns = [_device_fn(real), _device_fn(real)]
    swap = thread_safe_swap(real)
    bad = []

    def worker(i):
        f = fns[i % 2]
        for _ in range(300):
            with swap(f, fake):
                with swap(fns[(i + 1) % 2], fake):  # nested: a device function calling another module's
                    if f() is not fake:
                        bad.append(i)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
    assert not bad
    assert all(f() is real for f in fns)


def test_simulated_kernel_calling_another_modules_device_function(tmp_path):
    (tmp_path / "devmod.py").write_text(
        "import time\n"
        "from numba import cuda\n\n"
        "@cuda.jit(device=True)\n"
        "def tid_times(k):\n"
        "    time.sleep(0.002)  # the simulator runs this as Python: let the other threads in\n"
        "    return cuda.threadIdx.x * k\n")
    code = (
        "import numpy as np\n"
        "from numba import cuda\n"
        "import numba_kernels.cuda._launch\n"
        "from numba.cuda.simulator import kernel, kernelapi\n"
        "assert kernel.swapped_cuda_module is kernelapi.swapped_cuda_module\n"
        "assert kernel.swapped_cuda_module._hpc_graph_thread_safe\n"
        "import devmod\n\n"
        "@cuda.jit\n"
        "def k(out):\n"
        "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x\n"
        "    out[i] = devmod.tid_times(3)\n\n"
        "out = np.zeros(2 * 64, dtype=np.int64)\n"
        "for _ in range(3):\n"
        "    k[2, 64](out)\n"
        "    assert np.array_equal(out, np.tile(np.arange(64) * 3, 2)), out\n"
        "print('ok')\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr
