"""``hpc-graph report RUN_DIR [RUN_DIR ...]``: summary and PNG plots of training runs.

    hpc-graph report runs/cora-dp4                       # text summary + runs/cora-dp4/report/*.png
    hpc-graph report runs/cora-dp4 --json --no-plots     # summary as JSON only
    hpc-graph report runs/dp1 runs/dp2 runs/dp4 --out results/scaling --labels dp1,dp2,dp4

One run: ``curves.png``, ``rank_time.png``, ``rank_memory.png``,
``bytes_per_epoch.png`` in ``RUN_DIR/report/`` (or ``--out``). Several runs:
``compare_curves.png`` and ``scaling.png`` in ``--out`` (required then).
"""
from __future__ import annotations

import argparse
import json

from hpc_graph.cli import CLIError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="summarise training runs and plot their metrics",
        description="Summarise the metrics of training runs (epochs, best val/test accuracy, epoch time, "
                    "compute vs communication, peak memory, bytes sent) and write PNG plots. With several "
                    "run directories, overlay their curves and plot epoch time and memory against ranks.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directory with metrics.jsonl or metrics.rank<R>.jsonl (+ summary.json)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="folder for the PNG plots (default: RUN_DIR/report for one run; "
                             "required for several)")
    parser.add_argument("--labels", metavar="A,B,...", default=None,
                        help="comma-separated run names for legends and tables (default: folder names)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="only the summary, no PNGs")
    parser.set_defaults(func=run)


def _labels(args: argparse.Namespace, runs) -> list[str]:
    if args.labels is not None:
        labels = [x.strip() for x in args.labels.split(",")]
        if len(labels) != len(runs) or not all(labels):
            raise CLIError(f"--labels: expected {len(runs)} non-empty comma-separated name(s), "
                           f"got {args.labels!r}")
        return labels
    names = [r.run_dir.resolve().name or str(r.run_dir) for r in runs]
    if len(set(names)) < len(names):  # same folder names: fall back to the paths as given
        names = [str(r.run_dir) for r in runs]
    return names


def run(args: argparse.Namespace) -> int:
    from hpc_graph.train.report import (format_comparison, format_summary, load_run, plot_compare, plot_run,
                                        summarize)

    runs = [load_run(d) for d in args.run_dirs]
    labels = _labels(args, runs)
    many = len(runs) > 1
    if many and args.plots and not args.out:
        raise CLIError("--out: required when comparing several runs (or use --no-plots)")
    plots = []
    if args.plots:
        try:
            if many:
                plots = plot_compare(runs, labels, args.out)
            else:
                plots = plot_run(runs[0], args.out or runs[0].run_dir / "report", label=labels[0])
        except ImportError as exc:
            raise CLIError(f"plots need matplotlib ({exc}); install it or use --no-plots") from None
    summaries = [summarize(r) for r in runs]
    if args.json:
        if many:
            doc = {"runs": [{"label": lab, **s} for lab, s in zip(labels, summaries)]}
        else:
            doc = {"label": labels[0], **summaries[0]}
        doc["plots"] = [str(p) for p in plots]
        print(json.dumps(doc, indent=2))
        return 0
    for s, lab in zip(summaries, labels):
        print("\n".join(format_summary(s, lab if args.labels is not None else None)))
    if many:
        print()
        print("\n".join(format_comparison(summaries, labels)))
    for p in plots:
        print(f"wrote {p}")
    return 0
