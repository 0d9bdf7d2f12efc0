"""hpc_graph.ops: torch.autograd.Functions combining numba kernels (and, for engines, communication)."""
from hpc_graph.ops.csr import CSR

__all__ = ["CSR"]
