"""Run under ``mpiexec -n N``: a model of one's own (tests/plugins/user_model.py) trains on ``dp`` and ``sar`` as on
``single``, given to the Trainer as a factory and as a module.

Rank 0 writes a random dataset and METIS-partitions it into N parts. Every rank trains ``MeanSAGE`` (float64, feature
dropout 0.4 keyed on the nodes' dataset ids through ``hpc_graph.nn.dropout``) once with ``single`` on a one-process
communicator and once per engine on all N ranks, and checks the loss of every step and every parameter after the
steps against ``single`` (RTOL). As a module the model is built on each rank with a different seed: the Trainer
broadcasts rank 0's parameters, so the trajectory is still ``single``'s from rank 0's module. Rank 0 prints
``user_model_checks: N ranks, K cases OK``.

Usage: user_model_checks.py WORKDIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

import hpc_graph as hg

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_equivalence import _dataset  # noqa: E402
from user_model import MeanSAGE  # noqa: E402

RTOL = 1e-10
STEPS = 5


def _config(path: Path, engine: str, run_dir: Path):
    from hpc_graph.train.config import config_from_dict
    return config_from_dict({
        "data": {"path": str(path)}, "engine": {"name": engine},
        "model": {"name": "gcn", "hidden": 8, "dropout": 0.4},
        "optim": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
        "train": {"epochs": STEPS, "seed": 3, "dtype": "float64", "progress": False, "run_dir": str(run_dir)}})


def _trajectory(trainer):
    losses = [trainer.step() for _ in range(STEPS)]
    return losses, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def main() -> int:
    work = Path(sys.argv[1])
    comm = hg.init()
    data, pdir = work / "rand.h5", work / f"rand-{comm.size}"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(data)
        hg.partition_dataset(data, pdir, comm.size, "metis", seed=0)
    comm.barrier()
    local = hg.init("local")
    want_loss, want_state = _trajectory(hg.Trainer(_config(data, "single", work / f"ref-{comm.rank}"), local,
                                                   model=MeanSAGE))
    cases = 0
    for engine in ("dp", "sar"):
        for as_module in (False, True):
            cfg = _config(pdir, engine, work / f"run-{engine}-{as_module}")
            if as_module:
                torch.manual_seed(100 + comm.rank)  # different weights on every rank: rank 0's are broadcast
                model = MeanSAGE(40, 3, cfg.model).double()
                torch.manual_seed(3)
                ref = MeanSAGE(40, 3, cfg.model).double()  # what the factory draws on single: rank 0 needs it
                if comm.rank == 0:
                    model.load_state_dict(ref.state_dict())
            else:
                model = MeanSAGE
            got_loss, got_state = _trajectory(hg.Trainer(cfg, comm, model=model))
            where = f"rank {comm.rank} {engine} ({'module' if as_module else 'factory'})"
            for k, (g, w) in enumerate(zip(got_loss, want_loss)):
                if abs(g - w) > RTOL * max(1.0, abs(w)):
                    raise AssertionError(f"{where}: loss of step {k + 1}: {g!r} != {w!r}")
            for key, w in want_state.items():
                err = float((got_state[key] - w).abs().max())
                if err > RTOL * max(1.0, float(w.abs().max())):
                    raise AssertionError(f"{where}: {key} differs by {err:g} after {STEPS} steps")
            cases += 1
    # predictions written by every rank into one file equal one process's
    import h5py
    import numpy as np
    one = hg.Trainer(_config(data, "single", work / f"p-ref-{comm.rank}"), local, model=MeanSAGE)
    one.fit()
    want_ids, want_out = one.predict()
    assert torch.equal(want_ids, torch.arange(want_out.shape[0])), want_ids
    dist = hg.Trainer(_config(pdir, "sar", work / "p-sar"), comm, model=MeanSAGE)
    dist.fit()
    path = dist.write_predictions(work / "pred.h5")
    comm.barrier()
    with h5py.File(path, "r") as f:
        got = f["node/output"][:]
    assert got.shape == tuple(want_out.shape) and not np.isnan(got).any()
    err = float(np.abs(got - want_out.float().numpy()).max())
    assert err <= 1e-5 * max(1.0, float(want_out.abs().max())), err  # float32 storage of float64 outputs
    assert not list(work.glob(".pred.h5.tmp"))
    comm.barrier()
    if comm.rank == 0:
        print(f"user_model_checks: {comm.size} ranks, {cases} cases OK", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
