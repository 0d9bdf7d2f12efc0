"""``hpc_graph.plan.predict``: the memory components of a planned step equal the tensors of a real ``single`` step;
the cut model, the rank statistics of a partition and the predictions' structure (no timing).

The multi-rank half (``dp``, ``sar``, ``sylvie`` and ``flow`` on 2 and 4 ranks) is ``tests/mpi/test_plan.py``; every
rank of every engine alone against its real step, ``tests/plan/test_rank_plan.py``.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from _measure import compare, measure, mismatches, predict
from data_io.generators.rmat import write_rmat
from data_io.partitioner import partition_dataset
from hpc_graph.plan import predict as fb
from hpc_graph.plan import shapes
from hpc_graph.plan.rates import Rates
from hpc_graph.train.config import config_from_dict, load_config
from hpc_graph.train.trainer import Trainer


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    write_rmat(d / "u.h5", 9, 8, feat_dim=12, num_classes=4, seed=1)
    write_rmat(d / "d.h5", 9, 8, feat_dim=12, num_classes=4, seed=2, symmetrize=False)
    partition_dataset(str(d / "u.h5"), str(d / "u-3"), 3)
    partition_dataset(str(d / "d.h5"), str(d / "d-1"), 1)
    return d


def _mc(**fields):
    """A config's ``model`` section with these fields (the others at their defaults)."""
    return config_from_dict({"data": {"path": "unused.h5"}, "model": fields}).model


def _trainer(tmp_path, path, name, **sections):
    raw = {"data": {"path": str(path)}, "engine": {"name": "single"},
           "model": {"name": name, "hidden": 8, "num_layers": 3, **({"heads": 2} if name == "gat" else {})},
           "train": {"epochs": 1, "progress": False, "run_dir": str(tmp_path / "run")}}
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(raw))
    return Trainer(load_config(p))


def _plan(engine, spec, g, rs, P, hints=None, **opts):
    """A rank planned on shapes (hpc_graph.plan.rank), the engine's options as given."""
    from hpc_graph.engines import engine_class
    from hpc_graph.plan.rank import plan_rank

    return plan_rank(engine_class(engine), opts, spec.model, g, rs, P, dtype=spec.dtype, optimizer=spec.optimizer,
                     momentum=spec.momentum, feature_norm=spec.feature_norm, hints=hints)


@pytest.fixture
def small_blocks():
    """Column-blocked SpMM copies on these small graphs too (32 KiB ranges instead of 32 MiB)."""
    spmm = importlib.import_module("hpc_graph.ops.spmm")
    old = spmm.BLOCK_BYTES
    spmm.BLOCK_BYTES = 8 << 10
    yield
    spmm.BLOCK_BYTES = old


@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "mlp"])
@pytest.mark.parametrize("graph", ["u.h5", "d.h5"])
def test_single_components_equal_the_tensors_of_a_real_step(tmp_path, graphs, small_blocks, model, graph):
    tr = _trainer(tmp_path, graphs / graph, model)
    got, want = measure(tr), predict(tr)
    assert mismatches(got, want, 1) == []
    assert got["saved"] > 0 and got["graph"] > 0


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
@pytest.mark.parametrize("engine", ["dp", "sar"])
def test_one_part_components(tmp_path, graphs, small_blocks, model, engine):
    """dp and sar on one rank (a 1-part partition): no halo, but dp still concatenates and returns nothing."""
    tr = _trainer(tmp_path, graphs / "d-1", model, engine={"name": engine})
    got = measure(tr)
    assert mismatches(got, predict(tr), 1) == [] and got["bytes_sent"] == 0


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_single_components_other_settings(tmp_path, graphs, model):
    # float64, hidden wider than the features (SAGE aggregates first), no dropout, SGD with momentum,
    # row-normalised features (two copies)
    tr = _trainer(tmp_path, graphs / "u.h5", model, model={"hidden": 20, "dropout": 0.0},
                  train={"dtype": "float64"}, optim={"name": "sgd", "momentum": 0.9},
                  data={"feature_norm": "row"})
    assert compare(tr) == []


