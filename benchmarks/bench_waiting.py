"""Benchmark: does a rank waiting in MPI leave its core to the ranks still computing?

    python benchmarks/bench_waiting.py                      # 4 ranks on this machine's cores
    python benchmarks/bench_waiting.py --ranks 4 --rounds 8 --out results/bench_waiting.json

``hpc-graph plan`` charges every rank of an oversubscribed node (more ranks than cores) the contention
factor measured with equal working copies. If ranks that finish their share early and wait for the others
(in a halo exchange or the gradient all-reduce) gave their core back, the slowest rank would run faster
than that, and a plan for unequal parts would lean high. This measures it with the communicator training
uses (``hpc_graph.comm``, MPI): every rank runs one thread; a step is a barrier, a rank's share of a fixed
one-thread workload (256 x 256 float32 GEMMs), then an all-reduce that waits for the slowest. Loads, in
units of the same work:

* ``alone``: one rank works (3 units), the others wait from the start;
* ``skewed``: 1, 1, 1.5 and 3 units (as unequal parts give);
* ``equal``: every rank 3 units (the planner's contention measurement);
* ``half``: half the ranks 3 units, half wait.

The same 3 units are timed in a single process first (``reference``). The rounds interleave the four
loads, so the machine's drift falls on all of them alike; the medians are reported in units of the
reference's third. If waiting ranks gave their core back, ``alone`` would take about the reference's time
and ``skewed`` about 4 units on 2 cores with 4 ranks (processor sharing); if they poll, all four take
about ``ranks / cores`` times the reference.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOADS = {"alone": lambda r, n: 3.0 if r == n - 1 else 0.0,
         "skewed": lambda r, n: (1.0, 1.0, 1.5, 3.0)[r % 4],
         "equal": lambda r, n: 3.0,
         "half": lambda r, n: 3.0 if r >= n // 2 else 0.0}


def _gemms(reps: int) -> None:

    a = _gemms.a
    for _ in range(reps):
        a @ a


def _worker(reps: int, rounds: int) -> dict | None:
    import torch

    torch.set_num_threads(1)
    _gemms.a = torch.randn(256, 256)
    _gemms(50)  # warm-up
    if "--reference" in sys.argv:
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            _gemms(3 * reps)
            times.append(time.perf_counter() - t)
        return {"reference": times}
    from hpc_graph.comm import get_communicator

    comm = get_communicator("mpi")
    flag = torch.zeros(1)
    out = {k: [] for k in LOADS}
    for _ in range(rounds):
        for name, load in LOADS.items():
            comm.barrier()
            t = time.perf_counter()
            _gemms(int(round(load(comm.rank, comm.size) * reps)))
            comm.allreduce_(flag)
            out[name].append(time.perf_counter() - t)
    return out if comm.rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=200, help="GEMMs per unit of work (about 50 ms at one thread)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        res = _worker(args.reps, args.rounds)
        if res is not None:
            print("RESULT " + json.dumps(res), flush=True)
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    me = [sys.executable, str(Path(__file__).resolve()), "--_worker", "--reps", str(args.reps),
          "--rounds", str(args.rounds)]
    results = {}
    for cmd in (me + ["--reference"], ["mpiexec", "-n", str(args.ranks)] + me):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        results.update(json.loads(line[len("RESULT "):]))
    unit = statistics.median(results["reference"]) / 3
    cores = len(os.sched_getaffinity(0))
    print(f"{args.ranks} ranks on {cores} cores, one thread each; unit = {unit * 1e3:.1f} ms "
          f"(a third of the one-process reference)")
    summary = {}
    for name, times in results.items():
        med = statistics.median(times) / unit
        summary[name] = {"median_units": med, "min_units": min(times) / unit, "seconds": times}
        print(f"  {name:9s} median {med:5.2f} units  (min {min(times) / unit:5.2f})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"ranks": args.ranks, "cores": cores, "reps": args.reps,
                                        "unit_seconds": unit, "loads": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
