"""Run under ``mpiexec -n N``: the ``minibatch`` engine across ranks.

Rank 0 writes a random graph with skewed degrees and partitions it into N
parts (METIS). Every rank then checks, in float64:

1. **exact, all neighbours** (fan-outs -1): every batch's output rows, loss and
   (un-reduced) gradients equal the ``single`` engine's full-graph model on
   the same seeds; GCN, SAGE, GAT and DistGNN-MB's GAT (ReLU projection), and two models written against the public API
   (tests/plugins/user_model.py's MeanSAGE, examples/custom_layer.py's GIN).
2. **placement independence** (exact, fan-outs [3, 2]): every sampled
   neighbourhood equals what one process holding the whole graph samples for
   that node (same seed, epoch and layer).
3. **bytes** (exact, fan-outs [3, 2]; hec): the bytes each iteration sends
   equal the count derived here from the blocks and from what the other ranks
   asked for (all-gathered): ids asked and answers of remote sampling
   (``[degree, count, neighbours]`` per node), feature rows served
   (``F * 8 + 8`` per row) and ids requested; ``hec`` (push cap 3): the
   pushes alone, per layer and peer an 8-byte count, then ``8 + width * 8`` per
   row for min(cap, candidates) rows, the candidates being the block's own
   sources the peer holds as halo nodes; nothing in the last ``delay``
   iterations; every cached row served at layer 0 equals the owner's features.
4. **every training node a seed once per epoch** (exact, all neighbours; rank r keeps 2r - 1 of its
   training nodes, so rank 0 has none and the others unequal counts): the seeds of all ranks over an epoch are the
   training set, each once; ranks without seeds run the agreed iterations on empty batches; each
   iteration's all-reduced gradient of the loss over the global batch equals one process's on the
   union of the ranks' seeds.
5. **hec through the trainer**: ``fit`` on every rank with the same number of
   iterations, pushes made and served, ages within ``lifespan + delay``, the
   same global loss per epoch on every rank; ``drop`` sends no feature or
   push bytes.

Usage: minibatch_checks.py WORKDIR
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from data_io.dataset import GraphData, write_dataset
from data_io.partitioner import partition_dataset
from hpc_graph.comm import get_communicator
from hpc_graph.engines import create_engine
from hpc_graph.graph.sampler import SeedSchedule, sample_key
from hpc_graph.nn import build_model

CPU = torch.device("cpu")


def _dataset(path: Path, n: int = 200, e: int = 1400, seed: int = 2) -> None:
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** 0.7
    src = rng.choice(n, e, p=w / w.sum())
    dst = rng.integers(0, n, e)
    keep = src != dst
    pairs = np.unique(np.concatenate([np.stack([dst[keep], src[keep]], 1), np.stack([src[keep], dst[keep]], 1)]),
                      axis=0)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=indptr[1:])
    split = rng.random(n)
    write_dataset(path, GraphData(indptr=indptr, indices=pairs[:, 1].astype(np.int64),
                                  feat=rng.standard_normal((n, 5)).astype(np.float32),
                                  label=rng.integers(0, 3, n).astype(np.int64), train_mask=split < 0.6,
                                  val_mask=(split >= 0.6) & (split < 0.8), test_mask=split >= 0.8, name="mb",
                                  num_classes=3, directed=False))


def _close(what, got, want, tol=1e-9):
    err = float((got - want).abs().max()) if want.numel() else 0.0
    if err > tol * max(1.0, float(want.abs().max()) if want.numel() else 1.0):
        raise AssertionError(f"{what}: max error {err:.3e}")


def check_exact_all_neighbours(data: Path, pdir: Path, comm) -> int:
    local = get_communicator("local")
    single = create_engine("single", str(data), local, CPU, torch.float64)
    mb = create_engine("minibatch", str(pdir), comm, CPU, torch.float64,
                       {"fanouts": (-1, -1), "batch_size": 13, "mode": "exact"})
    # global id of a seed -> row of the single engine: partitions relabel, orig_id maps back
    orig = mb.dg.orig_id
    checked = 0
    # the built-in stacks, and models written by users against the public API (tests/plugins/user_model.py,
    # examples/custom_layer.py's GIN): the same blocks, the same rows as one process
    repo = Path(__file__).resolve().parents[3]
    sys.path[:0] = [str(repo / "tests" / "plugins"), str(repo / "examples")]
    from custom_layer import GIN
    from user_model import MeanSAGE
    mc = argparse.Namespace(hidden=4, dropout=0.0)
    builders = {name: (lambda n=name: build_model(n, 5, 4, 3, num_layers=2, dropout=0.0, heads=2))
                for name in ("gcn", "sage", "gat")}
    builders["gat relu projection"] = lambda: build_model("gat", 5, 4, 3, num_layers=2, dropout=0.0, heads=2,
                                                          gat_projection="relu")  # DistGNN-MB's GAT
    builders.update({"user MeanSAGE": lambda: MeanSAGE(5, 3, mc), "user GIN": lambda: GIN(5, 3, mc)})
    for model_name, build in builders.items():
        torch.manual_seed(4)
        model = build().double()
        twin = copy.deepcopy(model)
        full = model(single.graph, single.feat)
        mb.begin_epoch(1)
        for it in range(mb.iterations(1)):
            batch = mb.batch(1, it)
            rows = orig[batch.seeds]
            out = twin(batch.graph, batch.feat)
            _close(f"rank {comm.rank} {model_name} iteration {it} rows", out, full[rows])
            twin.zero_grad()
            model.zero_grad()
            F.cross_entropy(out, batch.label, reduction="sum").backward()
            F.cross_entropy(model(single.graph, single.feat)[rows], single.label[rows],
                            reduction="sum").backward()
            for (name, p), q in zip(twin.named_parameters(), model.parameters()):
                _close(f"rank {comm.rank} {model_name} iteration {it} grad {name}", p.grad, q.grad)
            checked += 1
    return checked


def check_every_seed_once(data: Path, pdir: Path, comm) -> int:
    local = get_communicator("local")
    single = create_engine("single", str(data), local, CPU, torch.float64)
    mb = create_engine("minibatch", str(pdir), comm, CPU, torch.float64,
                       {"fanouts": (-1, -1), "batch_size": 2, "mode": "exact"})
    orig = mb.dg.orig_id
    mb.train_idx = mb.train_idx[:max(2 * comm.rank - 1, 0)]
    mb.schedule = SeedSchedule(mb.train_idx, mb.batch_size, mb.seed, comm)
    mine = int(mb.train_idx.numel())
    counts = comm.allgather_object(mine)
    torch.manual_seed(6)
    model = build_model("sage", 5, 4, 3, num_layers=2, dropout=0.0).double()
    twin = copy.deepcopy(model)
    iters = mb.iterations(1)
    if iters != -(-max(counts) // 2):
        raise AssertionError(f"rank {comm.rank}: {iters} iterations for at most {max(counts)} seeds in batches of 2")
    _, totals = mb.batch_sizes(1, iters)
    seen: list[int] = []
    for it in range(iters):
        batch = mb.batch(1, it)
        rows = orig[batch.seeds]
        twin.zero_grad()
        loss = F.cross_entropy(twin(batch.graph, batch.feat), batch.label, reduction="sum") / max(totals[it], 1.0)
        loss.backward()
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in twin.parameters()])
        comm.allreduce_(flat)
        union = [r for part in comm.allgather_object(rows.tolist()) for r in part]
        if len(union) != int(totals[it]):
            raise AssertionError(f"iteration {it}: {len(union)} seeds, global batch {totals[it]}")
        seen += union
        model.zero_grad()
        (F.cross_entropy(model(single.graph, single.feat)[union], single.label[union], reduction="sum")
         / len(union)).backward()
        want = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        _close(f"rank {comm.rank} iteration {it} all-reduced gradient ({mine} seeds here)", flat, want)
    train = [r for part in comm.allgather_object(orig[mb.train_idx].tolist()) for r in part]
    if sorted(seen) != sorted(train):
        raise AssertionError(f"the epoch's seeds {sorted(seen)} are not the training set {sorted(train)}, each once")
    return len(seen)


def check_placement(data: Path, pdir: Path, comm) -> int:
    local = get_communicator("local")
    whole = create_engine("minibatch", str(data), local, CPU, torch.float64,
                          {"fanouts": (3, 2), "batch_size": 10, "mode": "exact"})
    mb = create_engine("minibatch", str(pdir), comm, CPU, torch.float64,
                       {"fanouts": (3, 2), "batch_size": 10, "mode": "exact"})
    orig = mb.dg.orig_id.numpy()
    book = mb.dg.node_ranges
    # the partition's global id -> source-dataset id, for every node (all ranks' orig ids)
    to_orig = np.concatenate([np.asarray(o) for o in comm.allgather_object(orig.tolist())])
    assert to_orig.size == book[-1]
    mb.begin_epoch(3)
    n = 0
    for it in range(mb.iterations(3)):
        batch = mb.batch(3, it)
        for layer, block in enumerate(batch.graph.blocks):
            key = sample_key(0, 3, layer)
            gid = block.src_gid.numpy()
            # the rows' dropout keys: the dataset id where this rank knows it (owned, halo), else gid + N;
            # never one key for two nodes
            ids, total = block.row_ids().numpy(), int(book[-1])
            if len(set(ids.tolist())) != ids.size or not np.all((ids == to_orig[gid]) | (ids == gid + total)):
                raise AssertionError(f"rank {comm.rank}: block {layer} row ids {ids[:8]} for gids {gid[:8]}")
            owned = (gid >= book[comm.rank]) & (gid < book[comm.rank + 1])
            if not np.array_equal(ids[owned], to_orig[gid[owned]]):
                raise AssertionError(f"rank {comm.rank}: block {layer}: owned rows not keyed on their dataset ids")
            bi, bc = block.csr.indptr.numpy(), block.csr.indices.numpy()
            dst_orig = to_orig[gid[:block.num_nodes]]
            fan = (3, 2)[len(batch.graph.blocks) - 1 - layer]
            counts, nbrs, _ = whole.sampler.local(dst_orig, fan, key)
            starts = np.cumsum(counts) - counts
            for i in range(block.num_nodes):
                mine = sorted(to_orig[gid[bc[bi[i]:bi[i + 1]]]].tolist())
                ref = sorted(nbrs[starts[i]:starts[i] + counts[i]].tolist())
                if mine != ref:
                    raise AssertionError(f"rank {comm.rank}: node {dst_orig[i]} sampled {mine} here, {ref} on one "
                                         "process")
                n += 1
    return n


def _requests(mb, batch) -> tuple[list[int], list[int]]:
    """Per hop: this rank's remote destinations (expanded at their owners); block 0's remote sources."""
    first, last = mb.first, mb.first + mb.num_owned
    hops = []
    for block in reversed(batch.graph.blocks):
        d = block.src_gid.numpy()[:block.num_nodes]
        hops.append(d[(d < first) | (d >= last)].tolist())
    s = batch.graph.blocks[0].src_gid.numpy()
    return hops, s[(s < first) | (s >= last)].tolist()


def check_exact_bytes(pdir: Path, comm, feat_dim: int) -> int:
    mb = create_engine("minibatch", str(pdir), comm, CPU, torch.float64,
                       {"fanouts": (3, 2), "batch_size": 12, "mode": "exact"})
    owner_of = lambda g: int(np.searchsorted(mb.dg.node_ranges, g, side="right") - 1)  # noqa: E731
    mb.begin_epoch(2)
    checked = 0
    for it in range(mb.iterations(2)):
        b0 = comm.bytes_sent
        batch = mb.batch(2, it)
        sent = comm.bytes_sent - b0
        hops, fetched = _requests(mb, batch)
        everyone = comm.allgather_object((hops, fetched))
        # degrees and sample sizes of every node, as its owner computes them (from the blocks)
        counts = {}  # (hop, node) -> sampled neighbours; hop 0 is the seed hop (the last block)
        for hop, block in enumerate(reversed(batch.graph.blocks)):
            gid = block.src_gid.numpy()
            for i, c in enumerate(np.diff(block.csr.indptr.numpy())):
                counts[(hop, int(gid[i]))] = int(c)
        all_counts = {}
        for part in comm.allgather_object(counts):
            all_counts.update(part)
        want = 8 * sum(len(h) for h in hops) + 8 * len(fetched)  # ids I asked for (sampling, features)
        for r, (their_hops, their_fetch) in enumerate(everyone):
            if r == comm.rank:
                continue
            for hop, h in enumerate(their_hops):  # answers to the nodes I own: [degree, count, neighbours...]
                want += sum(8 * (2 + all_counts[(hop, g)]) for g in h if owner_of(g) == comm.rank)
            want += sum(feat_dim * 8 + 8 for g in their_fetch if owner_of(g) == comm.rank)
        if sent != want:
            raise AssertionError(f"rank {comm.rank} iteration {it}: sent {sent} bytes, blocks and requests "
                                 f"give {want}")
        checked += 1
    return checked


def check_hec_bytes(pdir: Path, comm, feat_dim: int) -> int:
    cap, hidden, delay = 3, 4, 1
    mb = create_engine("minibatch", str(pdir), comm, CPU, torch.float64,
                       {"fanouts": (3, 2), "batch_size": 12, "mode": "hec", "push_limit": cap, "delay": delay,
                        "lifespan": 4})
    torch.manual_seed(1)
    model = build_model("sage", feat_dim, hidden, 3, num_layers=2, dropout=0.0).double()
    first, last = mb.first, mb.first + mb.num_owned
    halo_on = {q: set((mb.dg.send_lid[q] + first).tolist()) for q in mb.push_peers}
    feats = np.concatenate([np.asarray(f) for f in comm.allgather_object(mb.host_feat.numpy().tolist())])
    checked = served = 0
    for epoch in (2, 3):  # the second epoch starts with the first one's cache
        mb.begin_epoch(epoch)
        iters = mb.iterations(epoch)
        for it in range(iters):
            b0 = comm.bytes_sent
            batch = mb.batch(epoch, it)
            model(batch.graph, batch.feat).sum().backward()
            sent = comm.bytes_sent - b0
            want = 0
            if it < iters - delay:
                for layer, block in enumerate(batch.graph.blocks):
                    src = block.src_gid.numpy()
                    own = src[(src >= first) & (src < last)]
                    width = feat_dim if layer == 0 else hidden
                    for q in mb.push_peers:
                        rows = min(cap, sum(1 for g in own.tolist() if g in halo_on[q]))
                        want += 8 + rows * (8 + width * 8)
            if sent != want:
                raise AssertionError(f"rank {comm.rank} epoch {epoch} iteration {it}: hec sent {sent} bytes, the "
                                     f"blocks and the cap give {want}")
            b0 = batch.graph.blocks[0]
            src = b0.src_gid.numpy()
            far = np.flatnonzero((src < first) | (src >= last))
            _close(f"rank {comm.rank} cached input rows", batch.feat[torch.from_numpy(far)],
                   torch.from_numpy(feats[src[far]]), tol=0.0)
            served += far.size
            checked += 1
    mb.close()
    if sum(comm.allgather_object(served)) == 0:
        raise AssertionError("hec served no input row from its layer-0 cache on any rank")
    return checked


def check_hec_trainer(pdir: Path, work: Path, comm) -> dict:
    from hpc_graph.train.config import config_from_dict
    from hpc_graph.train.trainer import Trainer

    results = {}
    for mode in ("hec", "drop"):
        cfg = config_from_dict({
            "data": {"path": str(pdir)}, "engine": {"name": "minibatch"},
            "model": {"name": "sage", "hidden": 8, "num_layers": 3, "dropout": 0.2},
            "sampler": {"fanouts": [4, 3, 3], "batch_size": 6},
            "hec": {"mode": mode, "size": 512, "lifespan": 2, "push_limit": 5, "delay": 1},
            "optim": {"lr": 0.02},
            "train": {"epochs": 3, "seed": 2, "eval_every": 3, "progress": False, "dtype": "float64",
                      "run_dir": str(work / f"fit-{mode}")}})
        trainer = Trainer(cfg, comm)
        summary = trainer.fit()
        rows = [json.loads(x) for x in (work / f"fit-{mode}" / f"metrics.rank{comm.rank}.jsonl").read_text().split("\n")
                if x.strip()]
        stats = [r["engine_stats"] for r in rows]
        iters = comm.allgather_object([s["iterations"] for s in stats])
        if any(i != iters[0] for i in iters):
            raise AssertionError(f"{mode}: ranks ran different numbers of iterations: {iters}")
        losses = comm.allgather_object([r["loss"] for r in rows])
        if any(x != losses[0] for x in losses):
            raise AssertionError(f"{mode}: ranks disagree on the global loss: {losses}")
        if mode == "hec":
            pushed = sum(sum(s["pushed_rows"]) for s in stats)
            hits = sum(sum(h * n for h, n in zip(s["hec_hit_rate"], s["hec_lookups"]) if h is not None) for s in stats)
            ages = {int(a) for s in stats for a in s["hec_age"]}
            if ages and max(ages) > 2 + 1:
                raise AssertionError(f"hec served an embedding {max(ages)} iterations old (lifespan 2, delay 1)")
            total = comm.allgather_object((pushed, hits))
            if sum(p for p, _ in total) == 0 or sum(h for _, h in total) == 0:
                raise AssertionError(f"hec: nothing pushed or served on any rank: {total}")
            results[mode] = total
        else:
            if any(s["bytes_by_op"]["fetch"] or s["bytes_by_op"]["push"] for s in stats):
                raise AssertionError("drop mode fetched or pushed something")
        if summary["test_acc"] is None:
            raise AssertionError(f"{mode}: no evaluation")
    return results


def main() -> int:
    work = Path(sys.argv[1])
    comm = get_communicator("mpi")
    from hpc_graph.comm.threads import configure_threads
    configure_threads(comm=comm, world=True)  # one thread per rank on shared cores, as a user's job
    from hpc_graph.comm import install_abort_handler
    install_abort_handler(comm)
    data, pdir = work / "g.h5", work / f"parts-{comm.size}"
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        _dataset(data)
        partition_dataset(data, pdir, comm.size, "metis", seed=0)
    comm.barrier()
    a = check_exact_all_neighbours(data, pdir, comm)
    s = check_every_seed_once(data, pdir, comm)
    b = check_placement(data, pdir, comm)
    c = check_exact_bytes(pdir, comm, 5) + check_hec_bytes(pdir, comm, 5)
    d = check_hec_trainer(pdir, work, comm)
    comm.barrier()
    if comm.rank == 0:
        print(f"minibatch_checks: {comm.size} ranks OK ({a} exact batches, {s} seeds once, {b} sampled neighbourhoods, "
              f"{c} byte counts, hec {d})", flush=True)
    return 0


if __name__ == "__main__":
    from _rank_main import run
    run(main)
