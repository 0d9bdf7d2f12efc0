#!/usr/bin/env python
"""What the checksums cost: writing an R-MAT dataset file and loading it back, with and without them, and the
non-finite scan of the features at load.

Each measurement runs in a fresh process; the two variants alternate, ``--rounds`` times each, and every
cell is the median with the spread (max - min) / median of the repeats beside it. "Without" is the writer as
it was before the checksums: no Fletcher32 filter (features chunked by rows all the same, the rest
contiguous) and no digests.

Usage: ``python benchmarks/checksum_cost.py [--scale 20] [--rounds 3]
[--out benchmarks/measured/scripts/checksums.json]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
what, variant, path, scale = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
import numpy as np
import data_io.dataset as dataset
if variant == "without":  # the writer before checksums: plain datasets, no digests
    def plain(h5, name, *, data=None, shape=None, dtype=None, chunks=None, **kw):
        if chunks is not None and h5py.check_string_dtype(np.dtype(dtype or data.dtype)) is None:
            kw["chunks"] = chunks
        return h5.create_dataset(name, data=data, shape=shape, dtype=dtype, **kw)
    import h5py
    dataset.create_dataset = plain
    dataset.seal = lambda h5: ""
out = {}
if what == "write":
    from data_io.generators.rmat import write_rmat
    t = time.perf_counter()
    write_rmat(path, scale, 16, seed=0, force=True)
    out["seconds"] = time.perf_counter() - t
else:
    t = time.perf_counter()
    with dataset.open_dataset(path, check_values=False) as ds:
        ds.indptr(); ds.indices(); ds.label()
        raw = ds.feat[...]  # read alone: HDF5's work, Fletcher32 included
        t_read = time.perf_counter()
        dataset.check_finite(raw, path, "/node/feat")
        t_scan = time.perf_counter()
    out["seconds"] = t_read - t
    out["scan_seconds"] = t_scan - t_read
    out["feat_bytes"] = int(raw.nbytes)
print(json.dumps(out))
"""


def run(what: str, variant: str, path: Path, scale: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(REPO), what, variant, str(path), str(scale)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{what} {variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cell(values: list[float]) -> dict:
    med = statistics.median(values)
    return {"median": round(med, 3), "spread": round((max(values) - min(values)) / med, 3) if med else 0.0,
            "runs": [round(v, 3) for v in values]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "measured" / "scripts" / "checksums.json"))
    ap.add_argument("--work", default=None, help="folder for the two files (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="hpc-graph-checksums-"))
    work.mkdir(parents=True, exist_ok=True)
    files = {v: work / f"rmat{args.scale}-{v}.h5" for v in ("with", "without")}
    res: dict[str, dict[str, list[float]]] = {v: {"write": [], "load": [], "scan": []} for v in files}
    feat_bytes = 0
    for r in range(args.rounds):
        for v, f in files.items():
            res[v]["write"].append(run("write", v, f, args.scale)["seconds"])
            print(f"round {r + 1}: write {v}: {res[v]['write'][-1]:.2f} s", file=sys.stderr, flush=True)
    for r in range(args.rounds):
        for v, f in files.items():
            got = run("load", v, f, args.scale)
            res[v]["load"].append(got["seconds"])
            res[v]["scan"].append(got["scan_seconds"])
            feat_bytes = got["feat_bytes"]
            print(f"round {r + 1}: load {v}: {got['seconds']:.2f} s (scan {got['scan_seconds']:.3f} s)",
                  file=sys.stderr, flush=True)
    out = {"scale": args.scale, "rounds": args.rounds, "feat_bytes": feat_bytes,
           "file_bytes": {v: f.stat().st_size for v, f in files.items()},
           **{v: {k: cell(x) for k, x in m.items()} for v, m in res.items()}}
    for k in ("write", "load"):
        out[f"{k}_ratio"] = round(out["with"][k]["median"] / out["without"][k]["median"], 3)
    if args.work is None:
        for f in files.values():
            f.unlink(missing_ok=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("write_ratio", "load_ratio")}), json.dumps(out["with"]["scan"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
