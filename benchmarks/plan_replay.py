"""Replay saved ``hpc-graph plan`` predictions under another calibration model, against the measured runs.

    python benchmarks/plan_replay.py results/bench_plan.s39-all.json results/bench_plan.s40-s20.json \\
        --workdir results/bench_plan_work

``benchmarks/bench_plan.py`` keeps every plan's JSON (``WORKDIR/plan-sS-MODEL-ENGINE-P.json``, or
``replan-...`` when re-planned) and the measured epochs (its ``--out`` file). A plan made with the
multiplicative calibration of session 39 (``compute x factor``, the factor = a calibration run's epoch over
its predicted epoch, per thread count) records the factor, the calibration run's measured and predicted
epochs and the compute and communication terms; from those this script recomputes, without re-measuring
anything, the slowest rank's epoch under three models:

* ``factor``: as planned (compute x measured / predicted);
* ``none``: the kernels alone (compute / factor);
* ``overhead``: the kernels plus measured - predicted seconds (what ``plan`` does since session 40).

and prints, per scale, how many epochs are within 25 % of the measured ones and the median error.
Plans made after session 40 (``rates.step_overhead``) are skipped: they carry no factor to undo.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

CAL = re.compile(r"at (\d+) thread\(s\): epoch ([0-9.e+-]+) s over ([0-9.e+-]+) s")


def replay(plan: dict, engine: str) -> dict | None:
    """``{model: predicted epoch seconds}`` of one saved plan's ``engine`` row, or None (no factor recorded)."""
    factors = {int(k): float(v) for k, v in (plan["rates"].get("calibration_threads") or {}).items()}
    text = next((a for a in plan["assumptions"] if "calibration" in a), "")
    runs = {int(t): (float(m), float(p)) for t, m, p in CAL.findall(text)}
    if not factors or not runs:
        return None
    pred = next(p for p in plan["predictions"] if p["engine"] == engine)
    threads = pred["threads_per_rank"]
    # the factor measured nearest the rank's threads (log scale, ties to more threads), as session 39's planner
    near = min(factors, key=lambda k: (abs(math.log2(max(1, k)) - math.log2(max(1, threads))), -k))
    measured, predicted = runs[near]
    t = pred["time"]
    kernels = t["compute"] / factors[near]
    rest = t["epoch_seconds"] - t["compute"]
    return {"factor": t["epoch_seconds"], "none": kernels + rest, "overhead": kernels + measured - predicted + rest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="bench_plan.py --out files (measured runs)")
    ap.add_argument("--workdir", type=Path, required=True, help="bench_plan.py's --workdir (the plans' JSON)")
    args = ap.parse_args(argv)
    rows = []
    for path in args.results:
        for r in json.loads(path.read_text())["records"]:
            key = f"s{r['scale']}-{r['model']}-{r['engine']}-{r['ranks']}"
            plan_path = next((p for p in (args.workdir / f"replan-{key}.json", args.workdir / f"plan-{key}.json")
                              if p.exists()), None)
            if plan_path is None or not r.get("measured"):
                continue
            got = replay(json.loads(plan_path.read_text()), r["engine"])
            if got is not None:
                rows.append((r["scale"], key, r["measured"]["median_epoch_s"], got))
    if not rows:
        print("no plan with a recorded calibration factor found", file=sys.stderr)
        return 1
    print(f"{'model':<9} " + " ".join(f"{'scale ' + str(s):>24}" for s in sorted({r[0] for r in rows})) + f"{'all':>8}")
    for model in ("factor", "none", "overhead"):
        cells, total, count = [], 0, 0
        for scale in sorted({r[0] for r in rows}):
            errs = [100.0 * (got[model] / measured - 1.0) for s, _, measured, got in rows if s == scale]
            ok = sum(abs(e) <= 25.0 for e in errs)
            total, count = total + ok, count + len(errs)
            cells.append(f"{ok:>3}/{len(errs):<3} median {statistics.median(errs):+6.1f} %")
        print(f"{model:<9} " + " ".join(f"{c:>24}" for c in cells) + f"{f'{total}/{count}':>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