@pytest.mark.parametrize("engine,graph", [("single", "u.h5"), ("dp", "d-1"), ("sar", "d-1")])
def test_gat_attention_dropout_components(tmp_path, graphs, engine, graph):
    # attention dropout keys its masks by global ids: the ids are checked on real data only
    tr = _trainer(tmp_path, graphs / graph, "gat", model={"attn_dropout": 0.5}, engine={"name": engine})
    assert compare(tr) == []


def test_a_wrong_model_would_be_noticed(tmp_path, graphs):
    """The comparison is sharp: predicting for another width than the trained model differs."""
    tr = _trainer(tmp_path, graphs / "u.h5", "gcn")
    got = measure(tr)
    g = shapes.graph_from_dataset(graphs / "u.h5")
    spec = fb.step_spec(dataclasses.replace(tr.config.model, hidden=9), g.features, g.classes)
    assert _plan("single", spec, g, shapes.single_layout(g).parts[0], 1).saved != got["saved"]


def test_partition_statistics(graphs):
    meta = json.loads((graphs / "u-3" / "partition.json").read_text())
    lay = shapes.layout_from_partition(graphs / "u-3")
    assert lay.ranks == 3 and len(lay.parts) == 3 and not lay.notes
    for rs, info in zip(lay.parts, meta["parts"]):
        assert (rs.owned, rs.edges, rs.halo, rs.send) == (info["num_nodes"], info["num_edges"], info["num_halo"],
                                                          info["num_send"])
        assert sum(rs.halo_from) == rs.halo and sum(rs.send_to) == rs.send and rs.halo_from[rs.rank] == 0
        assert rs.local_edges == info["num_edges"] - info["cut_edges"]
    # every row a rank sends is a halo row of its peer
    for p in lay.parts:
        for q in lay.parts:
            assert p.send_to[q.rank] == q.halo_from[p.rank]
    one, rs = shapes.rank_from_partition(graphs / "u-3", 2)
    assert rs == lay.parts[2] and one.ranks == 3


def test_partition_without_part_files_spreads_the_halo(graphs, tmp_path):
    import shutil

    d = tmp_path / "meta-only"
    d.mkdir()
    shutil.copy(graphs / "u-3" / "partition.json", d / "partition.json")
    lay = shapes.layout_from_partition(d)
    assert lay.notes and "evenly" in lay.notes[0]
    for rs in lay.parts:
        assert sum(rs.halo_from) == rs.halo and rs.halo_from[rs.rank] == 0


def test_cut_fraction_model():
    assert shapes.cut_fraction_at(1, 0.3, None) == 0.0
    assert shapes.cut_fraction_at(16, 0.3, None) == 0.3
    assert shapes.cut_fraction_at(4, 0.3, 4) == pytest.approx(0.3)
    assert shapes.cut_fraction_at(16, 0.3, 4) == pytest.approx(1 - 0.7 ** 2)
    for P in (2, 8, 64):  # a random partition is its own recursive-bisection extension
        assert shapes.cut_fraction_at(P, 0.5, 2) == pytest.approx(1 - 1 / P)
    # halo: uniform sources saturate at the remote nodes; skewed degrees give fewer distinct sources
    assert shapes.expected_halo(0, 100) == 0.0
    assert shapes.expected_halo(1e9, 100) == pytest.approx(100)
    assert shapes.expected_halo(10, 1e6) == pytest.approx(10, rel=1e-4)
    deg = np.array([1000.0] + [1.0] * 999)
    assert shapes.expected_halo(500, 1000, deg, deg.sum()) < shapes.expected_halo(500, 1000)


def test_cut_model_layout():
    g = shapes.GraphShape(nodes=1_000_000, edges=16_000_000, features=128, classes=10, train_nodes=10_000)
    lay = shapes.layout_from_cut_model(g, 8, 0.25, edge_imbalance=1.5)
    (rs,) = lay.parts
    assert rs.owned == 125_000 and rs.edges == 3_000_000
    assert rs.local_edges == 3_000_000 - 750_000
    assert 0 < rs.halo <= 750_000 and rs.send == rs.halo and rs.train == 1250
    assert sum(rs.halo_from) == rs.halo and rs.halo_from[0] == 0 and len(rs.halo_from) == 8
    assert "c = 0.250" in lay.source


