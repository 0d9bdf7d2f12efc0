"""``hpc_graph.plan.profile.kernel_rates`` on the graphs the engines hold (int32 or int64 columns)."""
import numpy as np
import pytest
import torch

from hpc_graph.ops.csr import CSR
from hpc_graph.plan.profile import kernel_rates


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_kernel_rates_with_gat_probes_on_either_index_type(index_dtype, monkeypatch):
    monkeypatch.setattr("hpc_graph.plan.profile.FRESH_CALLS", 1)  # one stream and mask call a round,
    monkeypatch.setattr("hpc_graph.plan.profile.STREAM_ELEMENTS", 1 << 18)  # on 1 MiB, not 64
    rng = np.random.default_rng(0)
    n = 300
    src, dst = rng.integers(0, n, 2000), rng.integers(0, n, 2000)
    g64 = CSR.from_edges(np.concatenate([src, dst]), np.concatenate([dst, src]), n)
    g = CSR(g64.indptr, g64.indices.numpy().astype(index_dtype), n)
    assert g.indices.dtype == torch.from_numpy(np.zeros(1, index_dtype)).dtype
    kr = kernel_rates(g, torch.float32, widths=(8, 16), gat_shapes=((1, 4), (2, 4)), gat=True, reps=1)
    for a, b in (kr.spmm_fwd, kr.spmm_bwd, kr.gat_fwd, kr.gat_bwd):
        assert np.isfinite(a) and np.isfinite(b)
    assert kr.gemm_flops > 0 and kr.stream > 0 and kr.mask > 0 and kr.score > 0
