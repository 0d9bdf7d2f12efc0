"""Benchmark: partition an R-MAT dataset with METIS; wall time per phase and peak RSS.

    python benchmarks/bench_partition.py                      # scale 20, EF 16, 128 features, 4 parts
    python benchmarks/bench_partition.py --scale 16 --parts 8 --method random

The dataset is generated once (``data_io.generators.write_rmat``) into
``--workdir`` and reused; the partitioning runs in a child process so that
its peak resident set size is measured alone (``os.wait4``). Writes
``results/bench_partition.json`` (and a PNG of the phase times when matplotlib
is there). Targets for scale 20: <= 150 s and <= 6 GB peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S, TARGET_GB = 150.0, 6.0

_CHILD = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
from data_io.partitioner import partition_dataset
meta = partition_dataset(sys.argv[1], sys.argv[2], int(sys.argv[3]), method=sys.argv[4], seed=0, force=True)
print(json.dumps(meta))
"""


def _run_child(code: str, *args: str) -> tuple[str, float, float, float]:
    """Run ``python -c code args``; return (stdout, wall s, peak RSS GiB, CPU s (user+sys)) of that child."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT))
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child failed with status {proc.returncode}")
    return out, wall, usage.ru_maxrss / 2**20, usage.ru_utime + usage.ru_stime  # ru_maxrss: KiB on Linux


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--edge-factor", type=int, default=16)
    ap.add_argument("--feat-dim", type=int, default=128)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--method", choices=("metis", "random"), default="metis")
    ap.add_argument("--workdir", type=Path, default=ROOT / "results" / "bench_partition_work")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_partition.json")
    ap.add_argument("--keep", action="store_true", help="keep the partition directory")
    args = ap.parse_args(argv)

    args.workdir.mkdir(parents=True, exist_ok=True)
    src = args.workdir / f"rmat{args.scale}-ef{args.edge_factor}-f{args.feat_dim}.h5"
    gen_s = None
    if not src.exists():
        code = ("import sys; from data_io.generators import write_rmat; "
                "write_rmat(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), feat_dim=int(sys.argv[4]), seed=0)")
        print(f"generating {src} ...", flush=True)
        _, gen_s, gen_gb, _ = _run_child(code, str(src), str(args.scale), str(args.edge_factor), str(args.feat_dim))
        print(f"generated in {gen_s:.1f} s, peak RSS {gen_gb:.2f} GiB", flush=True)
    out_dir = args.workdir / f"parts-{args.method}-{args.parts}"
    load0 = os.getloadavg()
    print(f"partitioning {src} into {args.parts} parts ({args.method}) ...", flush=True)
    stdout, wall, peak_gb, cpu_s = _run_child(_CHILD, str(src), str(out_dir), str(args.parts), args.method)
    meta = json.loads(stdout.strip().splitlines()[-1])
    result = {
        "benchmark": "partition",
        "config": {"scale": args.scale, "edge_factor": args.edge_factor, "feat_dim": args.feat_dim,
                   "parts": args.parts, "method": args.method},
        "dataset": {"path": str(src), "num_nodes": meta["global_num_nodes"], "num_edges": meta["global_num_edges"],
                    "size_bytes": src.stat().st_size, "generate_s": gen_s},
        "wall_s": round(wall, 2), "cpu_s": round(cpu_s, 2), "peak_rss_gib": round(peak_gb, 3),
        "phases_s": meta["timings_s"],
        "edge_cut": meta["edge_cut"], "edge_cut_fraction": meta["edge_cut_fraction"],
        "replication_factor": meta["replication_factor"], "balance": meta["balance"],
        "targets": {"wall_s": TARGET_S, "peak_rss_gib": TARGET_GB},
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": load0, "load_avg_at_end": os.getloadavg(),
                    "python": platform.python_version(), "node": platform.node()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    ok = wall <= TARGET_S and peak_gb <= TARGET_GB
    print(json.dumps(result, indent=1))
    print(f"{'PASS' if ok else 'OVER TARGET'}: {wall:.1f} s wall, {cpu_s:.1f} s CPU (target {TARGET_S:.0f} s), "
          f"peak RSS {peak_gb:.2f} GiB (target {TARGET_GB:.0f}); results in {args.out}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ph = {k: v for k, v in meta["timings_s"].items() if k != "total"}
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.barh(list(ph), list(ph.values()))
        ax.set_xlabel("seconds")
        ax.set_title(f"partition rmat{args.scale} into {args.parts} ({args.method}): {wall:.0f} s, "
                     f"{peak_gb:.1f} GiB")
        fig.tight_layout()
        fig.savefig(args.out.with_suffix(".png"), dpi=100)
    except ImportError:
        pass
    if not args.keep:
        import shutil

        shutil.rmtree(out_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
