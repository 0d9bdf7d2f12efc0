"""hpc_graph.bench: benchmark code behind ``hpc-graph bench KIND`` (one module per kind).

* :mod:`hpc_graph.bench.kernels` — SpMM / SAGE / GAT kernels vs torch and PyG.
* :mod:`hpc_graph.bench.memory` — extra peak RSS of a call (background sampler).
"""

# The measurements ``hpc-graph bench kernels --ops`` accepts (here, so the CLI can list
# them without importing torch).
KERNEL_OPS = ("memcpy", "spmm", "sddmm", "sage", "gat", "locality", "compile", "attention")
