"""`hpc-graph plan`: the apt engine's predictions without training; bad configs as one line, exit 2."""
import json
import math

import numpy as np
import pytest
import yaml

from data_io.generators.csbm import write_csbm
from hpc_graph.cli import main


def _cfg(tmp_path, **sections):
    path = tmp_path / "g.h5"
    write_csbm(path, num_nodes=150, num_classes=3, avg_degree=5.0, feat_dim=8, seed=2)
    raw = {"data": {"path": str(path)}, "engine": {"name": "apt", "dry_run_batches": 4, "profile_mb": 0.01},
           "sampler": {"fanouts": [3, 2], "batch_size": 16}, "model": {"name": "sage", "hidden": 8},
           "train": {"epochs": 2, "progress": False, "run_dir": str(tmp_path / "run")}}
    for k, v in sections.items():
        raw[k] = v
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_plan_prints_the_table_and_writes_json(tmp_path, capsys):
    out_json = tmp_path / "plan.json"
    rc = main(["-q", "plan", "--config", _cfg(tmp_path), "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    plan = json.loads(out_json.read_text())
    assert set(plan["strategies"]) == {"gdp", "nfp", "snp", "dnp"}
    fitting = {s: v["epoch_seconds"] for s, v in plan["strategies"].items() if v["fits"]}
    assert plan["choice"] == min(fitting, key=fitting.get)
    assert out.count("<- chosen") == 1 and f"choice: {plan['choice']}" in out
    assert not (tmp_path / "run").exists()  # nothing trained


def test_plan_refuses_engines_it_does_not_cover(tmp_path, capsys):
    rc = main(["-q", "plan", "--config", _cfg(tmp_path, engine={"name": "minibatch"})])
    err = capsys.readouterr().err
    assert rc == 2 and "engine.name" in err and "'minibatch'" in err and err.count("\n") == 1


# -- full-batch engines (single, dp, sar, sylvie) -----------------------------------------------------
@pytest.fixture(scope="module")
def fb_data(tmp_path_factory):
    from data_io.generators.rmat import write_rmat
    from data_io.partitioner import partition_dataset

    d = tmp_path_factory.mktemp("fb")
    write_rmat(d / "g.h5", 10, 8, feat_dim=16, num_classes=4, seed=0)
    partition_dataset(str(d / "g.h5"), str(d / "p2"), 2)
    return d


def _fb_cfg(tmp_path, data, **model):
    raw = {"data": {"path": str(data)}, "engine": {"name": "auto"},
           "model": {"name": "sage", "hidden": 16, "num_layers": 2, **model},
           "train": {"progress": False, "run_dir": str(tmp_path / "run")}}
    p = tmp_path / "fb.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def _rows(out):
    """``(engine, ranks) -> row`` of the printed table."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 10 and parts[0] in ("single", "dp", "sar", "sylvie", "flow") and parts[1].isdigit():
            rows[parts[0], int(parts[1])] = parts
    return rows


@pytest.fixture
def quick_rates(monkeypatch):
    """Kernel rates cheap enough for a test: one timed round of the probes, one call a round of those that write
    fresh tensors (of 1 MiB, not 64), and a scale-10 graph for ``--rates synthetic`` (the tests check how the plan
    uses its rates, not how precise they are). Returns the graphs the rates were measured on (None: synthetic)."""
    from hpc_graph.plan import profile

    real_rates, real_graph = profile.kernel_rates, profile.synthetic_graph
    seen = []

    def kernel_rates(csr=None, *args, **kwargs):
        seen.append(csr)
        kwargs.setdefault("reps", 1)
        return real_rates(csr, *args, **kwargs)

    monkeypatch.setattr(profile, "FRESH_CALLS", 1)
    monkeypatch.setattr(profile, "STREAM_ELEMENTS", 1 << 18)
    monkeypatch.setattr(profile, "kernel_rates", kernel_rates)
    real_paired = profile.paired_kernel_rates

    def paired_kernel_rates(graphs, *args, **kwargs):  # the calibration's (its graphs: the rank's first)
        seen.append(graphs[0][0])
        kwargs.setdefault("reps", 1)
        return real_paired(graphs, *args, **kwargs)

    monkeypatch.setattr(profile, "paired_kernel_rates", paired_kernel_rates)
    monkeypatch.setattr(profile, "synthetic_graph", lambda scale=16, edge_factor=16: real_graph(10, 8))
    return seen


def test_plan_dataset_all_engines_table_and_json(tmp_path, fb_data, capsys):
    out_json = tmp_path / "p.json"
    rc = main(["-q", "plan", "--config", _fb_cfg(tmp_path, fb_data / "g.h5"), "--engines", "all", "--ranks", "1,2,4",
               "--memory-per-rank", "480MiB", "--floor", "470MiB", "--rates", "none", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    rows = _rows(out)
    assert set(rows) == {("single", 1), ("dp", 1), ("dp", 2), ("dp", 4), ("sar", 1), ("sar", 2), ("sar", 4),
                         ("sylvie", 1), ("sylvie", 2), ("sylvie", 4), ("flow", 1), ("flow", 2)}  # flow: <= 2 layers
    plan = json.loads(out_json.read_text())
    peaks = {(p["engine"], p["ranks"]): p["memory"]["peak"] for p in plan["predictions"]}
    data = {k: v - next(p["memory"]["components"]["floor"] for p in plan["predictions"]
                        if (p["engine"], p["ranks"]) == k) for k, v in peaks.items()}
    assert data["dp", 4] < data["dp", 1] and data["sar", 4] < data["sar", 2] < data["sar", 1], data
    for p in plan["predictions"]:
        comp = p["memory"]["components"]
        assert comp["floor"] >= 470 << 20 and sum(comp.values()) == p["memory"]["peak"]
        assert p["fits"] == (p["memory"]["peak"] <= 480 << 20) and "time" not in p
    fits = plan["smallest_fitting"]
    for engine in ("dp", "sar", "sylvie"):
        ok = sorted(P for (e, P), v in peaks.items() if e == engine and v <= 480 << 20)
        assert fits[engine] == (ok[0] if ok else None)
        assert f"smallest rank count that fits 480MiB per rank, {engine}: " in out
    assert "assumptions:" in out and "cut model: no --cut-fraction: a random partition's cut 1 - 1/P" in out
    assert "process floor: 470 MiB (--floor)" in out and not (tmp_path / "run").exists()
    assert "flow: not planned on more ranks than the model's 2 layers" in out


def test_plan_partition_dir_uses_its_statistics(tmp_path, fb_data, capsys):
    out_json = tmp_path / "p.json"
    rc = main(["-q", "plan", "--config", _fb_cfg(tmp_path, fb_data / "p2"), "--floor", "400MiB", "--rates", "none",
               "--json", str(out_json)])
    assert rc == 0
    out = capsys.readouterr().out
    assert set(_rows(out)) == {("dp", 2), ("sar", 2)}  # engine auto: all three; no 1 in the ranks: no single
    assert "single: not planned (one process; --ranks has no 1)" in out  # and the table says why
    plan = json.loads(out_json.read_text())
    assert {p["layout"].split(" (")[0] for p in plan["predictions"]} == {f"partition {fb_data / 'p2'}"}
    meta = json.loads((fb_data / "p2" / "partition.json").read_text())
    assert f"the partition's measured cut {meta['edge_cut_fraction']:.3f} at 2 parts" in out


def test_plan_times_with_rates_measured_on_the_graph(tmp_path, fb_data, capsys, quick_rates):
    out_json = tmp_path / "p.json"
    rc = main(["-q", "plan", "--config", _fb_cfg(tmp_path, fb_data / "g.h5", name="gcn"), "--engines", "dp,sar",
               "--ranks", "2,4", "--cut-fraction", "0.4", "--floor", "400MiB", "--calibration", "1.25s",
               "--cores-per-node", "4", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    plan = json.loads(out_json.read_text())
    assert plan["rates"]["step_overhead"] == 1.25 and "overhead beyond the kernels (calibration) +1.250 s " \
        "(--calibration)" in out
    # a given calibration measures no oversubscription: said only where a rank count would oversubscribe
    assert "ranks oversubscribing" not in out and plan["rates"]["contention"] == {}
    assert main(["-q", "plan", "--config", _fb_cfg(tmp_path, fb_data / "g.h5", name="gcn"), "--engines", "dp",
                 "--ranks", "4", "--cut-fraction", "0.4", "--floor", "400MiB", "--calibration", "1.25s",
                 "--cores-per-node", "2", "--rates", "synthetic"]) == 0
    assert "ranks oversubscribing a node's cores: not measured (--calibration given)" in capsys.readouterr().out
    assert [csr is None for csr in quick_rates] == [False, True]  # the graph's rates, then synthetic ones
    for p in plan["predictions"]:
        t = p["time"]
        assert t["compute"] > 0 and t["halo"] > 0 and t["epoch_seconds"] == pytest.approx(
            t["compute"] + t["halo"] + t["allreduce"])
        assert t["terms"]["overhead"] == pytest.approx(1.25) and t["compute"] == pytest.approx(sum(t["terms"].values()))
        assert p["bottleneck"] in ("compute", "halo exchange", "all-reduce")
        assert p["cut_fraction"] == pytest.approx(0.4)
    assert f"kernel rates: measured now on {fb_data / 'g.h5'}" in out
    assert "links: default link 10GB/s, 5us per message (not measured" in out


def test_plan_sylvie_sends_fewer_bytes_and_hides_them_with_its_pipeline(tmp_path, fb_data, capsys, quick_rates):
    p = tmp_path / "sy.yaml"
    p.write_text(yaml.safe_dump({"data": {"path": str(fb_data / "p2")},
                                 "engine": {"name": "sylvie", "bits": 2, "pipeline": "on"},
                                 "model": {"name": "gcn", "hidden": 16, "num_layers": 2},
                                 "train": {"progress": False, "run_dir": str(tmp_path / "run")}}))
    out_json = tmp_path / "p.json"
    rc = main(["-q", "plan", "--config", str(p), "--engines", "dp,sylvie", "--floor", "400MiB", "--rates", "synthetic",
               "--link-bandwidth", "1MB/s", "--calibration", "none", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0 and set(_rows(out)) == {("dp", 2), ("sylvie", 2)}
    assert "sylvie: halo rows and gradients at 2 bits, float32 scales; pipeline on" in out
    preds = {q["engine"]: q for q in json.loads(out_json.read_text())["predictions"]}
    dp, sy = preds["dp"]["time"], preds["sylvie"]["time"]
    assert sy["bytes_sent"] < dp["bytes_sent"] / 2
    assert sy["hidden"] > 0 and sy["halo"] == pytest.approx(max(0.0, sy["halo"] + sy["hidden"] - sy["compute"]))
    assert sy["terms"]["codec"] > 0
    assert preds["sylvie"]["memory"]["components"]["halo"] > 0 and not (tmp_path / "run").exists()


def test_plan_flow_holds_the_whole_graph_on_every_stage(tmp_path, fb_data, capsys):
    p = tmp_path / "fl.yaml"
    p.write_text(yaml.safe_dump({"data": {"path": str(fb_data / "g.h5")},
                                 "engine": {"name": "flow", "stage_split": "count"},
                                 "model": {"name": "gcn", "hidden": 16, "num_layers": 4},
                                 "train": {"progress": False, "run_dir": str(tmp_path / "run")}}))
    out_json = tmp_path / "p.json"
    rc = main(["-q", "plan", "--config", str(p), "--ranks", "1,2,4", "--floor", "400MiB", "--rates", "none",
               "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0 and set(_rows(out)) == {("flow", 1), ("flow", 2), ("flow", 4)}
    preds = {q["ranks"]: q for q in json.loads(out_json.read_text())["predictions"]}
    # every stage holds the whole graph and features; parameters and saved activations shrink with the stages
    assert len({q["memory"]["graph"] for q in preds.values()}) == 1
    assert preds[4]["stages"] == [[0, 1], [1, 2], [2, 3], [3, 4]] and preds[1]["stages"] == [[0, 4]]
    assert preds[4]["memory"]["params"] < preds[2]["memory"]["params"] < preds[1]["memory"]["params"]
    assert "flow: 4 stage(s), layers 1-1, 2-2, 3-3, 4-4 (by count)" in out
    assert "flow: the whole graph on every rank, one stage of layers each" in out


def test_plan_papers100m_description(tmp_path, fb_data, capsys):
    cfg = _fb_cfg(tmp_path, fb_data / "g.h5", hidden=256, num_layers=3)
    rc = main(["-q", "plan", "--config", cfg, "--engines", "single,dp,sar", "--nodes", "111059956",
               "--edges", "1615685872", "--features", "128", "--classes", "172", "--cut-fraction", "0.3",
               "--train-fraction", "0.01", "--memory-per-rank", "24GB", "--ranks", "1-100", "--rates", "none",
               "--floor", "480MiB"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = _rows(out)
    # a range shows its powers of two and its end (and searches every count in it: planning SAR at all of them
    # costs the square of the largest, so 1-100, not 1-256)
    assert {P for e, P in rows if e == "dp"} == {1, 2, 4, 8, 16, 32, 64, 100} and ("sar", 64) in rows
    assert ("single", 1) in rows and ("dp", 3) not in rows
    assert rows["single", 1][-1] == "no" and rows["single", 1][-2] == "memory"
    assert "smallest rank count that fits 24GB per rank, single: none up to 1" in out
    found = {}
    for engine in ("dp", "sar"):
        line = next(ln for ln in out.splitlines()
                    if ln.startswith(f"smallest rank count that fits 24GB per rank, {engine}"))
        found[engine] = int(line.rsplit(" ", 1)[1])
    assert 1 < found["sar"] <= found["dp"] <= 100
    for text in ("graph: described: 111,059,956 nodes, 1,615,685,872 stored edges", "1,110,600 training nodes",
                 "cut model: --cut-fraction 0.3 at every rank count", "model: sage, 3 layer(s), hidden 256",
                 "process floor: 480 MiB (--floor)", "rates: none"):
        assert text in out, text


def test_plan_measures_the_floor_by_default(tmp_path, fb_data, capsys):
    rc = main(["-q", "plan", "--config", _fb_cfg(tmp_path, fb_data / "g.h5"), "--rates", "none"])
    out = capsys.readouterr().out
    assert rc == 0 and "(measured: peak RSS of a 2-epoch sage run on a 1024-node graph)" in out
    floor = int(out.split("process floor: ")[1].split(" MiB")[0])
    assert 100 < floor < 4000


@pytest.mark.parametrize("args,message", [
    (["--ranks", "0"], "--ranks: expected positive rank counts"),
    (["--ranks", "4-2"], "--ranks: expected positive rank counts"),
    (["--ranks", "two"], "--ranks: expected positive rank counts"),
    (["--engines", "dp,gpu"], "--engines: choose among single, dp, sar, sylvie, flow"),
    (["--engines", "flow", "--ranks", "4,8"], "--ranks: flow runs one stage of layers per rank"),
    (["--engines", "flow", "--set", "engine.name=flow", "--set", "engine.microbatches=4", "--set",
      "engine.cross_edges=stale"],
     "engine.cross_edges: the planner runs flow's exact mode (or one micro-batch), not 'stale' with 4"),
    (["--engines", "sylvie", "--set", "engine.bits=3"], "engine.bits"),
    (["--engines", "single", "--ranks", "2,4"], "--engines: 'single' runs on one rank"),
    (["--memory-per-rank", "lots"], "--memory-per-rank: 'lots': not a size"),
    (["--memory-per-rank", "0"], "--memory-per-rank: must be positive"),
    (["--cut-fraction", "1.5"], "--cut-fraction: C must lie in [0, 1]"),
    (["--cut-fraction", "0.3@x"], "--cut-fraction: expected C or C@P"),
    (["--edge-imbalance", "0.5"], "--edge-imbalance: must be at least 1.0"),
    (["--nodes", "100"], "--edges: required to describe the graph"),
    (["--nodes", "100", "--edges", "10", "--features", "4", "--classes", "0"], "--classes: must be a positive"),
    (["--nodes", "100", "--edges", "10", "--features", "4", "--classes", "2", "--train-fraction", "2"],
     "--train-fraction: must lie in [0, 1]"),
    (["--data", "/nonexistent/g.h5"], "--data: no such file or directory: /nonexistent/g.h5"),
    (["--engines", "seqpar"], "--engines: choose among single, dp, sar, sylvie, flow or 'all', got 'seqpar'"),
    (["--floor", "big"], "--floor: 'big': not a size"),
    (["--cores-per-node", "0"], "--cores-per-node: must be a positive integer"),
    (["--link-bandwidth", "fast"], "--link-bandwidth: cannot read 'fast'"),
    (["--calibration", "-1"], "--calibration: expected 'measure', 'none' or the seconds an epoch takes"),
    (["--calibration", "fast"], "--calibration: expected 'measure', 'none' or the seconds an epoch takes"),
])
def test_plan_bad_inputs_one_line_exit_2(tmp_path, fb_data, capsys, args, message):
    base = ["plan", "--config", _fb_cfg(tmp_path, fb_data / "g.h5"), "--floor", "400MiB"]
    if "--rates" not in args and "--link-bandwidth" not in args:
        base += ["--rates", "none"]
    rc = main(base + args)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("hpc-graph plan: error: ") and message in err and err.count("\n") == 1, err


def test_plan_refuses_a_graph_level_dataset(tmp_path, fb_data, capsys):
    from data_io.dataset import write_dataset
    from data_io.generators.graph_tasks import generate_reg3cc

    write_dataset(tmp_path / "graphs.h5", generate_reg3cc(6, 8, 8, seed=1))
    rc = main(["plan", "--config", _fb_cfg(tmp_path, fb_data / "g.h5"), "--rates", "none", "--floor", "400MiB",
               "--data", str(tmp_path / "graphs.h5")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--data: {tmp_path / 'graphs.h5'} is a graph-level dataset" in err and err.count("\n") == 1, err


@pytest.mark.timeout(600)  # the two tests it was, 300 s each
def test_plan_calibrates_by_a_real_run_and_measures_oversubscription_by_copies_of_it(tmp_path, fb_data, monkeypatch,
                                                                                     quick_rates):
    """measure_calibration: a real single run of the config's model (at each thread count) minus what the kernel
    rates of the calibration graph predict for it; those rates measured alongside the rank graph's (returned: the
    plan's rates), with the rank graph's parallel fraction. measure_contention: the median epoch of N copies of the
    calibration run started at once, over the mean of one run alone before them and one after (real runs: every copy
    trains and writes its own metrics; the factor checked against the runs' own epochs).

    The two measurements run at once, each in a thread of its own: their training subprocesses (a few seconds of
    imports each, one core) then share the two cores instead of taking turns. Neither check depends on the
    machine's speed: each result is compared with the epochs of its own runs."""
    import re
    import statistics

    import torch

    from hpc_graph.commands import plan as plan_cmd
    from hpc_graph.plan import predict as fb
    from hpc_graph.plan import shapes
    from hpc_graph.plan.rates import Rates
    from hpc_graph.train.config import load_config

    config = load_config(_fb_cfg(tmp_path, fb_data / "g.h5", name="gcn"))
    spec = fb.step_spec(config.model, 16, 4)
    seen = []
    real = plan_cmd._calibration_epochs

    lengths = {}

    def spy(raw, d, name, threads, epochs, copies=1):
        got = real(raw, d, name, threads, epochs, copies)
        seen.append((name, threads, copies, got))
        lengths[name] = epochs
        return got

    monkeypatch.setattr(plan_cmd, "_calibration_epochs", spy)
    monkeypatch.setattr(plan_cmd, "CALIBRATION_EPOCHS", 3)
    monkeypatch.setattr(plan_cmd, "CALIBRATION_SECONDS", 0.0)
    monkeypatch.setattr(plan_cmd, "CONTENTION_EPOCHS", 2)
    monkeypatch.setattr(plan_cmd, "CONTENTION_SECONDS", 0.0)
    from hpc_graph.plan import profile

    paired = []
    real_paired = profile.paired_kernel_rates

    def spy_paired(graphs, *args, **kwargs):
        got = real_paired(graphs, *args, **{**kwargs, "reps": 1})
        paired.append((graphs, got))
        return got

    monkeypatch.setattr(profile, "paired_kernel_rates", spy_paired)
    rank_csr = shapes.rank_csr(str(fb_data / "g.h5"),
                               shapes.single_layout(shapes.graph_from_dataset(str(fb_data / "g.h5"))), 10_000)[0]
    # one after the other, as `plan` runs them: run at once from two threads, one thread's calibration graph could
    # still be open for writing in a child the other thread was forking, whose HDF5 lock then refused the read
    found, kr = plan_cmd.measure_calibration(config, spec, nodes=1000, threads=[1, 2], dtype=torch.float32,
                                             rank_graph=(rank_csr, "the rank's graph"), max_scale=10)
    crowded = plan_cmd.measure_contention(config, spec, nodes=1000, crowds=[(2, 1), (2, 1)], cores=1, max_scale=10)

    # the plan's rates: the rank graph's, measured alongside the calibration graph's, whose parallel fraction
    # the calibration graph's take (its prediction extrapolates to the ranks' threads as the plan's does)
    assert len(paired) == 1
    graphs, (kr_rank, kr_cal) = paired[0]
    assert graphs[0][0] is rank_csr and kr is kr_rank and kr.graph == "the rank's graph"
    assert kr_cal.graph == "calibration graph" and kr_cal.parallel == kr.parallel
    assert kr.threads == kr_cal.threads == 1  # measured at the fewest threads asked for, not extrapolated there
    # calibration: one run per thread count, its epoch minus the prediction from the calibration graph's rates
    assert sorted(found) == [1, 2]
    cal_graph = None
    assert sorted((n, t, c) for n, t, c, _ in seen if n.startswith("run")) == [("run1", 1, 1), ("run2", 2, 1)]
    for t, (extra, how) in found.items():
        m = re.search(rf"R-MAT scale-10 graph at {t} thread\(s\): epoch ([0-9.e-]+) s, ([0-9.e-]+) s predicted", how)
        assert m, how
        measured, predicted = float(m.group(1)), float(m.group(2))
        assert math.isfinite(extra) and measured > 0 and predicted > 0
        # the printed values are rounded to 4 significant digits
        assert extra == pytest.approx(measured - predicted, abs=1e-3 * max(measured, predicted))
        ran = next(got for n, _, _, got in seen if n == f"run{t}")
        assert measured == pytest.approx(ran[0], rel=1e-3)  # the epoch printed is the run's own
        # the prediction: the single engine on the calibration graph, from the calibration graph's rates, at t
        if cal_graph is None:  # the same graph again (R-MAT, seeded)
            (tmp_path / "cal").mkdir()
            cal_graph = shapes.graph_from_dataset(plan_cmd._calibration_graph(config, spec, 1000,
                                                                              str(tmp_path / "cal"), 10)[1])
        pred = fb.predict("single", spec, cal_graph, shapes.single_layout(cal_graph), floor=0,
                          rates=Rates.from_kernels(kr_cal), threads=t, cores_per_node=t, ranks_per_node=1)
        assert predicted == pytest.approx(float(pred.rank_seconds[0]), rel=1e-3)
        # as long as calibration_epochs says for that prediction (here: the fewest epochs), and the line says so
        assert lengths[f"run{t}"] == plan_cmd.calibration_epochs(float(pred.rank_seconds[0])) == 3
        assert how.startswith("3-epoch single run"), how

    # oversubscription: alone, the copies, alone again; the factor from those runs' epochs
    assert list(crowded) == [2.0]
    runs = [x for x in seen if not x[0].startswith("run")]
    assert [(n, t, c) for n, t, c, _ in runs] == [("alone1", 1, 1), ("crowd2x1", 1, 2), ("again1", 1, 1)]
    before, crowd, after = runs[0][3], runs[1][3], runs[2][3]
    assert len(before) == len(after) == 1 and len(crowd) == 2 and all(x > 0 for x in before + crowd + after)
    factor, how = crowded[2.0]
    assert factor == pytest.approx(statistics.median(crowd) / (0.5 * (before[0] + after[0])), rel=1e-12)
    assert "2 copies of a 2-epoch single run of this model on an R-MAT scale-10 graph at 1 thread(s) each on 1 " \
        "cores" in how


def test_calibration_runs_at_least_its_epochs_and_its_seconds_and_at_most_four_times_its_epochs(monkeypatch):
    """calibration_epochs: CALIBRATION_EPOCHS for long epochs; for short ones enough that epochs 2.. span
    CALIBRATION_SECONDS of predicted epochs; never more than 4x CALIBRATION_EPOCHS."""
    from hpc_graph.commands import plan as plan_cmd

    rng = np.random.default_rng(7)
    monkeypatch.setattr(plan_cmd, "CALIBRATION_EPOCHS", 5)
    monkeypatch.setattr(plan_cmd, "CALIBRATION_SECONDS", 6.0)
    for predicted in np.concatenate([rng.uniform(1e-4, 10.0, 200), [0.0, 6.0 / 4, 6.0 / 19, 6.0 / 20, 50.0]]):
        n = plan_cmd.calibration_epochs(float(predicted))
        assert 5 <= n <= 20 and isinstance(n, int)
        timed = (n - 1) * predicted  # epochs 2..n
        # long enough, unless at the cap; no longer than needed, unless at the floor
        assert timed >= 6.0 - 1e-9 or n == 20, (predicted, n)
        assert (n - 2) * predicted < 6.0 or n == 5, (predicted, n)


def test_a_failing_calibration_run_names_itself_and_leaves_no_copy_running(tmp_path):
    """_train_subprocess: a copy that fails raises the given message with the end of its stderr; the others are
    stopped. (The copies fail on their config, before they import torch: a second each, not several.)"""
    from hpc_graph.cli import CLIError
    from hpc_graph.commands import plan as plan_cmd

    raw = {"data": {"path": str(tmp_path / "g.h5")}, "model": {"name": "no_such_model"},
           "train": {"epochs": 1, "run_dir": str(tmp_path / "run")}}
    with pytest.raises(CLIError, match=r"^--calibration: failed \(.*model\.name: .*'no_such_model'"):
        plan_cmd._train_subprocess(raw, str(tmp_path / "c.yaml"), 1, 120, "--calibration: failed ({stderr})", copies=2)
    assert (tmp_path / "c.yaml.0").exists() and (tmp_path / "c.yaml.1.err").exists()


def test_plan_measures_contention_only_where_ranks_oversubscribe_this_host(fb_data, monkeypatch):
    """_contention: copies are run for the ranks per node (and threads) that oversubscribe the cores, only when
    the node planned for is this host; otherwise the plain model, with the reason."""
    import argparse

    from hpc_graph.commands import plan as plan_cmd
    from hpc_graph.plan import shapes

    calls = []

    def fake(config, spec, nodes, crowds, cores):
        calls.append((crowds, cores))
        return {round(c * t / cores, 6): (1.5, f"{c}x{t}") for c, t in crowds}

    monkeypatch.setattr(plan_cmd, "measure_contention", fake)
    monkeypatch.setattr("hpc_graph.comm.threads.affinity_cpus", lambda: list(range(4)))
    layout = shapes.single_layout(shapes.graph_from_dataset(str(fb_data / "g.h5")))
    free = argparse.Namespace(ranks_per_node=None)
    assert plan_cmd._contention(free, None, None, layout, [1, 2, 4, 8], 4, None) == ({2.0: 1.5}, "8x1")
    assert calls == [([(8, 1)], 4)]
    assert plan_cmd._contention(free, None, None, layout, [1, 2, 4], 4, None) == ({}, "")
    assert plan_cmd._contention(argparse.Namespace(ranks_per_node=2), None, None, layout, [8], 4, None) == ({}, "")
    assert plan_cmd._contention(free, None, None, layout, [2, 4], 4, 2) == ({2.0: 1.5}, "4x2")  # train.threads 2
    got, why = plan_cmd._contention(free, None, None, layout, [4], 2, None)
    assert got == {} and "not measured (--cores-per-node 2 is not this host's 4)" in why
    got, why = plan_cmd._contention(free, None, None, layout, [4, 256], 4, None)
    assert got == {} and f"more than {plan_cmd.CONTENTION_MAX_COPIES} ranks per node" in why
    assert len(calls) == 2


def test_plan_bad_profile_and_json_paths(tmp_path, fb_data, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    base = ["plan", "--config", _fb_cfg(tmp_path, fb_data / "g.h5"), "--floor", "400MiB", "--engines", "dp",
            "--ranks", "2"]
    assert main(base + ["--rates", "synthetic", "--profile", str(bad)]) == 2
    assert f"--profile: {bad} is not a readable machine profile" in capsys.readouterr().err
    assert main(base + ["--rates", "none", "--json", str(tmp_path / "no" / "dir" / "p.json")]) == 2
    assert "--json: cannot write" in capsys.readouterr().err


def test_plan_needs_no_data_path_when_the_graph_is_given_otherwise(tmp_path, fb_data, capsys):
    cfg = tmp_path / "nodata.yaml"
    cfg.write_text("model: {name: gcn, hidden: 16, num_layers: 2}\n")
    described = ["--nodes", "5000", "--edges", "80000", "--features", "16", "--classes", "4"]
    assert main(["-q", "plan", "--config", str(cfg), *described, "--engines", "dp", "--ranks", "2",
                 "--rates", "none", "--floor", "400MiB"]) == 0
    assert "graph: described: 5,000 nodes" in capsys.readouterr().out
    assert main(["-q", "plan", "--config", str(cfg), "--data", str(fb_data / "g.h5"), "--engines", "single",
                 "--rates", "none", "--floor", "400MiB"]) == 0
    assert f"graph: {fb_data / 'g.h5'}" in capsys.readouterr().out
    assert main(["-q", "plan", "--config", str(cfg), "--rates", "none", "--floor", "400MiB"]) == 2
    err = capsys.readouterr().err
    assert "--data: no graph given" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("seed", range(20))
def test_smallest_fit_equals_a_scan_of_every_count(seed):
    from hpc_graph.commands.plan import _smallest_fit, parse_ranks

    rng = np.random.default_rng(seed)
    hi = int(rng.integers(1, 300))
    lo = int(rng.integers(1, hi + 1))
    shown, searched = parse_ranks(f"{lo}-{hi}", [])
    threshold = int(rng.integers(lo, hi + 2))  # fits from here on (hi + 1: never)
    asked = []

    def fits_at(P):
        asked.append(P)
        return P >= threshold

    got = _smallest_fit(searched, {P: P >= threshold for P in shown}, fits_at)
    assert got == next((P for P in searched if P >= threshold), None)
    assert len(asked) <= 2 + int(np.log2(max(hi - lo, 1))) and not set(asked) & set(shown)
