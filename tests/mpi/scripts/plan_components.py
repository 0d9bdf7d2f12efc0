"""Run under ``mpiexec -n N``: the planner's memory components equal the tensors of real ``dp``/``sar``/``sylvie``
steps.

Rank 0 writes an undirected and a directed R-MAT graph (512 nodes) and METIS-partitions each into N
parts (:func:`prepare`; the test calls it beforehand, once for both rank counts, so that no rank spins in a
barrier while rank 0 writes them); every rank then trains one step of GCN, SAGE and GAT on ``dp``, ``sar``,
``sar`` without prefetch and ``sylvie`` (2 bits, synchronous), two steps on ``sylvie`` with its pipeline (4 bits,
float16 scales: the first step synchronous, the second on stale halo rows), and one step of ``flow``
(one stage of layers per rank, stages by count, 1 and 3 micro-batches), with column-blocked SpMM
copies forced on (small ``BLOCK_BYTES``), and compares graph, features, parameters + optimiser, saved
activations, the largest exchange receive and the bytes sent with the plan of the same rank
(``hpc_graph.plan.rank``, through ``tests/plan/_measure.py``, which runs the rank's step on shapes): equal,
except the partition's two NumPy index arrays (16 (N + 1) bytes the plan leaves out of the graph);
``sylvie`` within 5 % or 4 KiB per peer, its graph with the codec's exchange plan and importances and
what the first step leaves in the pipeline's slots (the codec's per-message NumPy arrays are not planned; a stale step's
in-flight buffers count as that step's activations in the plan, so the second step's graph is not compared); and
flow's largest receive with several micro-batches (METIS sizes them; the plan takes N/M rows each): within 5 %.

``--cli CFG`` (one launch instead of three for ``tests/mpi/test_plan.py``): then, on every rank, in this
process (the commands' ``main``, what ``hpc-graph`` runs): ``hpc-graph train --config CFG`` with
``HPC_GRAPH_MEMORY_LIMIT=50MB`` (run dir ``WORKDIR/refused``), the same with ``--force``
(``WORKDIR/forced``), and ``hpc-graph plan --config CFG --profile WORKDIR/links.json`` (links measured on
these ranks; kernel rates in one round on a scale-10 synthetic graph), and rank 0 prints every rank's exit
statuses: ``plan_components: cli exit statuses [[train, train --force, plan], ...]``.

Usage: plan_components.py WORKDIR [DATADIR] [--cli CFG] [--graphs ud|u|d]   (the graphs in DATADIR, default WORKDIR)
"""
from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

import yaml

from hpc_graph.comm import get_communicator


def compare_step(case: str, tr, got: dict, want: dict, step: int) -> list[str]:
    """Mismatches of measured step ``step`` (0, 1) against the prediction (:func:`_measure.mismatches`, and the
    approximations the module docstring names)."""
    from _measure import mismatches

    engine = tr.engine_name
    out = []
    if engine == "sylvie":  # the plan's graph holds the codec's state and what the first step leaves in the slots
        if step:
            got = {**got, "graph": want["graph"]}  # a stale step's in-flight buffers: activations in the plan
        else:
            got = {**got, "graph": got["graph"] + got["codec_state"] + got["slots"]}
    for line in mismatches(got, want, tr.size):
        k = line.split(":")[0]
        if engine == "sylvie" and abs(got[k] - want[k]) <= max(0.05 * max(got[k], want[k]), 4096 * (tr.size - 1)):
            # the codec's per-message NumPy arrays are not planned (a few hundred bytes per peer), and its message
            # layouts on shapes are cached per process: the first plan of a process counts them, later ones not
            continue
        if k == "halo_recv_max" and engine == "flow" and tr.engine.num_microbatches > 1 and \
                abs(got[k] - want[k]) <= 0.05 * want[k]:
            continue  # METIS' micro-batches: the plan takes each as N/M rows
        out.append(f"{case}: {line}")
    # a first flow stage of one projecting SAGE layer keeps nothing but the input features (not counted)
    nothing_saved = not got["saved"] and not (engine == "flow" and tr.engine.first and want["saved"] == 0)
    if nothing_saved or not got["graph"] or (tr.size > 1 and not got["halo_recv_max"]):
        out.append(f"{case}: nothing measured ({got})")
    return out


def prepare(data: Path, P: int) -> None:
    """The two graphs in ``data`` and their ``P``-part partitions (those already there are kept)."""
    from data_io.generators.rmat import write_rmat
    from data_io.partitioner import partition_dataset

    data.mkdir(parents=True, exist_ok=True)
    for name, sym in (("u", True), ("d", False)):
        if not (data / f"{name}.h5").exists():
            write_rmat(data / f"{name}.h5", 9, 8, feat_dim=12, num_classes=4, seed=3, symmetrize=sym)
        if not (data / f"{name}-{P}").exists():
            partition_dataset(str(data / f"{name}.h5"), str(data / f"{name}-{P}"), P)


