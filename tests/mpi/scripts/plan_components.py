"""Run under ``mpiexec -n N``: the planner's memory components equal the tensors of real ``dp``/``sar`` steps.

Rank 0 writes an undirected and a directed R-MAT graph (512 nodes) and METIS-partitions each into N
parts; every rank then trains one step of GCN, SAGE and GAT on ``dp``, ``sar`` and ``sar`` without
prefetch, with column-blocked SpMM copies forced on (small ``BLOCK_BYTES``), and compares graph,
features, parameters + optimiser, saved activations and the largest exchange receive with
``hpc_graph.plan.fullbatch`` (``tests/plan/_measure.py``): equal, except the graph bytes of ``sar``
with several remote blocks, where the planner splits the cut edges over the blocks in proportion to
their halo rows (partition.json has no per-block edge count): within 0.5 %.

Usage: plan_components.py WORKDIR
"""
from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plan"))

import yaml  # noqa: E402

from hpc_graph.comm import get_communicator  # noqa: E402


def main() -> int:
    work = Path(sys.argv[1])
    comm = get_communicator("mpi")
    P = comm.size
    if comm.rank == 0:
        from data_io.generators.rmat import write_rmat
        from data_io.partitioner import partition_dataset

        work.mkdir(parents=True, exist_ok=True)
        for name, sym in (("u", True), ("d", False)):
            write_rmat(work / f"{name}.h5", 9, 8, feat_dim=12, num_classes=4, seed=3, symmetrize=sym)
            partition_dataset(str(work / f"{name}.h5"), str(work / f"{name}-{P}"), P)
    comm.barrier()
    spmm = importlib.import_module("hpc_graph.ops.spmm")
    spmm.BLOCK_BYTES = 4 << 10
    from _measure import measure, predict
    from hpc_graph.train.config import load_config
    from hpc_graph.train.trainer import Trainer

    problems, cases = [], 0
    for graph in ("u", "d"):
        for engine, prefetch in (("dp", True), ("sar", True), ("sar", False)):
            for model in ("gcn", "sage", "gat"):
                raw = {"data": {"path": str(work / f"{graph}-{P}")}, "engine": {"name": engine, "prefetch": prefetch},
                       "model": {"name": model, "hidden": 8, "num_layers": 3, **({"heads": 2} if model == "gat" else {})},
                       "train": {"epochs": 1, "progress": False, "run_dir": str(work / "run")}}
                cfg_path = work / f"cfg{comm.rank}.yaml"
                cfg_path.write_text(yaml.safe_dump(raw))
                case = f"{graph} {engine}{'' if prefetch else ' (no prefetch)'} {model} rank {comm.rank}"
                try:
                    tr = Trainer(load_config(cfg_path), comm)
                    got, want = measure(tr), predict(tr)
                    for k in got:
                        if got[k] == want[k]:
                            continue
                        several = sum(1 for c in tr.graph.dg.recv_count.values() if c) > 1
                        if k == "graph" and engine == "sar" and several and abs(got[k] - want[k]) <= 0.005 * got[k]:
                            continue
                        problems.append(f"{case}: {k} measured {got[k]}, predicted {want[k]}")
                    if not got["saved"] or not got["graph"] or (P > 1 and not got["halo_recv_max"]):
                        problems.append(f"{case}: nothing measured ({got})")
                except Exception:  # noqa: BLE001
                    problems.append(f"{case}: {traceback.format_exc()}")
                cases += 1
    everyone = comm.allgather_object(problems)
    if comm.rank == 0:
        bad = [p for ps in everyone for p in ps]
        for p in bad:
            print("MISMATCH", p)
        if not bad:
            print(f"plan_components: {P} ranks, {cases} cases per rank OK")
    return 0 if not any(everyone) else 1


if __name__ == "__main__":
    sys.exit(main())
