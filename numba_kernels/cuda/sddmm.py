"""SDDMM over a destination-major CSR (CUDA twin of :mod:`numba_kernels.cpu.sddmm`).

One thread block per destination row (grid-stride); the block's threads
stride over the row's ``(edge, head)`` pairs and each computes one dot product
of length ``D``. Same arguments and semantics as the CPU twin.
"""
from __future__ import annotations

from numba import cuda

from numba_kernels.cuda._launch import compiled, stream

_THREADS = 128
_MAX_BLOCKS = 65535 * 4


def _build(nbtype):
    zero = nbtype(0)

    @cuda.jit
    def kernel(indptr, indices, a, b, out):
        H = a.shape[1]
        D = a.shape[2]
        for i in range(cuda.blockIdx.x, a.shape[0], cuda.gridDim.x):
            start = indptr[i]
            n_pairs = (indptr[i + 1] - start) * H
            for t in range(cuda.threadIdx.x, n_pairs, cuda.blockDim.x):
                k = start + t // H
                h = t % H
                j = indices[k]
                s = zero
                for d in range(D):
                    s += a[i, h, d] * b[j, h, d]
                out[k, h] = s

    return kernel


_kernel = compiled("sddmm", _build)


def sddmm(indptr, indices, a, b, out) -> None:
    """See :func:`numba_kernels.cpu.sddmm.sddmm`."""
    n = indptr.shape[0] - 1
    if n == 0 or out.shape[0] == 0:
        return
    _kernel(out.dtype)[min(n, _MAX_BLOCKS), _THREADS, stream()](indptr, indices, a, b, out)
