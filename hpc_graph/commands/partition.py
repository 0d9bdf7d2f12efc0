"""``hpc-graph partition SRC.h5 -o DIR -n P``: split a dataset file into P parts (METIS or random).

    hpc-graph partition rmat20.h5 -o rmat20-4 -n 4 --method metis

Prints the statistics (edge cut, replication factor, balance, per-part table);
``--json`` prints ``partition.json`` instead. Progress goes to the log.

``--distributed`` partitions with every MPI rank of the launch taking part: each reads only its
slice of the graph, the graph is partitioned in parallel through the ParMETIS API (PT-Scotch's, found
at run time: docs/partitioning.md) and each part file is written by the rank that holds it; the
number of parts need not equal the number of ranks::

    mpiexec.openmpi -n 4 hpc-graph partition rmat22.h5 -o rmat22-8 -n 8 --distributed
"""
from __future__ import annotations

import argparse
import json

from hpc_graph.cli import CLIError, add_threads_option


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "partition", help="partition a dataset file into a partitioned dataset directory",
        description="Partition a dataset file (METIS with node and training-node balance, or random) "
                    "into DIR/partition.json + DIR/part-XXXXX.h5, relabelled so each part owns a "
                    "contiguous id range.")
    p.add_argument("src", metavar="SRC.h5", help="dataset file to partition")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="partition directory to write")
    p.add_argument("-n", "--num-parts", type=int, required=True, metavar="P",
                   help="number of parts (= MPI ranks that will train on it)")
    p.add_argument("--method", choices=("metis", "random"), default="metis",
                   help="partitioner (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="METIS / random seed (default: %(default)s)")
    p.add_argument("--balance-edges", action="store_true",
                   help="METIS: also balance in-edges per part (even work and graph memory per rank on "
                        "power-law graphs, at the cost of a larger edge cut)")
    p.add_argument("--distributed", action="store_true",
                   help="partition with all MPI ranks of this launch (each reads a slice; ParMETIS API for "
                        "--method metis; run under mpiexec, see docs/partitioning.md)")
    p.add_argument("--imbalance", type=float, default=1.05, metavar="X",
                   help="--distributed: allowed max/mean nodes and training nodes per part (default: %(default)s)")
    p.add_argument("--coarsen-to", type=int, default=None, metavar="N",
                   help="--distributed --method metis: coarsen the graph in parallel (label propagation) to at "
                        "most N nodes before the ParMETIS API partitions it, then refine (default: 20000; 0: "
                        "the library partitions the whole graph)")
    p.add_argument("--force", action="store_true",
                   help="replace DIR if it exists, and skip the check that the job fits in memory")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    add_threads_option(p)
    p.set_defaults(func=run)


def format_partition_stats(meta: dict) -> str:
    """Text table of the statistics stored in ``partition.json``."""
    b = meta["balance"]
    lines = [
        f"{meta['name']}: {meta['global_num_nodes']} nodes, {meta['global_num_edges']} edges -> "
        f"{meta['num_parts']} parts ({meta['method']}{', edges balanced' if meta.get('balance_edges') else ''}, "
        f"seed {meta['seed']})",
        f"edge cut {meta['edge_cut']} ({100 * meta['edge_cut_fraction']:.2f}% of edges), "
        f"replication factor {meta['replication_factor']:.4f} (halo / owned)",
        f"balance (max/mean): nodes {b['nodes']:.4f}, edges {b['edges']:.4f}, train nodes {b['train']:.4f}",
        f"{'part':>5} {'nodes':>11} {'edges':>13} {'halo':>11} {'send':>11} {'train':>10} "
        f"{'cut edges':>12} {'repl':>7}",
    ]
    for e in meta["parts"]:
        lines.append(f"{e['part_id']:>5} {e['num_nodes']:>11} {e['num_edges']:>13} {e['num_halo']:>11} "
                     f"{e.get('num_send', 0):>11} {e['num_train']:>10} {e.get('cut_edges', 0):>12} "
                     f"{e.get('replication', 0.0):>7.3f}")
    t = meta.get("timings_s")
    if t:
        lines.append("time (s): " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from data_io.partitioner import partition_dataset

    if args.num_parts < 1:
        raise CLIError(f"--num-parts: must be >= 1, got {args.num_parts}")
    if args.balance_edges and args.method != "metis":
        raise CLIError(f"--balance-edges: only with --method metis, not {args.method}")
    if args.coarsen_to is not None and not args.distributed:
        raise CLIError("--coarsen-to: only with --distributed (the serial path runs METIS on the whole graph)")
    if args.distributed:
        return _run_distributed(args)
    meta = partition_dataset(args.src, args.output, args.num_parts, method=args.method, seed=args.seed,
                             force=args.force, balance_edges=args.balance_edges)
    if args.json:
        print(json.dumps(meta, indent=1))
    else:
        print(f"{args.output}:")
        print(format_partition_stats(meta))
    return 0


def _run_distributed(args: argparse.Namespace) -> int:
    if args.balance_edges:
        raise CLIError("--balance-edges: not available with --distributed (the ParMETIS API of PT-Scotch "
                       "honours one balance constraint); use the serial path")
    if not 1.0 < args.imbalance < 2.0:
        raise CLIError(f"--imbalance: expected a number in (1, 2), got {args.imbalance}")
    if args.coarsen_to is not None and args.coarsen_to < 0:
        raise CLIError(f"--coarsen-to: expected a node count >= 0, got {args.coarsen_to}")
    from mpi4py import MPI

    from data_io.dist_partitioner import partition_distributed

    comm = MPI.COMM_WORLD
    meta = partition_distributed(args.src, args.output, args.num_parts, comm, method=args.method, seed=args.seed,
                                 force=args.force, imbalance=args.imbalance, coarsen_to=args.coarsen_to)
    if comm.rank == 0:
        if args.json:
            print(json.dumps(meta, indent=1))
        else:
            d = meta["distributed"]
            print(f"{args.output}: partitioned on {d['ranks']} rank(s)"
                  + (f" with {d['library']}" if d["library"] else ""))
            print(format_partition_stats(meta))
            print("peak memory per rank (MB): " + ", ".join(f"{x:.0f}" for x in d["peak_rss_mb_per_rank"]))
    return 0