def cli_checks(work: Path, cfg: str, comm) -> list[int]:
    """Exit statuses of ``hpc-graph train`` (refused: memory limit 50MB), ``train --force`` and
    ``plan --profile`` on this rank (see the module docstring)."""
    import functools
    import os

    from hpc_graph.cli import main as cli
    from hpc_graph.plan import profile

    os.environ["HPC_GRAPH_MEMORY_LIMIT"] = "50MB"
    try:
        codes = [cli(["-q", "train", "--config", cfg, "--run-dir", str(work / "refused")])]
        comm.barrier()  # both ranks are past the refusal: none is left waiting in it
        codes.append(cli(["-q", "train", "--config", cfg, "--run-dir", str(work / "forced"), "--force"]))
    finally:
        del os.environ["HPC_GRAPH_MEMORY_LIMIT"]
    profile.FRESH_CALLS, profile.STREAM_ELEMENTS = 1, 1 << 18
    profile.kernel_rates = functools.partial(profile.kernel_rates, reps=1)
    graph = profile.synthetic_graph
    profile.synthetic_graph = lambda scale=16, edge_factor=16: graph(10, 8)
    codes.append(cli(["-q", "plan", "--config", cfg, "--engines", "dp,sar", "--ranks", "2", "--floor", "450MiB",
                      "--rates", "synthetic", "--calibration", "none", "--profile", str(work / "links.json")]))
    sys.stdout.flush()
    return codes


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("data", type=Path, nargs="?")
    parser.add_argument("--cli", default=None)
    parser.add_argument("--graphs", default="ud", help="u (undirected), d (directed) or both")
    args = parser.parse_args()
    work, data = args.work, args.data or args.work
    comm = get_communicator("mpi")
    P = comm.size
    if comm.rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        prepare(data, P)
    comm.barrier()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plan"))
    spmm = importlib.import_module("hpc_graph.ops.spmm")
    block_bytes, spmm.BLOCK_BYTES = spmm.BLOCK_BYTES, 4 << 10
    from _measure import measure, predict
    from hpc_graph.train.config import load_config
    from hpc_graph.train.trainer import Trainer

    problems, cases = [], 0
    variants = (("dp", {"prefetch": True}, 1), ("sar", {"prefetch": True}, 1), ("sar", {"prefetch": False}, 1),
                ("sylvie", {"bits": 2}, 1), ("sylvie", {"bits": 4, "pipeline": "on", "scale_dtype": "float16"}, 2),
                ("flow", {"stage_split": "count"}, 1), ("flow", {"stage_split": "count", "microbatches": 3}, 1))
    for graph in args.graphs:
        for engine, opts, steps in variants:
            prefetch = opts.get("prefetch", True)
            for model in ("gcn", "sage", "gat"):
                flow = engine == "flow"  # the whole dataset on every rank, one stage of layers each
                raw = {"data": {"path": str(data / (f"{graph}.h5" if flow else f"{graph}-{P}"))},
                       "engine": {"name": engine, **opts},
                       "model": {"name": model, "hidden": 8, "num_layers": max(3, P) if flow else 3,
                                 **({"heads": 2} if model == "gat" else {})},
                       "train": {"epochs": 1, "progress": False, "run_dir": str(work / "run")}}
                cfg_path = work / f"cfg{comm.rank}.yaml"
                cfg_path.write_text(yaml.safe_dump(raw))
                case = f"{graph} {engine}{'' if prefetch else ' (no prefetch)'} {opts} {model} rank {comm.rank}"
                try:
                    tr = Trainer(load_config(cfg_path), comm)
                    want = predict(tr)
                    for step in range(steps):
                        problems += compare_step(f"{case}, step {step + 1}", tr, measure(tr), want, step)
                except Exception:  # noqa: BLE001
                    problems.append(f"{case}: {traceback.format_exc()}")
                cases += 1
    everyone = comm.allgather_object(problems)
    if comm.rank == 0:
        bad = [p for ps in everyone for p in ps]
        for p in bad:
            print("MISMATCH", p)
        if not bad:
            print(f"plan_components: {P} ranks, {cases} cases per rank OK", flush=True)
    if args.cli:
        spmm.BLOCK_BYTES = block_bytes
        try:
            mine = cli_checks(work, args.cli, comm)
        except Exception:  # noqa: BLE001
            print(f"plan_components: cli checks failed on rank {comm.rank}: {traceback.format_exc()}", flush=True)
            mine = None
        codes = comm.allgather_object(mine)
        if comm.rank == 0:
            print(f"plan_components: cli exit statuses {json.dumps(codes)}", flush=True)
    return 0 if not any(everyone) else 1


if __name__ == "__main__":
    from _rank_main import run

    run(main)
