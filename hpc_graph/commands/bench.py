"""``hpc-graph bench KIND``: benchmarks writing JSON Lines records and a PNG plot.

    hpc-graph bench kernels --scale 20 --feat 128 --json results/kernels.jsonl --plot results/kernels.png
    hpc-graph bench kernels --scale 18 --ops sage gat --threads 8

Kinds are registered in :data:`KINDS` (name -> (add_arguments, run)); later
benchmark kinds add an entry. Prints a summary (speed-ups, memory ratios);
progress goes to the log. ``--threads`` sets the torch and numba threads
(default: ``NUMBA_NUM_THREADS``, else ``OMP_NUM_THREADS``, else all CPUs of
the process's affinity mask).
"""
from __future__ import annotations

import argparse
import time


def _add_kernels(p: argparse.ArgumentParser) -> None:
    from hpc_graph.bench import KERNEL_OPS as OPS

    p.add_argument("--scale", type=int, default=20, help="R-MAT scale: 2**scale nodes (default: %(default)s)")
    p.add_argument("--feat", type=int, default=128, help="feature width F (default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="GAT heads, must divide F (default: %(default)s)")
    p.add_argument("--edge-factor", type=int, default=16, help="R-MAT edges per node (default: %(default)s)")
    p.add_argument("--symmetrize", action=argparse.BooleanOptionalAction, default=False,
                   help="add reverse edges (default: off, a directed graph)")
    p.add_argument("--ops", nargs="+", default=None, metavar="OP",
                   help=f"measurements to run, from: {' '.join(OPS)} (default: all but attention on the CPU, "
                        "all but locality and compile with --device cuda)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="run on the CPU or on the current GPU (default: %(default)s)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[65536, 262144, 1048576], metavar="S",
                   help="sequence lengths of the attention measurement (default: %(default)s)")
    p.add_argument("--grad", choices=["both", "off", "on"], default="both",
                   help="input features requiring grad: off (first layer), on (hidden layer), both (default)")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per measurement, median reported "
                                                         "(default: %(default)s)")
    p.add_argument("--memory-fraction", type=float, default=0.6,
                   help="skip a baseline needing more than this share of available RAM (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="graph and feature seed (default: %(default)s)")
    p.add_argument("--json", metavar="OUT", help="write one JSON record per measurement (JSON Lines)")
    p.add_argument("--plot", metavar="OUT.png", help="write a bar plot of times and peak memory")
    p.add_argument("--force", action="store_true", help="overwrite existing --json/--plot outputs")
    from hpc_graph.cli import add_threads_option

    add_threads_option(p)


def _run_kernels(args: argparse.Namespace) -> int:
    from data_io.errors import DataError, check_output
    from hpc_graph.bench.kernels import (DEFAULT_OPS, KernelBenchConfig, run_kernel_bench, summarize, write_json,
                                         write_plot)

    from hpc_graph.comm.threads import current_plan

    grad = {"both": (False, True), "off": (False,), "on": (True,)}[args.grad]
    cfg = KernelBenchConfig(scale=args.scale, feat=args.feat, heads=args.heads, edge_factor=args.edge_factor,
                            symmetrize=args.symmetrize, repeat=args.repeat, threads=current_plan().threads,
                            ops=tuple(args.ops) if args.ops else DEFAULT_OPS[args.device], grad=grad,
                            memory_fraction=args.memory_fraction, seed=args.seed, device=args.device,
                            seq_lens=tuple(args.seq_lens))
    try:
        cfg.validate()
    except ValueError as exc:
        raise DataError(str(exc)) from None
    for path in (args.json, args.plot):  # fail before hours of benchmarking, not after
        if path:
            check_output(path, args.force)
    t0 = time.perf_counter()
    records = run_kernel_bench(cfg)
    if args.json:
        write_json(records, args.json, args.force)
    if args.plot:
        write_plot(records, args.plot, args.force)
    r0 = records[0] if records else {}
    print(f"bench kernels: R-MAT scale {cfg.scale} ({r0.get('num_nodes')} nodes, {r0.get('num_edges')} edges), "
          f"F={cfg.feat}, {r0.get('threads')} threads, device {r0.get('device')}, {time.perf_counter() - t0:.0f} s")
    for line in summarize(records):
        print(line)
    for path in (args.json, args.plot):
        if path:
            print(f"wrote {path}")
    return 0


def _add_suite(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite_args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments of benchmarks/run.py: run --quick|--full --out FILE, or render [--check]")


def _run_suite(args: argparse.Namespace) -> int:
    """``benchmarks/run.py`` of the clone this package runs from (the suite and its peers' scripts are not
    installed with the package)."""
    import subprocess
    import sys
    from pathlib import Path

    from hpc_graph.cli import CLIError

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
    if not script.is_file():
        raise CLIError(f"bench suite: {script} not found: the benchmark suite runs from a clone of the "
                       "repository (pip install -e .)")
    return subprocess.call([sys.executable, str(script), *args.suite_args])


#: benchmark kinds: name -> (add its arguments to a parser, run it)
KINDS = {
    "kernels": (_add_kernels, _run_kernels,
                "SpMM / SAGE / GAT kernels vs torch.sparse and PyG on an R-MAT graph"),
    "suite": (_add_suite, _run_suite,
              "the benchmark suite of docs/benchmarks.md (benchmarks/run.py: run --quick|--full, render)"),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark (kernels, suite)",
                                   description="Run a benchmark; records go to JSON Lines, plots to PNG.")
    kinds = parser.add_subparsers(dest="bench_kind", metavar="KIND")
    kinds.required = True
    for name, (add_args, _, help_text) in KINDS.items():
        p = kinds.add_parser(name, help=help_text, description=help_text)
        add_args(p)
        p.set_defaults(func=run)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return KINDS[args.bench_kind][1](args)
