"""Benchmark: time and memory per training epoch of GCNII-64 and APPNP-10 against PyG.

    python benchmarks/bench_models_speed.py run --out results/bench_models_speed.json
    python benchmarks/bench_models_speed.py run --models appnp-10 --frameworks ours pyg-sparse --epochs 5
    python benchmarks/bench_models_speed.py report results/bench_models_speed.json

Data: an R-MAT graph (default ``/tmp/speed/rmat18.h5``; written first if missing by
``python -m hpc_graph.cli generate rmat --scale 18 --edge-factor 16 --feat-dim 128
--num-classes 16``: 262,144 nodes, 7.6 M directed edges after symmetrising and
removing duplicates/self loops, 128 random features, 16 classes, 60 % training nodes).

Models (the same architecture on both sides):

* ``gcn2-64``: GCNII, 64 layers, hidden 64, alpha 0.1, theta (lambda) 0.5,
  dropout 0.6 (``hpc_graph.nn.GCNII``; PyG: ``Linear`` + 64 ``GCN2Conv`` with
  ``cached=True`` + ``Linear``, as ``bench_models.py``);
* ``gcn2-16``: the same with 16 layers (supplementary: at scale 18 PyG's GCNII-64 runs out
  of this machine's 23 GiB on both paths and is killed, so the ratios are also measured
  at a depth where PyG fits);
* ``appnp-10``: APPNP, 2-layer MLP hidden 64, dropout 0.5, K 10, alpha 0.1
  (``hpc_graph.nn.APPNP``; PyG: MLP + ``APPNP(10, 0.1, dropout=0, cached=True)``).

Frameworks, each run in its own process (one process each, never two at once):

* ``ours``: the ``single`` engine through the Python API (``hpc_graph.train.Trainer``
  with ``engine.name=single``, ``train.threads=--threads``); one epoch is
  ``Trainer.step()``: zero_grad, forward, CE over the training nodes, backward, Adam step;
* ``pyg``: torch_geometric 2.8 on ``edge_index`` (int64 [2, E]; gather/scatter message
  passing), run by ``.venv-pyg/bin/python`` (``benchmarks/setup_baselines.sh --pyg``);
* ``pyg-sparse``: the same PyG models on a ``torch_sparse.SparseTensor`` ``adj_t``
  (PyG's sparse-matrix path: fused SpMM, no E x F message tensor).

Both sides use ``--threads`` CPU threads (default 2: all cores of this machine),
Adam (lr 0.01, weight decay 5e-4), mean cross entropy over the training nodes,
training mode (dropout on). Per run: ``--warmup`` epochs (the first one also builds
cached structures: PyG's ``gcn_norm``, our transposed CSR), then ``--epochs`` timed
epochs; ``median_epoch_seconds`` is their median.

Memory (Linux ``/proc/self/status``, MiB): ``baseline_rss_mb`` = resident memory once the
data are loaded and the model and optimiser built (``VmRSS``, before the first epoch).
The high-water mark is reset (``/proc/self/clear_refs`` ``5``) before the warm-up and
again before the timed epochs: ``warmup_peak_rss_mb`` is the peak of the warm-up (one-time
work: our kernels' JIT/cache load and transposed CSR, PyG's ``gcn_norm``),
``peak_rss_mb`` the peak of the timed epochs (steady-state training, data included),
``training_mb = peak_rss_mb - baseline_rss_mb`` what steady-state training adds (saved
activations, gradients, Adam state, cached structures, transient buffers), and
``process_peak_rss_mb`` the peak of the whole process (loading, warm-up and timed epochs).
Every record carries the load average before and after the run.

Allocator: glibc serves blocks above its mmap threshold with fresh mappings that go
back to the OS when freed, but raises that threshold (up to 32 MiB) each time such a
block is freed, after which N x F temporaries come from the heap and their pages stay
resident. ``--malloc-mmap-threshold BYTES`` fixes the threshold
(``MALLOC_MMAP_THRESHOLD_``) for every framework's process alike; the default leaves
glibc's dynamic behaviour.

Targets: ours >= 2x faster than PyG and <= 0.5x its memory, per model.
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
PYG_PYTHON = REPO / ".venv-pyg" / "bin" / "python"
DEFAULT_DATA = Path("/tmp/speed/rmat18.h5")
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "OMP_WAIT_POLICY", "HPC_GRAPH_EXPORTED_THREADS")
MODELS: dict[str, dict] = {
    "gcn2-64": {"name": "gcn2", "num_layers": 64, "hidden": 64, "dropout": 0.6, "alpha": 0.1, "theta": 0.5},
    # supplementary: PyG's GCNII-64 does not fit in this machine's 23 GiB at scale 18 (killed, both paths)
    "gcn2-16": {"name": "gcn2", "num_layers": 16, "hidden": 64, "dropout": 0.6, "alpha": 0.1, "theta": 0.5},
    "appnp-10": {"name": "appnp", "num_layers": 2, "hidden": 64, "dropout": 0.5, "hops": 10, "alpha": 0.1},
}
FRAMEWORKS = ("ours", "pyg", "pyg-sparse")
LR, WEIGHT_DECAY = 0.01, 5e-4


# -- process-side helpers (both interpreters; stdlib only) -----------------------------------------
def _status_mb() -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of this process in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) / 1024.0  # kB
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _load_avg() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def _measure(step, warmup: int, epochs: int) -> dict:
    """Run ``step()`` ``warmup`` + ``epochs`` times; time the last ``epochs``; memory of each phase (MiB)."""
    import gc

    gc.collect()
    mem = _status_mb()
    baseline, setup_peak = mem["VmRSS"], mem["VmHWM"]
    _reset_peak()
    times = []
    warmup_peak = baseline
    for i in range(warmup + epochs):
        if i == warmup:  # steady state from here: high-water mark of the timed epochs only
            warmup_peak = _status_mb()["VmHWM"]
            _reset_peak()
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
        print(f"epoch {i + 1}/{warmup + epochs}: {dt:.3f} s{' (warm-up)' if i < warmup else ''}",
              file=sys.stderr, flush=True)
    peak = _status_mb()["VmHWM"]
    return {"median_epoch_seconds": statistics.median(times), "epoch_seconds": times,
            "baseline_rss_mb": baseline, "setup_peak_rss_mb": setup_peak, "warmup_peak_rss_mb": warmup_peak,
            "peak_rss_mb": peak, "training_mb": peak - baseline,
            "process_peak_rss_mb": max(setup_peak, warmup_peak, peak)}


# -- ours ------------------------------------------------------------------------------------------
def ours_main(model: str, data: str, threads: int, warmup: int, epochs: int, seed: int) -> dict:
    import torch

    from hpc_graph.train import Trainer
    from hpc_graph.train.config import config_from_dict

    cfg = config_from_dict({
        "data": {"path": data}, "engine": {"name": "single"}, "model": dict(MODELS[model]),
        "optim": {"name": "adam", "lr": LR, "weight_decay": WEIGHT_DECAY},
        "train": {"epochs": warmup + epochs, "seed": seed, "threads": threads, "progress": False,
                  "run_dir": os.path.join(os.path.dirname(data), f"run-{model}")}})
    trainer = Trainer(cfg)
    out = _measure(trainer.step, warmup, epochs)
    out.update({"num_parameters": sum(p.numel() for p in trainer.model.parameters()),
                "torch_threads": torch.get_num_threads(), "torch": torch.__version__})
    import numba
    out["numba_threads"] = numba.get_num_threads()
    return out


# -- PyG (runs inside .venv-pyg) -------------------------------------------------------------------
def _pyg_model(m: dict, f: int, c: int):
    import torch.nn.functional as F
    from torch import nn
    from torch_geometric.nn import APPNP, GCN2Conv

    class GCNII(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = m["dropout"]
            self.lin_in, self.lin_out = nn.Linear(f, m["hidden"]), nn.Linear(m["hidden"], c)
            self.convs = nn.ModuleList(GCN2Conv(m["hidden"], m["alpha"], m["theta"], layer=k + 1, cached=True)
                                       for k in range(m["num_layers"]))

        def forward(self, x, adj):
            h = h0 = F.relu(self.lin_in(F.dropout(x, self.p, self.training)))
            for conv in self.convs:
                h = F.relu(conv(F.dropout(h, self.p, self.training), h0, adj))
            return self.lin_out(F.dropout(h, self.p, self.training))

    class APPNPNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = m["dropout"]
            widths = [f] + [m["hidden"]] * (m["num_layers"] - 1) + [c]
            self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
            self.prop = APPNP(m["hops"], m["alpha"], dropout=0.0, cached=True)

        def forward(self, x, adj):
            for i, lin in enumerate(self.lins):
                x = lin(F.dropout(x, self.p, self.training))
                if i < len(self.lins) - 1:
                    x = F.relu(x)
            return self.prop(x, adj)

    return GCNII() if m["name"] == "gcn2" else APPNPNet()


def pyg_main(model: str, data: str, threads: int, warmup: int, epochs: int, seed: int, sparse: bool) -> dict:
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torch_geometric

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    with h5py.File(data, "r") as f:
        indptr = np.asarray(f["graph/indptr"][...], dtype=np.int64)
        src = torch.from_numpy(np.asarray(f["graph/indices"][...]).astype(np.int64))
        x = torch.from_numpy(np.asarray(f["node/feat"][...], dtype=np.float32))
        y = torch.from_numpy(np.asarray(f["node/label"][...], dtype=np.int64))
        train = torch.from_numpy(np.asarray(f["node/train_mask"][...], dtype=bool))
    n = indptr.shape[0] - 1
    dst = torch.repeat_interleave(torch.arange(n), torch.from_numpy(np.diff(indptr)))
    train_idx = (train & (y >= 0)).nonzero().squeeze(1)
    if sparse:
        from torch_sparse import SparseTensor

        # adj_t: row = destination, column = source (CSR over destinations, as stored)
        adj = SparseTensor(rowptr=torch.from_numpy(indptr), col=src, sparse_sizes=(n, n))
        del dst, src
    else:
        adj = torch.stack([src, dst])  # [2, E]: source, destination
        del dst, src
    net = _pyg_model(MODELS[model], x.shape[1], int(y.max()) + 1)
    opt = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    net.train()

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(net(x, adj)[train_idx], y[train_idx])
        loss.backward()
        opt.step()

    out = _measure(step, warmup, epochs)
    out.update({"num_parameters": sum(p.numel() for p in net.parameters()), "torch_threads": torch.get_num_threads(),
                "torch_geometric": torch_geometric.__version__, "torch": torch.__version__})
    return out


# -- driver ----------------------------------------------------------------------------------------
def _clean_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def ensure_data(path: Path) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "hpc_graph.cli", "-q", "generate", "rmat", "--scale", "18", "--edge-factor", "16",
           "--feat-dim", "128", "--num-classes", "16", "--seed", "0", "-o", str(path)]
    subprocess.run(cmd, check=True, cwd=REPO, env=_clean_env(2))


def _oom_kill_rss_mb(pid: int) -> float | None:
    """The anon-rss (MiB) the kernel log gives for an out-of-memory kill of ``pid``, if readable."""
    import re

    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    hits = re.findall(rf"Killed process {pid} .*?anon-rss:(\d+)kB", log)
    return int(hits[-1]) / 1024.0 if hits else None


def run_one(framework: str, model: str, args: argparse.Namespace) -> dict:
    python = sys.executable if framework == "ours" else str(PYG_PYTHON)
    cmd = [python, str(Path(__file__).resolve()), "_child", framework, model, str(args.data), str(args.threads),
           str(args.warmup), str(args.epochs), str(args.seed)]
    env = _clean_env(args.threads)
    if args.malloc_mmap_threshold:  # same allocator setting for every framework
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    if framework != "ours":
        env.pop("PYTHONPATH", None)
    load_before = _load_avg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        killed = _oom_kill_rss_mb(proc.pid) if proc.returncode == -9 else None
        raise RuntimeError(f"{framework} {model} failed ({proc.returncode})"
                           f"{f', OOM-killed at anon-rss {killed:.0f} MiB' if killed else ''}: {' '.join(cmd)}\n"
                           f"{stderr[-3000:]}")
    out = json.loads(stdout.strip().splitlines()[-1])
    return {**out, "framework": framework, "model": model, "threads": args.threads, "warmup": args.warmup,
            "epochs": args.epochs, "wall_seconds": wall, "load_before": load_before, "load_after": _load_avg(),
            "data": str(args.data), "malloc_mmap_threshold": args.malloc_mmap_threshold, "command": cmd}


def _save(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


def cmd_run(args: argparse.Namespace) -> int:
    if any(f != "ours" for f in args.frameworks) and not PYG_PYTHON.exists():
        print(f"{PYG_PYTHON} not found: run benchmarks/setup_baselines.sh --pyg", file=sys.stderr)
        return 2
    args.data = Path(args.data)
    ensure_data(args.data)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    for model in args.models:
        for fw in args.frameworks:
            key = f"{model}/{fw}"
            print(f"{key}: running (load {_load_avg()})", file=sys.stderr, flush=True)
            try:
                rec = run_one(fw, model, args)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # recorded, the other runs go on
                import re
                rss = re.search(r"OOM-killed at anon-rss (\d+) MiB", str(exc))
                results[key] = {"framework": fw, "model": model, "error": str(exc)[-2000:],
                                "killed": "(-9)" in str(exc), "oom_kill_rss_mb": float(rss.group(1)) if rss else None,
                                "threads": args.threads, "load_after": _load_avg()}
                _save(out, results)
                print(f"{key}: FAILED: {str(exc)[:300]}", file=sys.stderr, flush=True)
                continue
            results[key] = rec
            _save(out, results)
            print(f"{key}: {rec['median_epoch_seconds']:.3f} s/epoch, peak {rec['peak_rss_mb']:.0f} MiB, "
                  f"training {rec['training_mb']:.0f} MiB (load {rec['load_before']} -> {rec['load_after']})",
                  file=sys.stderr, flush=True)
    print(report(results))
    return 0


def report(results: dict) -> str:
    lines = ["| model | framework | median epoch (s) | peak RSS (MiB) | baseline RSS (MiB) | training mem (MiB) | "
             "process peak (MiB) | time vs PyG | peak vs PyG | training mem vs PyG | process peak vs PyG | "
             "load avg (before -> after) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        recs = {fw: results.get(f"{model}/{fw}") for fw in FRAMEWORKS}
        ours = recs["ours"]
        for fw in FRAMEWORKS:
            r = recs[fw]
            if r is None:
                continue
            if "error" in r:
                why = "failed"
                if r.get("killed"):
                    why = "killed (SIGKILL, out of memory: 23 GiB machine)"
                rss = r.get("oom_kill_rss_mb")
                ratio = ""
                if rss and ours is not None and "error" not in ours:
                    ratio = f"< {ours['process_peak_rss_mb'] / rss:.2f}x"
                lines.append(f"| {model} | {fw} | {why} | > {rss:.0f} at the kill | | | {'> %.0f' % rss} | | "
                             f"{ratio} | | {ratio} | {r.get('load_after')} |" if rss else
                             f"| {model} | {fw} | {why} | | | | | | | | | {r.get('load_after')} |")
                continue
            ratio = ["", "", "", ""]
            if fw != "ours" and ours is not None and "error" not in ours:
                ratio = [f"{r['median_epoch_seconds'] / ours['median_epoch_seconds']:.2f}x faster",
                         f"{ours['peak_rss_mb'] / r['peak_rss_mb']:.2f}x",
                         f"{ours['training_mb'] / r['training_mb']:.2f}x",
                         f"{ours['process_peak_rss_mb'] / r['process_peak_rss_mb']:.2f}x"]
            lines.append(f"| {model} | {fw} | {r['median_epoch_seconds']:.3f} | {r['peak_rss_mb']:.0f} | "
                         f"{r['baseline_rss_mb']:.0f} | {r['training_mb']:.0f} | {r['process_peak_rss_mb']:.0f} | "
                         f"{' | '.join(ratio)} | "
                         f"{r['load_before']} -> {r['load_after']} |")
    lines.append("")
    lines.append("Ratios are ours relative to that PyG row (targets: >= 2x faster, <= 0.5x memory).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        fw, model, data = argv[1], argv[2], argv[3]
        threads, warmup, epochs, seed = (int(v) for v in argv[4:8])
        if fw == "ours":
            out = ours_main(model, data, threads, warmup, epochs, seed)
        else:
            out = pyg_main(model, data, threads, warmup, epochs, seed, sparse=fw == "pyg-sparse")
        print(json.dumps(out))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure and merge into --out")
    r.add_argument("--data", default=str(DEFAULT_DATA), help="dataset file (generated if missing)")
    r.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    r.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    r.add_argument("--threads", type=int, default=2, help="CPU threads for both frameworks")
    r.add_argument("--warmup", type=int, default=1, help="untimed epochs first")
    r.add_argument("--epochs", type=int, default=3, help="timed epochs (median reported)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    r.add_argument("--malloc-mmap-threshold", type=int, default=0, metavar="BYTES",
                   help="set glibc's MALLOC_MMAP_THRESHOLD_ for every framework's process (0: leave glibc's "
                        "dynamic threshold, the default)")
    r.add_argument("--out", default=str(REPO / "results" / "bench_models_speed.json"))
    rp = sub.add_parser("report", help="markdown table of a results file")
    rp.add_argument("path")
    args = p.parse_args(argv)
    if args.cmd == "run":
        return cmd_run(args)
    print(report(json.loads(Path(args.path).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
