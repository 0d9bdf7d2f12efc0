"""Run under ``mpiexec -n N``: label augmentation and Correct & Smooth on ``dp``, ``sar``, ``sylvie``
(32 bits) and ``minibatch`` reproduce the ``single`` engine.

Rank 0 writes a random directed dataset (isolated nodes, sparse bag-of-words-like features) and
partitions it into N parts with the *random* method (the relabelled global ids differ from the
dataset's ids, so a mask keyed by the wrong id would show). Every rank then builds, in float64
without dropout, a ``single`` Trainer on a one-process communicator and a Trainer per engine on all
N ranks, with ``recipes.label_aug: 0.5`` and ``recipes.correct_smooth: true``, and checks, on its
owned rows (mapped to the single engine's rows by their dataset ids):

* the label-augmentation input mask of epochs 1..4 equals single's (the same nodes on every rank
  count), and so do the epoch's input features;
* the first epoch's global loss and every (all-reduced) parameter gradient equal single's (1e-9);
* Correct & Smooth given the single engine's probabilities equals single's output (1e-10), and the
  Trainer's own ``correct_and_smooth`` after the step (its model's probabilities) equals single's
  (1e-8), with the same accuracies before and after;
* ``minibatch`` (label augmentation refused there): C&S on its full evaluation graph equals single's.

Rank 0 prints ``recipes_checks: N ranks, K cases OK``.

Usage: recipes_checks.py WORKDIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from hpc_graph.comm import get_communicator

CLASSES = 5
TIGHT = 1e-10


def _dataset(path: Path, n: int = 150, e: int = 700, f: int = 30, seed: int = 0) -> None:
    from data_io.dataset import GraphData, write_dataset
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - 5, e), rng.integers(0, n - 5, e)  # 5 isolated nodes
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)
    perm = rng.permutation(n)
    dst, src = perm[pairs[:, 0]], perm[pairs[:, 1]]
    order = np.lexsort((src, dst))
    dst, src = dst[order], src[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    feat = (rng.standard_normal((n, f)) * (rng.random((n, f)) < 0.1)).astype(np.float32)
    feat[np.arange(n), rng.integers(0, f, n)] = 1.0
    split = rng.random(n)
    write_dataset(path, GraphData(indptr=indptr, indices=src.astype(np.int64), feat=feat,
                                  label=rng.integers(0, CLASSES, n).astype(np.int64),
                                  train_mask=split < 0.5, val_mask=(split >= 0.5) & (split < 0.75),
                                  test_mask=split >= 0.75, name="rand", num_classes=CLASSES, directed=True))


def _config(path: Path, engine: str, run_dir: Path, label_aug: float = 0.5):
    from hpc_graph.train.config import config_from_dict
    extra = {"sampler": {"fanouts": [4, 4]}} if engine == "minibatch" else {}
    eng = {"name": engine, **({"bits": 32} if engine == "sylvie" else {})}
    return config_from_dict({
        **extra,
        "data": {"path": str(path), "feature_layout": "auto"},
        "engine": eng,
        "model": {"name": "gcn", "hidden": 8, "num_layers": 2, "dropout": 0.0},
        "optim": {"name": "adam", "lr": 0.02},
        "train": {"epochs": 3, "seed": 7, "dtype": "float64", "progress": False, "run_dir": str(run_dir)},
        "recipes": {"label_aug": label_aug, "correct_smooth": True, "cs_correct_layers": 8,
                    "cs_smooth_layers": 8},
    })


def _max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max()) if want.numel() else 0.0


def _check(what: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    err = _max_err(got, want)
    if err > tol * max(1.0, float(want.double().abs().max()) if want.numel() else 1.0):
        raise AssertionError(f"{what}: differs by {err:g}")


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x.to_dense() if x.layout == torch.sparse_csr else x


def main() -> int:
    work = Path(sys.argv[1])
    comm = get_communicator("mpi")
    from hpc_graph.comm import install_abort_handler
    install_abort_handler(comm)
    from hpc_graph.comm.threads import configure_threads
    configure_threads(comm=comm, world=True)
    from data_io.partitioner import partition_dataset
    from hpc_graph.train.config import ConfigError
    from hpc_graph.train.recipes import CorrectAndSmooth
    from hpc_graph.train.trainer import Trainer

    data, pdir = work / "rand.h5", work / f"rand-{comm.size}"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(data)
        partition_dataset(data, pdir, comm.size, "random", seed=1)
    comm.barrier()
    local = get_communicator("local")

    ref = Trainer(_config(data, "single", work / f"ref-{comm.rank}"), local)
    want_masks = [ref.label_aug.input_mask(e) for e in range(1, 5)]
    want_x = _dense(ref.train_inputs(1)[0])
    ref_loss = ref.step()
    ref_grads = {name: p.grad.clone() for name, p in ref.model.named_parameters()}
    ref.model.eval()
    with torch.no_grad():
        ref_probs = ref.model(ref.graph, ref.eval_inputs()).softmax(1)
    cs = CorrectAndSmooth.from_config(ref.config.recipes)
    ref_cs_given = cs(ref.graph, ref_probs, ref.label, ref.masks["train"])
    ref_result = ref.correct_and_smooth(use_best=False)
    ref_cs = ref.cs_probs
    assert torch.allclose(ref_cs, ref_cs_given, rtol=0, atol=1e-12)

    cases = 0
    for engine in ("dp", "sar", "sylvie"):
        tr = Trainer(_config(pdir, engine, work / f"run-{engine}"), comm)
        where = f"rank {comm.rank} {engine}"
        rows = tr.graph.dg.orig_id  # the partition's record of each owned node's dataset id
        moved = torch.tensor([float((rows != tr.graph.global_ids()).sum())], dtype=torch.float64)
        comm.allreduce_(moved)
        assert moved.item() > 0, "the partition kept the dataset ids: the keying would not be tested"
        for k, want in enumerate(want_masks):
            got = tr.label_aug.input_mask(k + 1)
            if not torch.equal(got, want[rows]):
                raise AssertionError(f"{where}: label-augmentation mask of epoch {k + 1} differs from single's")
        _check(f"{where}: epoch-1 inputs", _dense(tr.train_inputs(1)[0]), want_x[rows], 0.0)
        loss = tr.step()
        if abs(loss - ref_loss) > 1e-9 * max(1.0, abs(ref_loss)):
            raise AssertionError(f"{where}: first-epoch loss {loss!r} != single's {ref_loss!r}")
        for name, p in tr.model.named_parameters():
            _check(f"{where}: gradient of {name}", p.grad, ref_grads[name], 1e-9)
        with torch.no_grad(), tr.engine.evaluation():
            got = cs(tr.graph, ref_probs[rows], tr.label, tr.masks["train"])
        _check(f"{where}: C&S of the same probabilities", got, ref_cs_given[rows], TIGHT)
        result = tr.correct_and_smooth(use_best=False)
        _check(f"{where}: Trainer C&S", tr.cs_probs, ref_cs[rows], 1e-8)
        for stage in ("before", "after"):
            for split, value in ref_result[stage].items():
                if abs(result[stage][split] - value) > 1e-12:
                    raise AssertionError(f"{where}: {split} {stage} C&S {result[stage][split]} != {value}")
        cases += 1

    # minibatch: label augmentation is refused (by name); C&S runs on the full evaluation graph
    try:
        Trainer(_config(pdir, "minibatch", work / "never"), comm)
        raise AssertionError("label augmentation on minibatch was accepted")
    except ConfigError as exc:
        assert str(exc).startswith("recipes.label_aug:"), exc
    mb = Trainer(_config(pdir, "minibatch", work / "run-mb", label_aug=0.0), comm)
    rows = mb.engine.dg.orig_id
    with torch.no_grad(), mb.engine.evaluation():
        got = cs(mb.graph, ref_probs[rows], mb.label, mb.masks["train"])
    _check(f"rank {comm.rank} minibatch: C&S of the same probabilities", got, ref_cs_given[rows], TIGHT)
    cases += 1

    comm.barrier()
    if comm.rank == 0:
        print(f"recipes_checks: {comm.size} ranks, {cases} cases OK", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
