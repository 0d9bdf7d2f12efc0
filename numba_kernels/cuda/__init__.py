"""CUDA twins (numba.cuda), same names and arguments as numba_kernels.cpu."""