def test_papers100m_description_gives_an_answer():
    g = shapes.GraphShape(nodes=111_059_956, edges=1_615_685_872, features=128, classes=172,
                      train_nodes=int(0.011 * 111_059_956))
    spec = fb.step_spec(_mc(name="sage", hidden=256, num_layers=3, dropout=0.5), 128, 172)
    peaks = {}
    for engine in ("dp", "sar"):
        for P in (16, 32, 64, 128):
            lay = shapes.layout_from_cut_model(g, P, 0.3)
            pred = fb.predict(engine, spec, g, lay, floor=fb.DEFAULT_FLOOR_BYTES, memory_per_rank=192 << 30,
                              cores_per_node=72, ranks_per_node=1)
            peaks[engine, P] = pred.memory.peak
            assert pred.time is None and pred.bottleneck in ("memory", "-")
    for engine in ("dp", "sar"):  # memory per rank falls with ranks
        assert peaks[engine, 16] > peaks[engine, 32] > peaks[engine, 64] > peaks[engine, 128]
    assert all(peaks["sar", P] < peaks["dp", P] for P in (16, 32, 64, 128))
    single = fb.predict("single", spec, g, shapes.single_layout(g), floor=0, memory_per_rank=192 << 30)
    assert single.fits is False and single.bottleneck == "memory" and single.memory.peak > 192 << 30


def test_time_terms_follow_the_rates():
    g = shapes.GraphShape(nodes=20_000, edges=400_000, features=64, classes=8, train_nodes=2_000)
    spec = fb.step_spec(_mc(name="gat", hidden=16, num_layers=2, dropout=0.5, heads=4, out_heads=1), 64, 8)
    rates = Rates(spmm_fwd=(1e-9, 1e-10), spmm_bwd=(1e-9, 1e-10), gat_fwd=(2e-9, 1e-10), gat_bwd=(4e-9, 2e-10),
                     gemm_flops=1e10, stream=1e10, threads=2, parallel=1.0, exchange=(1e-4, 1e9),
                     allreduce=(1e-4, 1e9))
    lay = shapes.layout_from_cut_model(g, 4, 0.3)
    dp = fb.predict("dp", spec, g, lay, floor=0, rates=rates, cores_per_node=8, ranks_per_node=4)
    sar = fb.predict("sar", spec, g, lay, floor=0, rates=rates, cores_per_node=8, ranks_per_node=4)
    for p in (dp, sar):
        assert p.time.compute > 0 and p.time.halo > 0 and p.time.allreduce > 0
        assert p.time.terms["attention"] > 0 and p.time.terms["spmm"] == 0
        assert p.time.total == pytest.approx(p.time.compute + p.time.halo + p.time.allreduce)
    # SAR's GAT fetches every remote block again in the backward pass: more messages and bytes than dp
    assert sar.time.messages > dp.time.messages and sar.time.halo_bytes > dp.time.halo_bytes
    # 4 ranks on 2 cores instead of 8: one thread each (half of the 2 measured) on half a core each
    slow = fb.predict("dp", spec, g, lay, floor=0, rates=rates, cores_per_node=2, ranks_per_node=4)
    assert (slow.threads, slow.cores_share) == (1, 0.5) and (dp.threads, dp.cores_share) == (2, 2.0)
    assert slow.time.compute == pytest.approx(4 * dp.time.compute, rel=1e-9)
    # the calibration's per-epoch overhead adds to every rank's compute (a term of its own) and nothing else
    cal = fb.predict("dp", spec, g, lay, floor=0, rates=dataclasses.replace(rates, step_overhead=0.7),
                     cores_per_node=8, ranks_per_node=4)
    assert dp.time.terms["overhead"] == 0.0 and cal.time.terms["overhead"] == pytest.approx(0.7, rel=1e-12)
    assert cal.time.compute == pytest.approx(dp.time.compute + 0.7, rel=1e-12)
    for term, seconds in dp.time.terms.items():
        if term != "overhead":
            assert cal.time.terms[term] == seconds
    assert (cal.time.halo, cal.time.allreduce) == (dp.time.halo, dp.time.allreduce)
    assert all(b == pytest.approx(a + 0.7, rel=1e-12) for a, b in zip(dp.rank_seconds, cal.rank_seconds))
    # a rank on half a core runs it twice as long; a negative overhead removes at most half the kernels' time
    slow_cal = fb.predict("dp", spec, g, lay, floor=0, rates=dataclasses.replace(rates, step_overhead=0.7),
                          cores_per_node=2, ranks_per_node=4)
    assert slow_cal.time.compute == pytest.approx(slow.time.compute + 1.4, rel=1e-12)
    neg = fb.predict("dp", spec, g, lay, floor=0, rates=dataclasses.replace(rates, step_overhead=-1e9),
                     cores_per_node=8, ranks_per_node=4)
    assert neg.time.compute == pytest.approx(0.5 * dp.time.compute, rel=1e-12)
    # per thread count: a rank uses the overhead measured nearest its threads (2 here; 1 on 4 ranks of 2 cores)
    both = dataclasses.replace(rates, step_overhead=9.0, step_overhead_threads={1: 3.0, 2: 1.5})
    assert both.step_overhead_for(2) == 1.5 and both.step_overhead_for(1) == 3.0 and both.step_overhead_for(64) == 1.5
    assert fb.predict("dp", spec, g, lay, floor=0, rates=both, cores_per_node=8, ranks_per_node=4).time.compute \
        == pytest.approx(1.5 + dp.time.compute, rel=1e-12)
    assert fb.predict("dp", spec, g, lay, floor=0, rates=both, cores_per_node=2, ranks_per_node=4).time.compute \
        == pytest.approx(2 * 3.0 + slow.time.compute, rel=1e-12)


