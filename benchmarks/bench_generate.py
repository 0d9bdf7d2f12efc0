"""Benchmark: generate and write a Graph500 R-MAT dataset; wall time and peak RSS.

Runs ``hpc-graph generate rmat`` in a child process (after a tiny warm-up run
that fills the numba cache), measures the child's wall time and peak resident
set size (``getrusage(RUSAGE_CHILDREN).ru_maxrss``), prints one JSON object
and writes it to ``results/bench_generate.json``::

    python benchmarks/bench_generate.py                    # scale 20, edge factor 16, 128 features
    python benchmarks/bench_generate.py --scale 22 --workdir /scratch/me --keep  # keep the .h5

Targets (scale 20 / EF 16 / 128 features): <= 60 s and <= 3 GB peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_SECONDS = 60.0
TARGET_RSS_BYTES = 3 << 30


def _child(cmd: list[str]) -> tuple[float, int, str]:
    """Run ``cmd``; return (wall seconds, peak RSS bytes of the largest child so far, stdout)."""
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.stderr.write(res.stdout + res.stderr)
        raise SystemExit(f"bench_generate: command failed with status {res.returncode}: {' '.join(cmd)}")
    # ru_maxrss (KiB on Linux) is the maximum over all finished children; the warm-up is tiny
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, peak_kb * 1024, res.stdout.strip()


def _summary_seconds(summary: str) -> float | None:
    """Seconds from the command's summary line ('..., 12.3 s'), or None."""
    try:
        return float(summary.rsplit(",", 1)[1].split()[0])
    except (IndexError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=int, default=20)
    p.add_argument("--edge-factor", type=int, default=16)
    p.add_argument("--feat-dim", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", default=None, help="folder for the .h5 file (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the generated file")
    p.add_argument("--json", default=str(REPO / "results" / "bench_generate.json"), help="JSON output path")
    args = p.parse_args(argv)

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_generate_"))
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"rmat-s{args.scale}-ef{args.edge_factor}.h5"
    cli = [sys.executable, "-m", "hpc_graph.cli", "-q", "generate", "rmat"]
    try:
        # warm-up: compile / load the numba kernels once, so the measurement is the steady state
        warm_s, _, _ = _child(cli + ["-o", str(work / "warmup.h5"), "--scale", "6", "--force"])
        (work / "warmup.h5").unlink()
        load_before = os.getloadavg()
        wall, rss, summary = _child(cli + ["-o", str(out), "--scale", str(args.scale), "--edge-factor",
                                           str(args.edge_factor), "--feat-dim", str(args.feat_dim),
                                           "--seed", str(args.seed), "--force"])
        load_after = os.getloadavg()
        sys.path.insert(0, str(REPO))
        from data_io.dataset import open_dataset
        with open_dataset(out, check_values=False) as ds:
            nodes, edges = ds.num_nodes, ds.num_edges
        size = out.stat().st_size
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        elif not args.keep:
            out.unlink(missing_ok=True)

    result = {
        "benchmark": "generate_rmat",
        "scale": args.scale, "edge_factor": args.edge_factor, "feat_dim": args.feat_dim, "seed": args.seed,
        "num_nodes": nodes, "num_edges": edges, "file_bytes": size,
        # wall_s: the whole child (interpreter start, CLI import, generation, write);
        # generate_s: generation + write as timed inside the command (its summary line)
        "wall_s": round(wall, 2), "generate_s": _summary_seconds(summary), "peak_rss_bytes": rss,
        "peak_rss_gib": round(rss / 2**30, 3),
        "warmup_s": round(warm_s, 2),
        "loadavg_1min_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "cpus": os.cpu_count(), "numba_threads": os.environ.get("NUMBA_NUM_THREADS"),
        "host": platform.node(), "python": platform.python_version(),
        "summary": summary,
    }
    if (args.scale, args.edge_factor, args.feat_dim) == (20, 16, 128):
        result["meets_target"] = wall <= TARGET_SECONDS and rss <= TARGET_RSS_BYTES
    json_path = Path(args.json)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
