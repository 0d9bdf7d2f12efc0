"""Run under ``mpiexec -n N``: ``dp`` on a graph-level dataset reproduces ``single`` (data parallel over graphs).

Rank 0 writes a PATH-SPD dataset (random trees, one label per graph) with Laplacian encodings, sized so
that an epoch's last step has fewer graphs than ranks on 2 and 4 ranks (some ranks train on no graph
there). Every rank then trains, float64 without dropout, GT (sparse attention, global token, the
encodings, whose random sign flips every rank must draw as ``single`` does), Graphormer (structural bias)
and SAGE (a GNN read out by the mean of its nodes), once on the
``single`` engine with a one-process communicator (the reference, on every rank) and once on ``dp`` over
all N ranks, and checks:

* the ranks' shares of every step are disjoint and together the step ``single`` takes;
* the loss of every epoch and every parameter after the epochs, 1e-10 relative (SGD with momentum: Adam
  divides by the gradient's own size, and the attention's key bias has a gradient that is zero but for
  rounding, so Adam would turn the order of the ranks' sums into steps of lr);
* the accuracies of ``evaluate()`` (each rank evaluates a block of graphs, the counts added up): equal;
* ``fit()`` on ``dp`` with GT: rank 0's summary has N peak-RSS entries and ``single``'s best validation
  accuracy and epoch; the same run preempted after epoch 2 and resumed ends with the same parameters, bitwise.

Rank 0 prints ``graph_dp_checks: N ranks, C cases OK``.

Usage: graph_dp_checks.py WORKDIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hpc_graph.comm import get_communicator

RTOL = 1e-10
EPOCHS = 3
BATCH = 10
MODELS = {
    "gt": {"name": "gt", "hidden": 8, "heads": 2, "num_layers": 2, "attention": "sparse", "pe_dim": 4,
           "global_token": True},
    "graphormer": {"name": "graphormer", "hidden": 8, "heads": 2, "num_layers": 2, "max_spd": 3},
    "sage": {"name": "sage", "hidden": 8, "num_layers": 2},
}


def _dataset(path: Path) -> None:
    from data_io.dataset import open_dataset, write_dataset
    from data_io.generators.graph_tasks import generate_pathspd
    from data_io.preprocess import add_node_field, laplacian_pe

    write_dataset(path, generate_pathspd(37, 6, 11, max_dist=4, seed=2))
    with open_dataset(path) as ds:
        indptr, indices, ptr = ds.indptr(), ds.indices(), ds.graph_ptr()
        train = ds.graph_mask("train_mask")
    assert 0 < int(train.sum()) % BATCH < 4, int(train.sum())  # a last step with fewer graphs than 4 ranks
    pe = laplacian_pe(indptr, indices, int(ptr[-1]), 4, graph_ptr=ptr)  # each graph's own eigenvectors
    add_node_field(path, "lap_pe", pe)


def _config(path: Path, engine: str, model: dict, run_dir: Path, epochs: int = EPOCHS):
    from hpc_graph.train.config import config_from_dict
    return config_from_dict({
        "data": {"path": str(path)},
        "engine": {"name": engine, "graph_batch_size": BATCH},
        "model": {"dropout": 0.0, **model},
        "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "train": {"epochs": epochs, "seed": 5, "eval_every": 1, "dtype": "float64", "progress": False,
                  "run_dir": str(run_dir)},
    })


def _close(what: str, got: float, want: float) -> None:
    if abs(got - want) > RTOL * max(1.0, abs(want)):
        raise AssertionError(f"{what}: {got!r} != {want!r}")


def main() -> int:
    work = Path(sys.argv[1])
    comm = get_communicator("mpi")
    from hpc_graph.comm import install_abort_handler
    install_abort_handler(comm)
    from hpc_graph.train.trainer import Trainer

    data = work / "pathspd.h5"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(data)
    comm.barrier()
    local = get_communicator("local")
    cases = 0
    for name, model in MODELS.items():
        ref = Trainer(_config(data, "single", model, work / f"ref-{name}-{comm.rank}"), local)
        dp = Trainer(_config(data, "dp", model, work / f"dp-{name}"), comm)
        assert dp.engine_name == "dp" and type(dp.engine).__name__ == "GraphDPEngine", type(dp.engine)
        where = f"rank {comm.rank} {name}"
        # the shares of every step of two epochs: disjoint, together single's step
        for epoch in (1, 2):
            iters = ref.engine.iterations(epoch)
            assert dp.engine.iterations(epoch) == iters
            mine, total = dp.engine.batch_sizes(epoch, iters)
            shares = comm.allgather_object([dp.engine.batch(epoch, it).seeds.tolist() for it in range(iters)])
            for it in range(iters):
                want = ref.engine.batch(epoch, it).seeds.tolist()
                got = [g for r in range(comm.size) for g in shares[r][it]]
                assert got == want, f"{where}: epoch {epoch} step {it}: shares {[s[it] for s in shares]}, single {want}"
                assert total[it] == len(want) and mine[it] == len(shares[comm.rank][it])
            if comm.size > 1:
                assert any(not shares[r][-1] for r in range(comm.size)), "the last step should leave a rank idle"
        for epoch in range(1, EPOCHS + 1):
            _close(f"{where}: loss of epoch {epoch}", dp.step(), ref.step())
        got_acc, want_acc = dp.evaluate(), ref.evaluate()
        for split, w in want_acc.items():
            _close(f"{where}: {split}", got_acc[split], w)
        for (key, w), (_, g) in zip(ref.model.state_dict().items(), dp.model.state_dict().items()):
            err = float((g.double() - w.double()).abs().max()) if w.numel() else 0.0
            if err > RTOL * max(1.0, float(w.double().abs().max())):
                raise AssertionError(f"{where}: {key} differs by {err:g} after {EPOCHS} epochs")
        cases += 1

    run_dir, gt_pe = work / "fit-dp", MODELS["gt"]
    want = Trainer(_config(data, "single", gt_pe, work / f"fit-ref-{comm.rank}"), local).fit()
    full = Trainer(_config(data, "dp", gt_pe, run_dir), comm)
    summary = full.fit()
    comm.barrier()
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["world_size"] == comm.size and len(on_disk["peak_rss_mb"]) == comm.size, on_disk
    assert summary["best_val_acc"] == on_disk["best_val_acc"], (summary, on_disk)
    _close("fit: best validation accuracy", summary["best_val_acc"], want["best_val_acc"])
    assert summary["best_epoch"] == want["best_epoch"], (summary["best_epoch"], want["best_epoch"])
    # preempted after epoch 2 (the signal reaching the last rank only) and resumed: the uninterrupted run, bitwise
    from hpc_graph.train.signals import Preempted

    part = work / "fit-dp-part"
    stopped = Trainer(_config(data, "dp", gt_pe, part), comm)
    step = stopped.step

    def step_and_ask(step=step, t=stopped):
        if comm.rank == comm.size - 1 and t.epoch + 1 == 2:
            t.request_stop()
        return step()

    stopped.step = step_and_ask
    try:
        stopped.fit()
        raise AssertionError("no Preempted")
    except Preempted as exc:
        assert exc.epoch == 2, exc
    resumed = Trainer(_config(data, "dp", gt_pe, work / "unused"), comm, resume=part)
    assert resumed.epoch == 2
    resumed.fit()
    for (key, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), f"rank {comm.rank}: resumed {key} differs by {(p - q).abs().max().item():g}"
    cases += 1
    comm.barrier()
    if comm.rank == 0:
        print(f"graph_dp_checks: {comm.size} ranks, {cases} cases OK", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