def test_measured_contention_replaces_the_time_slice_model():
    """Where the plan measured how much slower ranks oversubscribing a node run (Rates.contention, per threads per
    core), that factor replaces "k threads per core run k times slower" for the kernels and the overhead alike;
    other ratios, and ranks that do not oversubscribe, are untouched."""
    g = shapes.GraphShape(nodes=20_000, edges=400_000, features=64, classes=8, train_nodes=2_000)
    spec = fb.step_spec(_mc(name="gat", hidden=16, num_layers=2, dropout=0.5, heads=4, out_heads=1), 64, 8)
    rates = Rates(spmm_fwd=(1e-9, 1e-10), spmm_bwd=(1e-9, 1e-10), gat_fwd=(2e-9, 1e-10), gat_bwd=(4e-9, 2e-10),
                     gemm_flops=1e10, stream=1e10, threads=1, parallel=1.0, exchange=(1e-4, 1e9),
                     allreduce=(1e-4, 1e9), step_overhead=0.3)
    lay = shapes.layout_from_cut_model(g, 4, 0.3)
    rng = np.random.default_rng(5)
    f = float(rng.uniform(2.2, 4.0))
    measured = dataclasses.replace(rates, contention={2.0: f, 4.0: 9.0})
    assert (measured.oversubscribed(2.0) == f and measured.oversubscribed(3.0) is None
            and rates.oversubscribed(2.0) is None)

    def compute(r, cores):
        t = fb.predict("dp", spec, g, lay, floor=0, rates=r, cores_per_node=cores, ranks_per_node=4).time
        return t.compute - t.terms["overhead"], t.terms["overhead"]

    free, free_over = compute(rates, 4)  # one core each: nothing to measure, nothing changes
    assert compute(measured, 4) == (free, free_over) and free_over == pytest.approx(0.3)
    plain, plain_over = compute(rates, 2)  # two threads per core: twice as long without a measurement
    assert plain == pytest.approx(2 * free, rel=1e-12) and plain_over == pytest.approx(0.6)
    got, got_over = compute(measured, 2)
    assert got == pytest.approx(f * free, rel=1e-12) and got_over == pytest.approx(f * 0.3, rel=1e-12)
    assert compute(measured, 3) == compute(rates, 3)  # 4/3 threads per core: not measured


