"""CPU twins: @njit(parallel=True, cache=True) kernels."""
