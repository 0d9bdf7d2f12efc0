"""What autograd keeps for the backward pass after one training forward, per rank.

    mpiexec -n 4 python benchmarks/bench_saved.py --config results/bench_training_work/bench_gat.yaml \
        --set data.path=results/bench_training_work/rmat-s18-metis-4 --set engine.name=sar

Builds the trainer exactly as ``hpc-graph train`` does, runs one forward pass in
training mode under ``torch.autograd.graph.saved_tensors_hooks`` and counts every
distinct storage autograd saves, once, grouped by the code that saved it (the
innermost frames in hpc_graph / torch.nn). Rank ``--rank`` (default 0) prints the
table; with ``--json OUT`` every rank's totals are written too. This is how the
memory breakdown of docs/benchmarks.md, history §3 ("Where a rank's memory goes"), was measured.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import traceback

import torch


def _where() -> str:
    frames = [f for f in traceback.extract_stack()[:-2]
              if "hpc_graph" in f.filename or os.sep.join(("torch", "nn")) in f.filename]
    return " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in frames[::-1][:3]) or "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="training config YAML")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--rank", type=int, default=0, help="rank that prints its table (default: 0)")
    ap.add_argument("--json", default=None, metavar="OUT", help="write every rank's totals here (rank 0)")
    args = ap.parse_args(argv)

    from hpc_graph.train.config import load_config
    from hpc_graph.train.trainer import Trainer

    cfg = load_config(args.config, args.set + ["train.progress=false"])
    trainer = Trainer(cfg)
    seen: dict[int, tuple[int, tuple[int, ...], str, str]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen[st.data_ptr()] = (st.nbytes(), tuple(t.shape), str(t.dtype).replace("torch.", ""), _where())
        return t

    trainer.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = trainer.model(trainer.graph, trainer.feat)
    del out
    total = sum(v[0] for v in seen.values())
    dg = getattr(trainer.graph, "dg", None)
    info = {"rank": trainer.rank, "engine": trainer.engine_name, "saved_bytes": total,
            "owned": int(trainer.graph.num_nodes), "halo": None if dg is None else int(dg.num_halo),
            "edges": int(trainer.graph.in_degree().sum())}
    everyone = trainer.comm.allgather_object(info)
    if trainer.rank == args.rank:
        groups: collections.Counter = collections.Counter()
        for nbytes, shape, dtype, where in seen.values():
            groups[(where, shape, dtype)] += nbytes
        print(f"rank {trainer.rank} ({info['engine']}): {info['owned']} owned, {info['halo']} halo, "
              f"{info['edges']} in-edges; kept for backward {total / 2**20:.1f} MiB")
        for (where, shape, dtype), nbytes in groups.most_common():
            print(f"{nbytes / 2**20:9.1f} MiB  {str(shape):>18} {dtype:<8} {where}")
    if trainer.rank == 0:
        for r in everyone:
            print(f"rank {r['rank']}: kept {r['saved_bytes'] / 2**20:.1f} MiB")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(everyone, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