def test_graph_transformer_is_not_planned_and_trains(tmp_path):
    """A graph transformer's attention pattern comes from the graph's structure: the planner says it has no plan
    (train starts without a memory estimate) instead of refusing the run; the dataset's Laplacian encodings are
    sized from the file."""
    from data_io.dataset import open_dataset
    from data_io.generators.rmat import write_rmat
    from data_io.preprocess import add_node_field, laplacian_pe
    from hpc_graph.plan.predict import train_estimate

    path = tmp_path / "pe.h5"
    write_rmat(path, 7, 4, feat_dim=6, num_classes=3, seed=5)
    with open_dataset(path) as ds:
        indptr, src, n = ds.indptr(), ds.indices(), ds.num_nodes
    add_node_field(path, "lap_pe", laplacian_pe(indptr, src, n, 5))
    assert shapes.graph_from_dataset(path).lap_pe == 5
    tr = _trainer(tmp_path, path, "gt", model={"hidden": 8, "heads": 2, "num_layers": 2, "pe_dim": 4})
    assert train_estimate(tr.config, "single", 0, 1) is None
    tr.step()


def test_every_model_is_planned_and_an_engine_without_a_plan_is_named():
    """The planner runs the model's own step: every registered model plans (no list of the models it knows); an
    engine without a planning path, or one process asked for more ranks, is refused by name."""
    g = shapes.GraphShape(nodes=300, edges=2400, features=8, classes=3, train_nodes=60)
    for name, extra in (("gcn2", {}), ("jknet", {}), ("appnp", {"hops": 3}), ("gcn", {"residual": True,
                                                                                       "batchnorm": True})):
        from hpc_graph.train.config import config_from_dict

        mc = config_from_dict({"data": {"path": "x"}, "model": {"name": name, "hidden": 8, **extra}}).model
        spec = fb.step_spec(mc, 8, 3)
        pred = fb.predict("single", spec, g, shapes.single_layout(g), floor=0)
        assert pred.memory.peak > spec.parameters * 4 * 4 and pred.memory.saved > 0
    spec = fb.step_spec(_mc(name="gcn", hidden=8, num_layers=2, dropout=0.5), 8, 3)
    with pytest.raises(NotImplementedError, match="seqpar"):
        _plan("seqpar", spec, g, shapes.single_layout(g).parts[0], 1)
    with pytest.raises(ValueError, match="single"):
        fb.predict("single", spec, g, shapes.layout_from_cut_model(g, 2, 0.5), floor=0)


def test_train_estimate(tmp_path, graphs):
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump({"data": {"path": str(graphs / "u-3")}, "engine": {"name": "sar"},
                                        "model": {"name": "sage", "hidden": 8}}))
    cfg = load_config(cfg_path)
    need, text = fb.train_estimate(cfg, "sar", 1, 3)
    assert need > fb.KERNEL_ALLOWANCE_BYTES and "sar sage, rank 1" in text
    cfg.model.name = "gcn2"  # any model: the planner runs its own step
    need2, text2 = fb.train_estimate(cfg, "sar", 1, 3)
    assert need2 != need and "sar gcn2, rank 1" in text2
    assert fb.train_estimate(cfg, "minibatch", 1, 3) is None
    # a graph-level dataset trains on batches of small graphs: not the full-batch step the estimate describes
    from data_io.dataset import write_dataset
    from data_io.generators.graph_tasks import generate_reg3cc

    write_dataset(tmp_path / "graphs.h5", generate_reg3cc(6, 8, 8, seed=1))
    cfg.model.name, cfg.data.path = "sage", str(tmp_path / "graphs.h5")
    assert fb.train_estimate(cfg, "single", 0, 1) is None
    cfg.data.path = str(graphs / "u-3")
    assert fb.train_estimate(cfg, "sar", 1, 3) is not None


