"""hpc_graph.ops: torch.autograd.Functions combining numba kernels (and, for engines, communication)."""
from hpc_graph.ops.csr import CSR
from hpc_graph.ops.edge_softmax import edge_softmax
from hpc_graph.ops.sddmm import sddmm
from hpc_graph.ops.spmm import spmm, spmm_fused

__all__ = ["CSR", "spmm", "spmm_fused", "sddmm", "edge_softmax"]

# fused attention (block-wise state API in the modules themselves)
from hpc_graph.ops.dot_attention import dot_attention  # noqa: E402
from hpc_graph.ops.gat_attention import gat_attention  # noqa: E402

__all__ += ["gat_attention", "dot_attention"]
