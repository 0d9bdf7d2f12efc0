"""Benchmark: distributed vs serial partitioning of R-MAT graphs (wall time, peak memory per rank, edge cut).

    python benchmarks/bench_dist_partition.py --scales 20 22 --ranks 1 2 4 --parts 4

For each scale the R-MAT dataset (edge factor 16, 128 features) is generated once into ``--workdir``.
Serial: ``hpc-graph partition`` (METIS through pymetis) in a child process, its peak RSS from
``os.wait4``. Distributed: ``mpiexec.openmpi -n R hpc-graph partition --distributed`` (parallel coarsening
and refinement around PT-Scotch's ParMETIS API, data_io/multilevel.py; ``--coarsen-to`` is passed through
when given), peak RSS of every rank as each rank measured it (``partition.json``:
``distributed.peak_rss_mb_per_rank``), wall time of the launch. Every output is validated with
``hpc-graph check`` before it is counted. Writes ``results/bench_dist_partition.json`` and prints a
markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _timed(cmd: list[str], timeout: float) -> tuple[float, float] | None:
    """Run ``cmd``; return (wall seconds, peak RSS MB of the child tree's largest process), or None when it
    ran past ``timeout`` seconds (then its process group is killed)."""
    import signal

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_env(), cwd=str(ROOT), stdout=subprocess.DEVNULL, start_new_session=True)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t0 > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
            return None
        time.sleep(0.2)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=int, nargs="+", default=[20, 22])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--workdir", type=Path, default=ROOT / "results" / "bench_dist_partition")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_dist_partition.json")
    ap.add_argument("--methods", nargs="+", default=["metis"], choices=["metis", "random"],
                    help="methods of the distributed runs (the serial run is METIS)")
    ap.add_argument("--skip-serial", action="store_true")
    ap.add_argument("--coarsen-to", type=int, default=None,
                    help="passed to the distributed runs (0: the library partitions the whole graph)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before a run counts as not finished")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "hpc_graph.cli", "-q"]
    mpiexec = shutil.which("mpiexec.openmpi")
    if not mpiexec:
        raise SystemExit("mpiexec.openmpi not found: apt-get install openmpi-bin libscotchparmetis-dev")
    launch = [mpiexec, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
    if os.geteuid() == 0:
        launch.append("--allow-run-as-root")
    records = json.loads(args.out.read_text()) if args.out.exists() else []
    for scale in args.scales:
        src = args.workdir / f"rmat{scale}.h5"
        if not src.exists():
            subprocess.run(cli + ["generate", "rmat", "--scale", str(scale), "--feat-dim", str(args.feat_dim),
                                  "-o", str(src)], check=True, env=_env())
        runs = [] if args.skip_serial else [("serial", 1, "metis")]
        runs += [("distributed", r, m) for m in args.methods for r in args.ranks]
        for mode, r, method in runs:
            out = args.workdir / f"rmat{scale}-{mode}-{r}"
            cmd = cli + ["partition", str(src), "-o", str(out), "-n", str(args.parts), "--force", "--method", method]
            if mode == "distributed":
                cmd = launch + ["-n", str(r)] + cmd + ["--distributed"]
                if args.coarsen_to is not None and method == "metis":
                    cmd += ["--coarsen-to", str(args.coarsen_to)]
            res = _timed(cmd, args.timeout)
            if res is None:
                rec = dict(scale=scale, mode=mode, method=method, ranks=r, parts=args.parts, timed_out=args.timeout)
                records = [x for x in records if not (x["scale"] == scale and x["mode"] == mode and x["ranks"] == r
                                                      and x["parts"] == args.parts and x.get("method") == method)]
                records.append(rec)
                args.out.write_text(json.dumps(records, indent=1))
                print(f"scale {scale} {mode} {method} R={r}: not finished in {args.timeout:.0f} s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
                continue
            wall, peak = res
            subprocess.run(cli + ["check", str(out)], check=True, env=_env(), stdout=subprocess.DEVNULL)
            meta = json.loads((out / "partition.json").read_text())
            per_rank = meta.get("distributed", {}).get("peak_rss_mb_per_rank", [peak])
            rec = dict(scale=scale, mode=mode, method=method, ranks=r, parts=args.parts, wall_s=round(wall, 2),
                       peak_mb_max=round(max(per_rank), 1), peak_mb_per_rank=per_rank,
                       edge_cut=meta["edge_cut"], edge_cut_fraction=meta["edge_cut_fraction"],
                       balance=meta["balance"], timings_s=meta.get("timings_s"),
                       nodes=meta["global_num_nodes"], edges=meta["global_num_edges"],
                       multilevel=meta.get("distributed", {}).get("multilevel"))
            records = [x for x in records if not (x["scale"] == scale and x["mode"] == mode and x["ranks"] == r
                                                  and x["parts"] == args.parts and x.get("method") == method)]
            records.append(rec)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(records, indent=1))
            print(f"scale {scale} {mode} {method} R={r}: {wall:.1f} s, peak {max(per_rank):.0f} MB/rank, "
                  f"cut {meta['edge_cut_fraction']:.4f}, balance {meta['balance']}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    print("\n| scale | mode | method | ranks | wall (s) | peak MB per rank (max) | edge cut | cut vs serial "
          "| node balance | edge balance |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rec in sorted(records, key=lambda x: (x["scale"], x["mode"] != "serial", x.get("method", ""), x["ranks"])):
        if rec.get("timed_out"):
            print(f"| {rec['scale']} | {rec['mode']} | {rec['method']} | {rec['ranks']} | > {rec['timed_out']:.0f} "
                  f"(not finished) | - | - | - | - | - |")
            continue
        ser = [x for x in records
               if x["scale"] == rec["scale"] and x["mode"] == "serial" and x["parts"] == rec["parts"]]
        rel = f"{rec['edge_cut'] / ser[0]['edge_cut']:.2f}x" if ser and ser[0]["edge_cut"] else "-"
        print(f"| {rec['scale']} | {rec['mode']} | {rec.get('method', 'metis')} | {rec['ranks']} | "
              f"{rec['wall_s']:.1f} | {rec['peak_mb_max']:.0f} | "
              f"{100 * rec['edge_cut_fraction']:.2f} % | {rel} | {rec['balance']['nodes']:.3f} | "
              f"{rec['balance'].get('edges', float('nan')):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