def test_rates_from_kernel_rates_copy_every_shared_field():
    from hpc_graph.plan.profile import KernelRates

    kr = KernelRates(spmm_fwd=(1.0, 2.0), spmm_bwd=(3.0, 4.0), gat_fwd=(5.0, 6.0), gat_bwd=(7.0, 8.0),
                     gemm_flops=9.0, stream=10.0, mask=11.0, score=12.0, codec=14.0, threads=13, parallel=0.5,
                     graph="g", seconds=1.0)
    r = Rates.from_kernels(kr, exchange=(1e-6, 1e9), sources={"links": "x"})
    for name in ("spmm_fwd", "spmm_bwd", "gat_fwd", "gat_bwd", "gemm_flops", "stream", "mask", "score", "codec",
                 "threads", "parallel"):
        assert getattr(r, name) == getattr(kr, name), name
    assert r.exchange == (1e-6, 1e9) and r.sources == {"links": "x"} and r.allreduce is None


# -- sylvie: what its options change ---------------------------------------------------------------------------
def _sylvie_setup():
    g = shapes.GraphShape(nodes=20_000, edges=400_000, features=64, classes=8, train_nodes=2_000)
    lay = shapes.layout_from_cut_model(g, 4, 0.3)
    rates = Rates(spmm_fwd=(1e-9, 1e-10), spmm_bwd=(1e-9, 1e-10), gat_fwd=(2e-9, 1e-10), gat_bwd=(4e-9, 2e-10),
                  gemm_flops=1e10, stream=1e10, codec=1e9, exchange=(1e-4, 1e8), allreduce=(1e-4, 1e9))
    return g, lay, rates


def _spec(model, layers=3):
    return fb.step_spec(_mc(name=model, hidden=16, num_layers=layers, dropout=0.5, heads=2, out_heads=1), 64, 8)


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_sylvie_full_precision_moves_what_dp_moves(model):
    g, lay, rates = _sylvie_setup()
    spec = _spec(model)
    dp = fb.predict("dp", spec, g, lay, floor=0, rates=rates)
    full = fb.predict("sylvie", spec, g, lay, floor=0, rates=rates, options={"bits": 32})
    low = fb.predict("sylvie", spec, g, lay, floor=0, rates=rates, options={"bits": 2})
    auto = fb.predict("sylvie", spec, g, lay, floor=0, rates=rates, options={"bits": "auto"})
    eight = fb.predict("sylvie", spec, g, lay, floor=0, rates=rates, options={"bits": 8})
    assert full.time.bytes_sent == dp.time.bytes_sent + 16  # + the bit policy's loss and time
    assert full.time.messages == dp.time.messages
    # narrow rows: scales weigh
    assert low.time.bytes_sent < full.time.bytes_sent / 3 and low.time.halo < full.time.halo
    assert low.time.terms["codec"] > 0 and "codec" not in dp.time.terms
    assert auto.time.bytes_sent == eight.time.bytes_sent  # auto is planned at its widest width
    for a, b in ((dp, full), (dp, low)):  # the same graph's features and parameters
        assert (a.memory.features, a.memory.params) == (b.memory.features, b.memory.params)


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_sylvie_pipeline_sends_behind_the_step_and_holds_more(model):
    g, lay, rates = _sylvie_setup()
    spec = _spec(model)
    rs = lay.parts[0]
    sync = _plan("sylvie", spec, g, rs, 4, bits=4)
    pipe = _plan("sylvie", spec, g, rs, 4, bits=4, pipeline="on")
    train = ("forward", "backward")
    assert all(not sync.work[p].background for p in train) and any(sync.work[p].exchanges for p in train)
    assert all(not pipe.work[p].exchanges for p in train)  # the stale step waits for the previous step's messages
    assert sorted(x for p in train for x in pipe.work[p].background) == \
        sorted(x for p in train for x in sync.work[p].exchanges)
    t_sync = fb.time_of(sync, rates, threads=1, cores_share=1.0, ranks=4)
    t_pipe = fb.time_of(pipe, rates, threads=1, cores_share=1.0, ranks=4)
    assert t_pipe.bytes_sent == t_sync.bytes_sent
    assert t_pipe.hidden == pytest.approx(min(t_sync.halo, t_pipe.compute))
    assert t_pipe.halo == pytest.approx(max(0.0, t_sync.halo - t_pipe.compute))
    t_node = fb.time_of(pipe, rates, threads=1, cores_share=1.0, ranks=4, overlap=False)
    assert t_node.hidden == 0 and t_node.halo == pytest.approx(t_sync.halo)
    assert pipe.peak > sync.peak  # the previous step's halo rows and gradients, and the ones in flight


