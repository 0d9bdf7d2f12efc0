"""Training with ``train.device: cuda`` on every engine: same results as on the CPU.

* ``dp``, ``sar`` and ``sylvie`` (32 bits) on 2 ranks sharing the GPU reproduce ``single`` on the CPU
  in float64 (forward rows, loss, every gradient, weights after 5 steps, bytes sent), and ``single`` on
  the GPU reproduces ``single`` on the CPU (``tests/mpi/scripts/engine_equivalence.py`` with
  ``HPC_GRAPH_TEST_DEVICE=cuda``);
* Cora (the real dataset shipped in ``tests/data``) and a CSBM graph train with the CLI on the GPU to the
  test accuracy of the same run on the CPU, for every engine (``single``, ``dp``, ``sar``, ``sylvie``,
  ``minibatch``, ``apt``, ``flow``, ``seqpar``); the multi-rank engines run 2 ranks on the one GPU (the
  rank's device comes from its local rank) and exchange halos through host buffers (MPI is not
  CUDA-aware here).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "mpi"))
from _run import SCRIPTS, run_mpi  # noqa: E402

CLI = [sys.executable, "-m", "hpc_graph.cli"]


def _cli(*args, timeout=600):
    proc = subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Cora and a CSBM graph as dataset files, each also in 2 METIS parts."""
    work = tmp_path_factory.mktemp("gpu-data")
    cora = Path(os.environ.get("HPC_GRAPH_DATASETS", REPO / "tests" / "data")) / "cora.npz"
    _cli("convert", "npz", cora, "-o", work / "cora.h5")
    _cli("generate", "csbm", "-o", work / "csbm.h5", "--num-nodes", "6000", "--seed", "3")
    for name in ("cora", "csbm"):
        _cli("partition", work / f"{name}.h5", "-o", work / f"{name}-2", "--num-parts", "2", "--method", "metis")
    return work


@pytest.mark.timeout(900)
def test_engines_on_gpu_match_single_on_cpu(tmp_path):
    import importlib.util

    proc = run_mpi([SCRIPTS / "engine_equivalence.py", tmp_path / "work"], 2, timeout=840,
                   env={"HPC_GRAPH_TEST_DEVICE": "cuda"})
    spec = importlib.util.spec_from_file_location("engine_equivalence", SCRIPTS / "engine_equivalence.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cases = script.expected_cases(2)  # as the script counts them, not a number copied from a run
    assert f"engine_equivalence: 2 ranks, {cases} cases per rank OK" in proc.stdout, proc.stdout


# (engine, config, ranks, data suffix, extra --set overrides)
RUNS = [
    ("single", "single_gcn.yaml", 1, ".h5", ["train.epochs=100"]),
    ("single", "single_gat.yaml", 1, ".h5", ["train.epochs=100"]),
    ("dp", "dp_sage.yaml", 2, "-2", ["train.epochs=100"]),
    ("sar", "sar_gat.yaml", 2, "-2", ["train.epochs=100"]),
    ("sylvie", "sylvie_gcn.yaml", 2, "-2", ["train.epochs=100"]),
    ("minibatch", "minibatch_sage.yaml", 2, "-2", ["train.epochs=8"]),
    ("apt", "apt_sage.yaml", 2, "-2", ["train.epochs=8", "engine.strategy=gdp"]),
    ("flow", "flow_gcn.yaml", 2, ".h5", ["train.epochs=60", "model.num_layers=4", "model.hidden=64",
                                         "train.eval_every=1"]),
    ("seqpar", "single_gt.yaml", 2, ".h5", ["train.epochs=60", "engine.name=seqpar", "model.pe_dim=0"]),
]


def _train(cfg: str, ranks: int, path: Path, device: str, run_dir: Path, sets: list[str]) -> dict:
    overrides = [f"data.path={path}", f"train.device={device}", f"train.run_dir={run_dir}", "train.progress=false",
                 *sets]
    args = ["train", "--config", REPO / "configs" / cfg] + [a for o in overrides for a in ("--set", o)]
    if ranks == 1:
        _cli(*args)
    else:
        run_mpi(["-m", "hpc_graph.cli", *map(str, args)], ranks, timeout=600)
    return json.loads((run_dir / "summary.json").read_text())


CASES = [("cora",) + r for r in RUNS] + [("csbm",) + r for r in RUNS if r[0] in ("single", "dp", "sar")]


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("dataset,engine,cfg,ranks,suffix,sets", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2][:-5]}" for c in CASES])
def test_gpu_training_reaches_the_cpu_accuracy(data, tmp_path, dataset, engine, cfg, ranks, suffix, sets):
    path = data / f"{dataset}{suffix}"
    extra = ["data.feature_norm=none"] if dataset == "csbm" else []
    cpu = _train(cfg, ranks, path, "cpu", tmp_path / "cpu", sets + extra)
    gpu = _train(cfg, ranks, path, "cuda", tmp_path / "cuda", sets + extra)
    assert gpu["engine"] == engine and gpu["world_size"] == ranks
    assert gpu.get("peak_gpu_mb") and all(m > 0 for m in gpu["peak_gpu_mb"]), gpu.get("peak_gpu_mb")
    # float32 on two devices (and dropout masks from two generators): the same accuracy within a few points
    assert abs(gpu["test_acc"] - cpu["test_acc"]) <= 0.03, (engine, dataset, cpu["test_acc"], gpu["test_acc"])
    assert gpu["test_acc"] > 0.5, (engine, dataset, gpu["test_acc"])


def test_info_env_reports_the_gpu_exchange():
    proc = run_mpi(["-m", "hpc_graph.cli", "info", "--env"], 2, timeout=120)
    assert "rank 0 -> cuda:0" in proc.stdout and "rank 1 -> cuda:0" in proc.stdout, proc.stdout
    assert "GPU halo exchange: host staging" in proc.stdout or "GPU halo exchange: direct" in proc.stdout, proc.stdout
