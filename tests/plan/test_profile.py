"""``hpc_graph.plan.profile.kernel_rates`` on the graphs the engines hold (int32 or int64 columns)."""
import time

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


def test_paired_rates_measure_each_graph_and_share_the_first_ones_parallel_fraction(monkeypatch):
    """paired_kernel_rates: each graph's rates are its own (a graph with twice the edges per row costs more per
    call, about the same per edge), timed in alternating rounds; the first graph's Amdahl fraction is everyone's."""
    from hpc_graph.plan import profile

    monkeypatch.setattr(profile, "FRESH_CALLS", 1)
    monkeypatch.setattr(profile, "STREAM_ELEMENTS", 1 << 18)
    rounds = []
    real_round = profile.KernelProbes.run_round

    def run_round(self):
        rounds.append(self.label)
        real_round(self)

    monkeypatch.setattr(profile.KernelProbes, "run_round", run_round)
    real_run = profile.KernelProbes._run

    def slow_b(self, record):  # graph b's every round (its warm-up too) takes 0.3 s more, outside its own timing
        real_run(self, record)
        if self.label == "b":
            time.sleep(0.3)

    monkeypatch.setattr(profile.KernelProbes, "_run", slow_b)
    rng = np.random.default_rng(1)
    n = 400

    def graph(m):
        src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
        return CSR.from_edges(np.concatenate([src, dst]), np.concatenate([dst, src]), n)

    a, b = graph(3000), graph(6000)
    before = torch.get_num_threads()
    t0 = time.perf_counter()
    ra, rb = profile.paired_kernel_rates([(a, "a"), (b, "b")], torch.float32, gat=False, reps=2)
    wall = time.perf_counter() - t0
    assert torch.get_num_threads() == before
    assert rounds == ["a", "b", "a", "b"]
    assert (ra.graph, rb.graph) == ("a", "b") and rb.parallel == ra.parallel
    for r in (ra, rb):
        assert r.threads == before and all(np.isfinite(x) and x >= 0 for x in (*r.spmm_fwd, *r.spmm_bwd))
    # each graph's time is its own, building and its rounds: b's three slow rounds (0.9 s), which came after a's
    # building and between a's rounds, are in neither (a clock since a's building would hold them)
    assert 0 < ra.seconds < wall - 0.85 and 0 < rb.seconds < wall - 0.85
    assert profile.paired_kernel_rates([], torch.float32) == []


def test_probe_rates_from_some_rounds_are_the_medians_of_those_rounds(monkeypatch):
    """KernelProbes.rates(rounds): the rates of the rounds picked (one round: that round's times), and a clear
    error before any timed round."""
    from hpc_graph.plan import profile

    monkeypatch.setattr(profile, "FRESH_CALLS", 1)
    monkeypatch.setattr(profile, "STREAM_ELEMENTS", 1 << 18)
    rng = np.random.default_rng(2)
    n = 200
    src, dst = rng.integers(0, n, 1500), rng.integers(0, n, 1500)
    g = CSR.from_edges(src, dst, n)
    probes = profile.KernelProbes(g, torch.float32, widths=(8, 16), gat=False, label="g", speedup=False)
    with pytest.raises(ValueError, match="no timed round"):
        probes.rates()
    probes.run_round()  # a real round gives the probes' keys; then every probe takes t seconds in round k
    keys = {key: len(v) for key, v in probes._rounds[0].items()}
    probes._rounds = [{key: [t] * k for key, k in keys.items()} for t in (0.5, 1.0, 3.0)]
    one = probes.rates([2])
    assert one.gemm_flops == pytest.approx(2.0 * 65536 * 128 * 128 * 2 / (2 * 3.0))
    assert probes.rates().gemm_flops == pytest.approx(2.0 * 65536 * 128 * 128 * 2 / (2 * 1.0))  # the median round
    assert probes.rates([0, 1]).gemm_flops == pytest.approx(2.0 * 65536 * 128 * 128 * 2 / (2 * 0.75))


def test_amdahl_fraction_recovers_the_fraction_from_times_at_any_two_thread_counts():
    """amdahl_fraction against the model it inverts (t(k) = 1 - f + f / k), either order of the two counts,
    clipped to [0, 1] where the times say more (or less) than any fraction would."""
    from hpc_graph.plan.profile import amdahl_fraction

    rng = np.random.default_rng(4)
    for _ in range(200):
        f = float(rng.random())
        k_a, k_b = (int(k) for k in rng.choice([1, 2, 3, 4, 8, 16], 2, replace=False))

        def t(k):
            return 1.0 - f + f / k

        assert amdahl_fraction(t(k_a) / t(k_b), k_a, k_b) == pytest.approx(f, abs=1e-9)
    assert amdahl_fraction(3.0, 1, 2) == 1.0  # faster than linear
    assert amdahl_fraction(0.8, 1, 2) == 0.0  # slower with more threads
    assert amdahl_fraction(1.7, 3, 3) == 1.0  # one count: nothing to extrapolate


def test_probes_run_at_the_thread_count_asked_and_measure_the_speed_up_at_another(monkeypatch):
    """KernelProbes(threads=k): every probe runs at k threads (the rates say k), the speed-up probes at one thread
    (or, for k = 1, at the process's count), and the process's thread counts are as before afterwards."""
    import numba

    from hpc_graph.plan import profile

    monkeypatch.setattr(profile, "FRESH_CALLS", 1)
    monkeypatch.setattr(profile, "STREAM_ELEMENTS", 1 << 18)
    rng = np.random.default_rng(5)
    n = 200
    g = CSR.from_edges(rng.integers(0, n, 1500), rng.integers(0, n, 1500), n)
    before = (numba.get_num_threads(), torch.get_num_threads())
    here = before[1]
    for k in (1, 2, 3):
        probes = profile.KernelProbes(g, torch.float32, widths=(8, 16), gat=False, label="g", threads=k)
        probes.run_round()
        ref = 1 if k > 1 else here
        counts = {name_k[1] for name_k in probes._rounds[0]}
        assert counts == ({k, ref} if ref != k else {k})
        assert probes.speedup == (ref != k)
        # the speed-up probes are the widest SpMM and the GEMMs, at the reference count
        assert {name for name, c in probes._rounds[0] if c != k} == (
            {"spmm_fwd 16", "spmm_bwd 16", "gemm_fwd", "gemm_wg"} if ref != k else set())
        r = probes.rates()
        assert r.threads == k and 0.0 <= r.parallel <= 1.0
        if ref == k:
            assert r.parallel == 1.0
        assert (numba.get_num_threads(), torch.get_num_threads()) == before
