"""`hpc-graph train`: a short run end to end, and config errors as one line with exit status 2."""
import json

import pytest
import yaml

from data_io.generators.csbm import write_csbm
from hpc_graph.cli import main


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "g.h5"
    write_csbm(path, num_nodes=120, num_classes=3, avg_degree=5.0, feat_dim=8, seed=1)
    return str(path)


def _cfg(tmp_path, graph_file, **sections):
    raw = {"data": {"path": graph_file}, "model": {"name": "sage", "hidden": 8},
           "train": {"epochs": 4, "progress": False, "run_dir": str(tmp_path / "from_cfg")}}
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_train_runs_and_prints_summary(tmp_path, graph_file, capsys):
    run_dir = tmp_path / "run"
    rc = main(["-q", "train", "--config", _cfg(tmp_path, graph_file), "--set", "train.epochs=3",
               "--set", "model.name=gcn", "--run-dir", str(run_dir)])
    out = capsys.readouterr().out
    assert rc == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 3 and summary["config"]["model"]["name"] == "gcn"
    assert summary["config"]["train"]["run_dir"] == str(run_dir)
    assert out.count("\n") == 1 and out.startswith("best val acc ")
    assert f"test acc {summary['test_acc']:.4f}" in out and str(run_dir / "summary.json") in out
    assert not (tmp_path / "from_cfg").exists()


@pytest.mark.parametrize("args,message", [
    (["--set", "model.hidden=-3"], "model.hidden: must be a positive integer, got -3"),
    (["--set", "optim.lr=0"], "optim.lr: must be a positive number, got 0"),
    (["--set", "model.hiden=3"], "model.hiden: unknown key"),
    (["--set", "data.path=/nonexistent/g.h5"], "data.path: no such file or directory: /nonexistent/g.h5"),
    (["--set", "engine.name=single", "--set", "train.device=gpu"], "train.device: must be one of"),
    (["--run-dir", " "], "--run-dir: must be a non-empty path"),
])
def test_config_errors_exit_2_with_one_line(tmp_path, graph_file, capsys, args, message):
    rc = main(["train", "--config", _cfg(tmp_path, graph_file), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("hpc-graph train: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "from_cfg").exists()  # nothing trained, nothing written


def test_missing_config_file(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: no such config file" in capsys.readouterr().err


def test_train_refuses_what_cannot_fit_and_force_bypasses(tmp_path, graph_file, capsys, monkeypatch, caplog):
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "20MB")
    cfg = _cfg(tmp_path, graph_file)
    run_dir = tmp_path / "run"
    rc = main(["train", "--config", cfg, "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("hpc-graph train: error: train (single sage, rank 0: peak ")
    assert "needs about" in err and "19.1 MiB available (HPC_GRAPH_MEMORY_LIMIT)" in err
    assert err.endswith("pass --force to try anyway") and "\n" not in err
    assert not run_dir.exists()
    rc = main(["-q", "train", "--config", cfg, "--run-dir", str(run_dir), "--force"])
    assert rc == 0 and (run_dir / "summary.json").exists()
    assert "going on because of --force" in caplog.text


@pytest.mark.parametrize("engine,advice", [("single", "use more ranks or engine sar"),
                                           ("sylvie", "use more ranks or engine sar"),
                                           ("flow", "this engine holds the whole graph on every rank: use an engine "
                                                    "that partitions it")])
def test_train_refusal_names_the_engine_and_advises(tmp_path, graph_file, capsys, monkeypatch, engine, advice):
    data = graph_file
    if engine == "sylvie":  # a partition of one part
        from data_io.partitioner import partition_dataset

        data = str(tmp_path / "p1")
        partition_dataset(graph_file, data, 1)
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "20MB")
    cfg = _cfg(tmp_path, data, engine={"name": engine})
    rc = main(["train", "--config", cfg, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"hpc-graph train: error: train ({engine} sage, rank 0: peak "), err
    assert advice in err and "\n" not in err and not (tmp_path / "run").exists()


def test_train_memory_check_passes_with_enough_memory(tmp_path, graph_file, monkeypatch, caplog):
    monkeypatch.setenv("HPC_GRAPH_MEMORY_LIMIT", "64GB")
    assert main(["-q", "train", "--config", _cfg(tmp_path, graph_file), "--run-dir", str(tmp_path / "r")]) == 0
    assert "force" not in caplog.text


def test_train_with_lm_cotraining_from_the_cli(tmp_path, capsys):
    from data_io.generators import write_tag

    data = tmp_path / "tag.h5"
    write_tag(data, num_nodes=200, communities=2, topics=2, seed=2)
    run_dir = tmp_path / "lm"
    rc = main(["-q", "train", "--config", _cfg(tmp_path, str(data)), "--run-dir", str(run_dir),
               "--set", "lm.enabled=true", "--set", "lm.model=tiny", "--set", "lm.epochs=1",
               "--set", "lm.sync=every", "--set", "lm.sync_every=2"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (run_dir / "metrics.rank0.jsonl").read_text().splitlines()]
    stats = [r["engine_stats"] for r in rows]
    assert stats[-1]["lm_steps"] > 0 and all("lm_seconds" in s for s in stats)
    assert [r["epoch"] for r, s in zip(rows, stats) if s["lm_encode_seconds"] > 0] == [2, 4]
    # a dataset without text: one line naming the field, exit status 2
    plain = tmp_path / "plain.h5"
    write_csbm(plain, num_nodes=60, num_classes=2, feat_dim=4)
    rc = main(["-q", "train", "--config", _cfg(tmp_path, str(plain)), "--set", "lm.enabled=true"])
    err = capsys.readouterr().err
    assert rc == 2 and "/node/text" in err and err.count("\n") == 1


@pytest.mark.parametrize("warm", [False, True, None])
def test_a_cold_kernel_cache_is_announced(tmp_path, graph_file, capsys, monkeypatch, warm):
    """On a fresh install (numba's kernel cache cold) the first job says that it compiles, and where the
    kernels will be cached; not once they are, nor when the cache cannot be inspected."""
    import numba_kernels

    monkeypatch.setattr(numba_kernels, "cpu_cache_state", lambda *a: (warm, "/nowhere/numba-cache"))
    assert main(["-q", "train", "--config", _cfg(tmp_path, graph_file), "--set", "train.epochs=1"]) == 0
    err = capsys.readouterr().err
    assert ("numba compiles the CPU kernels" in err and "/nowhere/numba-cache" in err) is (warm is False)
