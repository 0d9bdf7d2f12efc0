#!/usr/bin/env python
"""The fault matrix: every engine x every fault an operator meets, injected for real; the exit status, the
first error line and the seconds from the fault to the end of the job.

Faults (2 ranks; ``single`` on 1, where the per-rank faults do not apply):

* ``sigterm``: SIGTERM to every process mid-training (a batch system's preemption): 75, a checkpoint;
* ``sigterm_startup``: SIGTERM to every process while the job is starting: 75, nothing to resume;
* ``sigkill_rank``: SIGKILL to rank 1 mid-training: the job ends (non-zero) at once;
* ``sigstop_rank``: SIGSTOP to rank 1 mid-training, ``comm.timeout: 5``: 1 within the timeout;
* ``flip_byte``: one bit of a feature value flipped inside a chunk of the file rank 1 reads (the value stays
  finite): 2, the file and field named;
* ``nan_feature``: a NaN in the features rank 1 reads: 2, file, field and row named;
* ``run_dir_file``: ``--run-dir`` names a file: 2;
* ``diverge``: Adam at lr 1e6: 3;
* ``disk_full``: the run folder on a 1 MiB tmpfs that the first checkpoint overflows: 2 (needs root to
  mount; reported as not run otherwise).

Usage: ``python benchmarks/fault_matrix.py [--engines dp,sar] [--faults sigterm,flip_byte]
[--out benchmarks/measured/scripts/faults.json]``; prints the table as Markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ENGINES = ("single", "dp", "sar", "sylvie", "minibatch", "apt", "seqpar", "flow")
FAULTS = ("sigterm", "sigterm_startup", "sigkill_rank", "sigstop_rank", "flip_byte", "nan_feature",
          "run_dir_file", "diverge", "disk_full")
EXPECTED = {"sigterm": 75, "sigterm_startup": 75, "sigkill_rank": "non-zero", "sigstop_rank": 1, "flip_byte": 2,
            "nan_feature": 2, "run_dir_file": 2, "diverge": 3, "disk_full": 2}
FILE_ENGINES = ("single", "seqpar", "flow")  # read a dataset file; the others a partition directory
TIMEOUT = 5.0  # comm.timeout of the sigstop case


def prepare(work: Path) -> None:
    from data_io.generators.csbm import write_csbm
    from data_io.partitioner import partition_dataset

    write_csbm(work / "g.h5", num_nodes=600, num_classes=3, avg_degree=6.0, feat_dim=64, seed=7)
    partition_dataset(work / "g.h5", work / "p2", 2, method="random")


def config(work: Path, engine: str, data: Path, **train) -> Path:
    import yaml

    model = {"name": "gt", "hidden": 64, "heads": 2, "pe_dim": 0} if engine == "seqpar" else \
        {"name": "gcn", "hidden": 256}
    cfg = {"data": {"path": str(data)}, "engine": {"name": engine}, "model": model,
           "train": {"epochs": 100000, "progress": False, "eval_every": 1000, **train}}
    if engine in ("minibatch", "apt"):
        cfg["sampler"] = {"fanouts": [5, 5], "batch_size": 64}
    if engine == "flow":
        cfg["model"]["num_layers"] = 4
    path = work / f"cfg-{engine}-{len(list(work.glob('cfg-*')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def flip_low_byte(path: Path) -> None:
    import h5py

    with h5py.File(path, "r") as f:
        off = f["node/feat"].id.get_chunk_info(0).byte_offset + 4 * 5
    with open(path, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0x01]))


def launch(cfg: Path, run_dir: Path, ranks: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "train", "--config", str(cfg), "--run-dir", str(run_dir),
           *extra]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks)] + cmd
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def wait_training(run_dir: Path, proc: subprocess.Popen, rank: int, limit: float = 300) -> int | None:
    """The pid of ``rank`` once it trains (its pid file), after a second of training; None if the job ended."""
    f = run_dir / "pids" / f"rank{rank}"
    end = time.time() + limit
    while time.time() < end and proc.poll() is None:
        if f.is_file() and f.read_text().strip():
            time.sleep(1.0)
            return int(f.read_text())
        time.sleep(0.05)
    return None


def first_error(err: str) -> str:
    for line in err.splitlines():
        if "error" in line.lower() or "rank " in line or "preempted" in line or "diverged" in line:
            return line.strip()[:300]
    return (err.strip().splitlines() or [""])[-1][:300]


def case(work: Path, engine: str, fault: str) -> dict:
    ranks = 1 if engine == "single" else 2
    if fault in ("sigkill_rank", "sigstop_rank") and ranks == 1:
        return {"outcome": "n/a"}
    d = work / f"{engine}-{fault}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    data = work / ("g.h5" if engine in FILE_ENGINES else "p2")
    if fault in ("flip_byte", "nan_feature"):
        data = d / data.name
        (shutil.copy if data.suffix == ".h5" else shutil.copytree)(work / data.name, data)
        target = data if data.suffix == ".h5" else data / "part-00001.h5"
        if fault == "flip_byte":
            flip_low_byte(target)
        else:
            import h5py
            import numpy as np
            with h5py.File(target, "r+") as f:
                f["node/feat"][7, 3] = np.nan
    run_dir = d / "run"
    extra: list[str] = []
    train = {}
    if fault == "sigstop_rank":
        extra = ["--set", f"comm.timeout={TIMEOUT}"]
    if fault == "diverge":
        extra = ["--set", "optim.lr=1000000.0", "--set", "optim.name=adam"]
        train = {"epochs": 200}
    mounted = False
    if fault == "run_dir_file":
        run_dir.write_text("not a folder\n")
    if fault == "disk_full":
        train = {"checkpoint_every": 1}
        run_dir.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(run_dir)],
                          capture_output=True).returncode != 0:
            return {"outcome": "not run (mounting a tmpfs needs root)"}
        mounted = True
    cfg = config(d, engine, data, **train)
    t0 = time.time()
    proc = launch(cfg, run_dir, ranks, *extra)
    fault_at = t0
    try:
        if fault in ("sigterm", "sigkill_rank", "sigstop_rank"):
            pid = wait_training(run_dir, proc, 0 if fault == "sigterm" else 1)
            if pid is None:
                out, err = proc.communicate()
                return {"outcome": "job ended before training", "rc": proc.returncode, "line": first_error(err)}
            fault_at = time.time()
            if fault == "sigterm":
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGKILL if fault == "sigkill_rank" else signal.SIGSTOP)
        elif fault == "sigterm_startup":
            time.sleep(2.0)
            fault_at = time.time()
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return {"outcome": "HANG (killed after 240 s)", "line": first_error(err)}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a stopped rank must not outlive its job
        except ProcessLookupError:
            pass
        if mounted:
            subprocess.run(["umount", "-l", str(run_dir)], capture_output=True)
    seconds = time.time() - fault_at
    want = EXPECTED[fault]
    ok = proc.returncode != 0 if want == "non-zero" else proc.returncode == want
    if fault == "sigterm" and ok:
        ok = any((run_dir / "checkpoints").glob("ckpt-*.pt"))
    tb = "Traceback" in err and fault not in ("sigkill_rank",)
    return {"outcome": "ok" if ok and not tb else ("traceback" if tb else "unexpected"), "rc": proc.returncode,
            "expected": want, "seconds": round(seconds, 2), "line": first_error(err)}


def render(results: dict) -> str:
    faults = [f for f in FAULTS if any(f in r for r in results.values())]
    rows = ["| engine | " + " | ".join(f"`{f}` ({EXPECTED[f]})" for f in faults) + " |",
            "|---|" + "---|" * len(faults)]
    for engine, r in results.items():
        cells = []
        for f in faults:
            c = r.get(f)
            if c is None:
                cells.append("")
            elif "rc" not in c:
                cells.append(c["outcome"])
            else:
                mark = "" if c["outcome"] == "ok" else f" **{c['outcome']}**"
                cells.append(f"{c['rc']} in {c['seconds']:.1f} s{mark}")
        rows.append(f"| `{engine}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "measured" / "scripts" / "faults.json"))
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    args = ap.parse_args()
    engines, faults = args.engines.split(","), args.faults.split(",")
    bad = [x for x in engines if x not in ENGINES] + [x for x in faults if x not in FAULTS]
    if bad:
        ap.error(f"unknown engine or fault: {', '.join(bad)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="hpc-graph-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        prepare(work)
        results: dict[str, dict] = {}
        for engine in engines:
            results[engine] = {}
            for fault in faults:
                r = case(work, engine, fault)
                results[engine][fault] = r
                print(f"{engine:10s} {fault:16s} {r.get('outcome')}: rc {r.get('rc')} in {r.get('seconds')} s: "
                      f"{r.get('line', '')}", file=sys.stderr, flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
