"""Memory of one training step vs depth: reversible RevGCN against the same network without reversibility.

    python benchmarks/bench_rev_memory.py run --out results/bench_rev_memory.json
    python benchmarks/bench_rev_memory.py plot --json results/bench_rev_memory.json --out docs/img/revgcn_memory.png

``run`` generates a CSBM graph (``hpc-graph generate csbm``, kept under
``--work``) unless it exists, then for every depth in ``--depths`` and both
models starts one child process (a fresh heap per measurement) that:

1. loads the graph with the ``single`` engine, builds
   ``RevGCN(F, hidden, C, num_layers=depth, groups, dropout, reversible)``
   (``reversible=False`` is the baseline: the same parameters and function, a
   residual deep GCN whose autograd keeps every block's activations);
2. runs one warm-up step (numba compilation, Adam state);
3. resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), notes the
   current RSS, runs one training step (forward, cross-entropy on the training
   nodes, backward, Adam step) counting what autograd saves (distinct storages,
   parameters included, through ``torch.autograd.graph.saved_tensors_hooks``)
   and reads the peak RSS (``VmHWM``): "peak RSS growth" = peak - RSS before.

Children run with ``MALLOC_MMAP_THRESHOLD_=131072`` so every tensor of 128 KiB
or more is its own mapping, returned to the system when freed: the warm-up's
freed activations do not hide the measured step's growth in glibc's heap.
torch and numba use one thread (``--threads``). Saved bytes are exact counts;
the RSS numbers depend on the allocator but not on other processes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2.0 ** 20


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _child(args: argparse.Namespace) -> int:
    import numba
    import torch
    from torch.nn import functional as F

    from hpc_graph.engines.single import SingleEngine
    from hpc_graph.nn.revgnn import RevGCN

    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    torch.manual_seed(0)
    eng = SingleEngine(args.data, None, torch.device("cpu"), torch.float32)
    graph, feat, label, train = eng.graph, eng.feat, eng.label, eng.masks["train"]
    model = RevGCN(eng.num_features, args.hidden, eng.num_classes, num_layers=args.depth, groups=args.groups,
                   dropout=args.dropout, reversible=args.reversible)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    def step(count: bool) -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if count:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(graph, feat)
        else:
            out = model(graph, feat)
        loss = F.cross_entropy(out[train], label[train])
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    model.train()
    step(False)  # warm-up: kernels compiled, optimizer state allocated
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    before = _status()["VmRSS"]
    seconds = step(True)
    peak = _status()["VmHWM"]
    print(json.dumps({"depth": args.depth, "reversible": args.reversible, "saved_bytes": sum(seen.values()),
                      "param_bytes": param_bytes, "rss_before_bytes": before, "peak_rss_bytes": peak,
                      "peak_rss_growth_bytes": peak - before, "step_seconds": seconds}))
    return 0


def _generate(args: argparse.Namespace) -> str:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"csbm-{args.nodes}-d{args.avg_degree:g}-f{args.feat_dim}.h5"
    if not path.exists():
        cmd = [sys.executable, "-m", "hpc_graph.cli", "generate", "csbm", "--num-nodes", str(args.nodes),
               "--avg-degree", str(args.avg_degree), "--feat-dim", str(args.feat_dim), "--seed", "0",
               "--threads", str(args.threads), "-o", str(path)]
        subprocess.run(cmd, check=True, cwd=ROOT)
    return str(path)


def _run(args: argparse.Namespace) -> int:
    data = _generate(args)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS=str(args.threads),
               NUMBA_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
    rows = []
    for depth in args.depths:
        for reversible in (True, False):
            cmd = [sys.executable, __file__, "_child", "--data", data, "--depth", str(depth), "--hidden",
                   str(args.hidden), "--groups", str(args.groups), "--dropout", str(args.dropout), "--threads",
                   str(args.threads)] + (["--reversible"] if reversible else [])
            res = subprocess.run(cmd, check=True, cwd=ROOT, env=env, capture_output=True, text=True)
            row = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"depth {depth:4d} {'RevGCN  ' if reversible else 'residual'}: saved "
                  f"{row['saved_bytes'] / MIB:9.1f} MiB, peak RSS growth {row['peak_rss_growth_bytes'] / MIB:9.1f} "
                  f"MiB, step {row['step_seconds']:.2f} s", flush=True)
    result = {"command": " ".join([Path(sys.executable).name] + sys.argv), "data": data, "nodes": args.nodes,
              "avg_degree": args.avg_degree, "feat_dim": args.feat_dim, "hidden": args.hidden,
              "groups": args.groups, "dropout": args.dropout, "threads": args.threads,
              "loadavg": os.getloadavg(), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
    tmp.replace(out)
    print(f"wrote {out} (load average {result['loadavg'][0]:.2f})")
    return 0


def _plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = json.loads(Path(args.json).read_text(encoding="utf-8"))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = {True: ("RevGCN (reversible)", "tab:blue"), False: ("residual GCN (reversible=False)", "tab:red")}
    for reversible, (label, color) in styles.items():
        rows = sorted((r for r in result["rows"] if r["reversible"] == reversible), key=lambda r: r["depth"])
        depth = [r["depth"] for r in rows]
        ax.plot(depth, [r["saved_bytes"] / MIB for r in rows], "o-", color=color, label=f"{label}: saved by autograd")
        ax.plot(depth, [r["peak_rss_growth_bytes"] / MIB for r in rows], "s--", color=color,
                label=f"{label}: peak RSS growth")
    ax.set_xscale("log", base=2)
    ax.set_xticks([r["depth"] for r in result["rows"] if r["reversible"]])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("layers (reversible blocks)")
    ax.set_ylabel("MiB per training step")
    ax.set_title(f"CSBM {result['nodes']} nodes, hidden {result['hidden']}, {result['groups']} groups, 1 thread")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="measure every depth, write JSON")
    run.add_argument("--out", default=str(ROOT / "results" / "bench_rev_memory.json"))
    run.add_argument("--work", default=str(ROOT / "results" / "bench_rev_memory_work"), help="generated graph here")
    run.add_argument("--nodes", type=int, default=30000)
    run.add_argument("--avg-degree", type=float, default=10.0)
    run.add_argument("--feat-dim", type=int, default=128)
    run.add_argument("--depths", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    run.add_argument("--hidden", type=int, default=64)
    run.add_argument("--groups", type=int, default=2)
    run.add_argument("--dropout", type=float, default=0.5)
    run.add_argument("--threads", type=int, default=1)
    plot = sub.add_parser("plot", help="draw the PNG from run's JSON")
    plot.add_argument("--json", default=str(ROOT / "results" / "bench_rev_memory.json"))
    plot.add_argument("--out", default=str(ROOT / "docs" / "img" / "revgcn_memory.png"))
    child = sub.add_parser("_child", help=argparse.SUPPRESS)
    child.add_argument("--data", required=True)
    child.add_argument("--depth", type=int, required=True)
    child.add_argument("--hidden", type=int, required=True)
    child.add_argument("--groups", type=int, required=True)
    child.add_argument("--dropout", type=float, required=True)
    child.add_argument("--threads", type=int, required=True)
    child.add_argument("--reversible", action="store_true")
    args = ap.parse_args(argv)
    return {"run": _run, "plot": _plot, "_child": _child}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
