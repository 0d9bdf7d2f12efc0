"""Run under ``mpiexec -n P``: LM co-training across ranks.

Rank 0 writes a small text-attributed graph; then every rank checks:

* the LM's data parallelism is exact: ``LMTrainer`` on P ranks (batch ``b`` per rank, its own duplicated
  communicator, non-blocking all-reduce) makes the same parameters as one process with batch ``P b``
  (float64, no dropout);
* the bubble interleaver changes nothing but times (synchronous LM steps and ``lm.staleness`` 2): ``flow`` with
  ``lm.interleave`` (chunks forced into every
  wait) gives the same losses, accuracies, LM parameters and GNN input as without it, while chunks did run
  inside the waits, no message waited more than one chunk, and every rank holds the same LM;
* a dataset without ``/node/text`` is refused on every rank with an error naming the field.

Rank 0 prints ``cotrain_checks: P ranks OK``.

Usage: cotrain_checks.py WORKDIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch


def _config(path: Path, run_dir: Path, interleave: bool, epochs: int = 4, staleness: int = 0):
    from hpc_graph.train.config import config_from_dict

    return config_from_dict({
        "data": {"path": str(path)}, "engine": {"name": "flow", "microbatches": 3, "cross_edges": "stale",
                                                # stages by count: a timed cut may differ between the two runs
                                                # (under load), and with dropout so would the masks each stage draws
                                                "stage_split": "count"},
        "model": {"name": "gcn", "hidden": 8, "num_layers": 4, "residual": True, "dropout": 0.1},
        "optim": {"lr": 0.01},
        "train": {"epochs": epochs, "eval_every": 2, "progress": False, "run_dir": str(run_dir), "dtype": "float64"},
        "lm": {"enabled": True, "model": "tiny", "epochs": 3.0, "lr": 1e-3, "batch_size": 4, "sync": "every",
               "sync_every": 2, "interleave": interleave, "staleness": staleness}})


def _lm_trainer(texts, label, train, comm, batch):
    from hpc_graph.nn.text_encoder import EarlyExitLM, load_text_encoder
    from hpc_graph.train.cotrain import LMTrainer, exit_groups

    enc, tok = load_text_encoder("tiny", texts, dropout=0.0, seed=3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        lm = EarlyExitLM(enc, 2, int(label.max()) + 1).double()
    ids, mask = tok.encode(texts, 16)
    groups = exit_groups(np.arange(len(texts)) % 5, 2, "centrality", 0)
    t = LMTrainer(lm, ids, mask, groups, torch.from_numpy(label), train, comm, epochs=2.0, batch_size=batch,
                  lr=1e-2, seed=0)
    t.plan(3)
    return t


def _interleave_check(data, work, comm, staleness):
    from hpc_graph.train.trainer import Trainer

    runs = {}
    for il in (False, True):
        t = Trainer(_config(data, work / f"flow-{il}-{staleness}", il, staleness=staleness), comm)
        if il:
            t.cotrain.interleaver.floor = 1e9  # run chunks in every wait (a tiny graph has tiny bubbles)
        losses, accs, chunks, delay = [], [], 0, 0.0
        for _ in range(4):
            losses.append(t.step())
            chunks += t.cotrain.trainer.stats["bubble_chunks"]
            delay = max(delay, t.cotrain.trainer.stats["max_delay_seconds"])
        accs.append(t.evaluate())
        lm_params = [p.detach().clone() for p in t.cotrain.trainer.lm.parameters()]
        runs[il] = (losses, accs, lm_params, t.feat.clone(), chunks, delay, t.cotrain.trainer._chunk_est)
    (l0, a0, p0, f0, c0, _, _), (l1, a1, p1, f1, c1, d1, est) = runs[False], runs[True]
    assert l0 == l1, (staleness, l0, l1)
    assert a0 == a1, (a0, a1)
    assert torch.equal(f0, f1)
    for p, q in zip(p0, p1):
        assert torch.equal(p, q)
    assert c0 == 0
    all_chunks = comm.allgather_object(c1)
    assert sum(all_chunks) > 0, all_chunks
    assert d1 <= 3.0 * max(est.values()) + 0.05, (d1, est)  # at most one chunk (its time, with slack for noise)
    # every rank holds the same LM (data-parallel steps)
    sums = comm.allgather_object([float(p.sum()) for p in p1])
    assert all(s == sums[0] for s in sums), "LM replicas differ between ranks"


def main() -> None:
    from data_io.dataset import open_dataset
    from data_io.generators import write_csbm, write_tag
    from hpc_graph.comm import get_communicator
    from hpc_graph.comm.local import LocalCommunicator
    from hpc_graph.train.config import ConfigError
    from hpc_graph.train.trainer import Trainer

    from hpc_graph.comm.threads import configure_threads

    comm = get_communicator("mpi")
    configure_threads(comm=comm)  # as a user's ranks would: one thread each when they share the cores
    rank, size = comm.rank, comm.size
    work = Path(sys.argv[1])
    data, plain = work / "tag.h5", work / "plain.h5"
    if rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        write_tag(data, num_nodes=180, communities=2, topics=3, seed=1)
        write_csbm(plain, 120, 2, feat_dim=4)
    comm.barrier()

    # 1. data-parallel LM == one process with the global batch
    with open_dataset(data) as ds:
        texts, label, train = ds.text(), ds.label(), np.nonzero(ds.mask("train_mask"))[0]
    lm_comm = comm.dup()
    par = _lm_trainer(texts, label, train, lm_comm, batch=3)
    one = _lm_trainer(texts, label, train, LocalCommunicator(), batch=3 * size)
    assert par.total_steps == one.total_steps and par.total_steps > 3
    for _ in range(3):
        for t in (par, one):
            t.begin_epoch()
            t.finish_epoch()
    assert par.applied == one.applied == par.total_steps
    for (n, p), q in zip(par.lm.named_parameters(), one.lm.parameters()):
        if n.endswith("attention.self.key.bias"):
            # its gradient is zero up to rounding (q . b_k is the same for every key of a query: softmax ignores
            # it), and Adam turns rounding noise of either sign into full steps: not comparable
            continue
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=f"data-parallel LM differs at {n}")

    # 2. interleaving changes times, never results (synchronous LM steps, and delayed ones)
    for staleness in ((0, 2) if size <= 2 else (2,)):  # 4 ranks: the delayed steps only
        _interleave_check(data, work, comm, staleness)

    # 3. no text: refused on every rank
    try:
        cfg = _config(plain, work / "plain", False)
        Trainer(cfg, comm)
    except ConfigError as exc:
        assert "/node/text" in str(exc), exc
    else:
        raise AssertionError("a dataset without /node/text was accepted")
    comm.barrier()
    if rank == 0:
        print(f"cotrain_checks: {size} ranks OK", flush=True)


if __name__ == "__main__":
    from _rank_main import run

    run(main)