# -- flow: one stage of layers per rank on the whole graph ----------------------------------------------------
def _flow_setup(model="gcn", layers=4):
    g = shapes.GraphShape(nodes=20_000, edges=400_000, features=64, classes=8, train_nodes=2_000)
    return g, _spec(model, layers)


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_flow_stages_split_parameters_and_send_the_activations(model):
    g, spec = _flow_setup(model)
    bounds = fb.stage_bounds(spec.layers, 2)
    whole = shapes.replicated_layout(g, 2).parts
    plans = [_plan("flow", spec, g, whole[p], 2, hints={"boundaries": bounds}, stage_split="count")
             for p in range(2)]
    opt = 2 + 1 + 1 + 1  # parameters, gradients, Adam's two moments, the best-validation copy
    assert sum(p.held["params"] for p in plans) == spec.num_params() * spec.dbytes * opt
    # the boundary's activations go forward and their gradients back: N x width each, one message per micro-batch
    flags = (2 + 2 * 2) * spec.dbytes
    assert plans[0].bytes_sent == plans[1].bytes_sent and plans[0].bytes_sent > flags
    assert (plans[0].bytes_sent - flags) % (g.nodes * spec.dbytes) == 0
    # both hold the whole graph and the features
    assert plans[0].load_held["graph"] == plans[1].load_held["graph"]
    assert plans[0].load_held["features"] == plans[1].load_held["features"]


def test_flow_epoch_is_the_stages_one_after_the_other():
    g, spec = _flow_setup("sage")
    rates = Rates(spmm_fwd=(1e-9, 1e-10), spmm_bwd=(1e-9, 1e-10), gat_fwd=(0, 0), gat_bwd=(0, 0), gemm_flops=1e10,
                  stream=1e10, exchange=(1e-4, 1e9), allreduce=(1e-4, 1e9))
    lay = shapes.replicated_layout(g, 2)
    pred = fb.predict("flow", spec, g, lay, floor=0, rates=rates, cores_per_node=2, ranks_per_node=2,
                      options={"stage_split": "count"})
    assert len(pred.rank_seconds) == 2
    assert pred.time.total == pytest.approx(pred.time.compute + pred.time.halo + pred.time.allreduce)
    stages = [fb.time_of(_plan("flow", spec, g, lay.parts[p], 2, hints={"boundaries": [0, 2, 4]}), rates,
                         threads=1, cores_share=1.0, ranks=2) for p in range(2)]
    assert pred.time.compute == pytest.approx(sum(x.compute for x in stages))
    assert pred.time.halo == pytest.approx(sum(x.halo for x in stages) / 2) and pred.time.halo > 0
    assert any("flow: 2 stage(s), layers 1-2, 3-4 (by count)" in n for n in pred.layout.notes)
    single = fb.predict("single", spec, g, shapes.single_layout(g), floor=0, rates=rates, cores_per_node=2,
                        ranks_per_node=1)
    one = fb.predict("flow", spec, g, shapes.replicated_layout(g, 1), floor=0, rates=rates, cores_per_node=2,
                     ranks_per_node=1, options={"stage_split": "count"})
    assert one.time.compute == pytest.approx(single.time.compute, rel=0.02)  # one stage is single's step
    # by cost: the stages are cut where the predicted layer costs balance
    by_cost = fb.predict("flow", spec, g, lay, floor=0, rates=rates, cores_per_node=2, ranks_per_node=2,
                         options={"stage_split": "cost"})
    costs = fb.unit_costs(__import__("hpc_graph.engines", fromlist=["engine_class"]).engine_class("flow"),
                          {"stage_split": "cost"}, spec, g, rates, threads=1, cores_share=1.0)
    b = fb.stage_bounds(spec.layers, 2, costs)
    assert any(f"layers 1-{b[1]}, {b[1] + 1}-4 (predicted layer costs)" in n for n in by_cost.layout.notes)


