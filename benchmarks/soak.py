#!/usr/bin/env python
"""Soak: random SIGTERM / SIGKILL / resume cycles across engines until a deadline; every run that reaches its
last epoch must end with the weights of an uninterrupted run, bit for bit.

For each engine an uninterrupted reference run (float64, dropout on, a checkpoint every epoch) is made once.
Then, until ``--minutes`` have passed: pick an engine, start its job afresh (``--resume-if-possible``, as the
job scripts do), and at a random moment either let it finish, send SIGTERM to every process (a preemption:
exit 75, a checkpoint) or SIGKILL one rank (a lost node: no checkpoint of that epoch); resubmit the same
command until the job exits 0; compare the final checkpoint's weights with the reference's.

Usage: ``python benchmarks/soak.py --minutes 60 [--seed 0] [--out benchmarks/measured/scripts/soak.json]``;
each cycle is one line on stderr, the summary JSON is written at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ENGINES = {  # engine: (ranks, extra config)
    "dp": (2, {}),
    "sar": (2, {}),
    "sylvie": (2, {"engine": {"name": "sylvie", "bits": "auto", "pipeline": "on"}}),
    "minibatch": (2, {"sampler": {"fanouts": [5, 5], "batch_size": 32}}),
    "apt": (2, {"sampler": {"fanouts": [5, 5], "batch_size": 32}, "engine": {"name": "apt", "strategy": "gdp"}}),
    "flow": (2, {"model": {"name": "gcn", "hidden": 16, "num_layers": 4, "dropout": 0.5}}),
    "single": (1, {}),
}
EPOCHS = 40


def prepare(work: Path) -> None:
    from data_io.generators.csbm import write_csbm
    from data_io.partitioner import partition_dataset

    write_csbm(work / "g.h5", num_nodes=600, num_classes=3, avg_degree=6.0, feat_dim=32, seed=11)
    partition_dataset(work / "g.h5", work / "p2", 2, method="random")


def config(work: Path, engine: str) -> Path:
    import yaml

    ranks, extra = ENGINES[engine]
    data = work / ("g.h5" if engine in ("single", "flow") else "p2")
    cfg = {"data": {"path": str(data)}, "engine": {"name": engine},
           "model": {"name": "sage", "hidden": 16, "dropout": 0.5},
           "optim": {"lr": 0.02},
           "train": {"epochs": EPOCHS, "seed": 5, "dtype": "float64", "progress": False, "eval_every": 5,
                     "checkpoint_every": 1}}
    for k, v in extra.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    path = work / f"cfg-{engine}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(cfg: Path, run_dir: Path, ranks: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", str(cfg), "--run-dir", str(run_dir),
           "--resume-if-possible"]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks)] + cmd
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)


def weights(run_dir: Path) -> dict:
    from hpc_graph.train import checkpoint as ckpt

    found = ckpt.list_checkpoints(run_dir)
    epoch, path = found[-1]
    return {"epoch": epoch, "model": ckpt.load_checkpoint(path)["model"]}


def same(a: dict, b: dict) -> bool:
    import torch

    return a["epoch"] == b["epoch"] and a["model"].keys() == b["model"].keys() and all(
        torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "measured" / "scripts" / "soak.json"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    engines = args.engines.split(",")
    work = Path(tempfile.mkdtemp(prefix="hpc-graph-soak-"))
    summary = {"minutes": args.minutes, "seed": args.seed, "jobs": 0, "launches": 0, "sigterm": 0, "sigkill": 0,
               "exit_codes": {}, "equal": 0, "different": [], "failed": [], "per_engine": {}}
    try:
        prepare(work)
        refs = {}
        for e in engines:
            cfg = config(work, e)
            proc = start(cfg, work / f"ref-{e}", ENGINES[e][0])
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"reference run of {e} failed ({proc.returncode}):\n{err[-2000:]}")
            refs[e] = weights(work / f"ref-{e}")
        deadline = time.time() + 60 * args.minutes
        job = 0
        while time.time() < deadline:
            e = rng.choice(engines)
            job += 1
            run_dir = work / f"job-{job}"
            launches, faults = 0, []
            while True:
                launches += 1
                proc = start(work / f"cfg-{e}.yaml", run_dir, ENGINES[e][0])
                action = rng.choice(["none", "sigterm", "sigkill", "sigkill", "sigterm"])
                if action != "none":
                    t = time.time() + rng.uniform(1.0, 9.0)
                    while time.time() < t and proc.poll() is None:
                        time.sleep(0.02)
                    if proc.poll() is None:
                        if action == "sigterm":
                            os.killpg(proc.pid, signal.SIGTERM)
                        else:
                            pids = sorted((run_dir / "pids").glob("rank*")) if (run_dir / "pids").is_dir() else []
                            try:
                                target = int(rng.choice(pids).read_text()) if pids else proc.pid
                                os.kill(target, signal.SIGKILL)
                            except (ValueError, OSError):
                                os.killpg(proc.pid, signal.SIGKILL)
                        faults.append(action)
                        summary[action] += 1
                try:
                    _, err = proc.communicate(timeout=300)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    summary["failed"].append({"job": job, "engine": e, "why": "hang (300 s)"})
                    break
                finally:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                rc = proc.returncode
                summary["exit_codes"][str(rc)] = summary["exit_codes"].get(str(rc), 0) + 1
                if rc == 0:
                    break
                if rc not in (75, 9, -9, 137, 143, 1) or launches > 40:
                    summary["failed"].append({"job": job, "engine": e, "rc": rc, "err": err[-500:]})
                    break
            summary["launches"] += launches
            summary["jobs"] += 1
            pe = summary["per_engine"].setdefault(e, {"jobs": 0, "equal": 0})
            pe["jobs"] += 1
            ok = rc == 0 and same(weights(run_dir), refs[e])
            if ok:
                summary["equal"] += 1
                pe["equal"] += 1
            elif rc == 0:
                summary["different"].append({"job": job, "engine": e, "faults": faults})
            print(f"job {job} {e}: {launches} launch(es), faults {faults or '-'}: rc {rc}, "
                  f"{'equal' if ok else 'DIFFERENT' if rc == 0 else 'FAILED'}", file=sys.stderr,
                  flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("jobs", "launches", "sigterm", "sigkill", "equal", "exit_codes")}))
    return 0 if not summary["different"] and not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