def test_flow_options_the_planner_does_not_run_are_named():
    g, spec = _flow_setup()
    with pytest.raises(NotImplementedError, match="engine.cross_edges"):
        _plan("flow", spec, g, shapes.replicated_layout(g, 2).parts[0], 2, microbatches=4, cross_edges="stale")
    _plan("flow", spec, g, shapes.replicated_layout(g, 2).parts[0], 2, hints={"boundaries": [0, 2, 4]},
          microbatches=1, cross_edges="drop")
    with pytest.raises(ValueError, match="engine.stages"):
        fb.stage_bounds(3, 4)


def test_the_memory_check_fails_closed_and_skips_only_plainly_small_jobs(tmp_path, graphs, monkeypatch):
    """An estimate that raises refuses the run in one line (--force starts anyway); a job whose data are tiny
    beside the memory available is not estimated at all."""
    import hpc_graph.plan.predict as pr
    from data_io.memory import MemoryRefusal
    from hpc_graph.train.preflight import _plainly_fits, check_memory

    tr = _trainer(tmp_path, graphs / "u.h5", "gcn")

    def broken(*args, **kwargs):
        raise pr.PlanError("RuntimeError: a planner bug")

    monkeypatch.setattr(pr, "train_estimate", broken)  # inherited by the forked child that runs the estimate
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "100MB")  # not plainly enough: the estimate is needed
    with pytest.raises(MemoryRefusal, match=r"memory check: cannot estimate train \(single gcn, rank 0\): "
                                            r"RuntimeError: a planner bug; pass --force to start anyway"):
        check_memory(tr, False)
    check_memory(tr, True)  # forced: a warning
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "64GB")
    check_memory(tr, False)  # plainly fits: not estimated
    size = (graphs / "u.h5").stat().st_size
    assert _plainly_fits(str(graphs / "u.h5"), 0, 2 * 64 * size) and not _plainly_fits(str(graphs / "u.h5"), 1,
                                                                                         2 * 64 * size)
    assert not _plainly_fits(str(tmp_path / "missing.h5"), 0, 1 << 40)


def test_the_estimate_apart_answers_as_in_process_and_leaves_the_tracing_stack_out(tmp_path, graphs):
    """The training process's memory check runs the estimate in a forked child: the same answer, and the child's
    imports (torch's tracing stack) never reach the parent (checked in a fresh interpreter)."""
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump({"data": {"path": str(graphs / "u-3")}, "engine": {"name": "sar"},
                                        "model": {"name": "gat", "hidden": 8, "heads": 2}}))
    code = ("import sys\nfrom hpc_graph.train.config import load_config\nfrom hpc_graph.plan.predict import "
            f"train_estimate, train_estimate_apart\ncfg = load_config({str(cfg_path)!r})\n"
            "before = 'torch._dynamo' in sys.modules\napart = train_estimate_apart(cfg, 'sar', 2, 3)\n"
            "print(before, 'torch._dynamo' in sys.modules, train_estimate_apart(cfg, 'minibatch', 2, 3))\n"
            "print(apart == train_estimate(cfg, 'sar', 2, 3), 'torch._dynamo' in sys.modules)\n")  # in process
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "None", "True", "True"]


def test_the_estimate_apart_fails_closed_when_its_child_dies_or_hangs(tmp_path, graphs, monkeypatch):
    import hpc_graph.plan.predict as pr

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump({"data": {"path": str(graphs / "u-3")}, "model": {"name": "gcn"}}))
    cfg = load_config(cfg_path)
    monkeypatch.setattr(pr, "train_estimate", lambda *a: os._exit(3))
    with pytest.raises(pr.PlanError, match="ended without an answer"):
        pr.train_estimate_apart(cfg, "dp", 0, 3)
    monkeypatch.setattr(pr, "train_estimate", lambda *a: time.sleep(60))
    t0 = time.monotonic()
    with pytest.raises(pr.PlanError, match="no answer in 1 s"):
        pr.train_estimate_apart(cfg, "dp", 0, 3, timeout=1.0)
    assert time.monotonic() - t0 < 30
    monkeypatch.setattr(pr, "train_estimate", lambda *a: 1 / 0)
    with pytest.raises(pr.PlanError, match="ZeroDivisionError"):
        pr.train_estimate_apart(cfg, "dp", 0, 3)
