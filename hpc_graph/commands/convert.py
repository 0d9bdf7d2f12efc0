"""``hpc-graph convert {npz,edgelist,ogb,ogb-mag} SRC -o OUT.h5``: other graph formats to a dataset file.

Before reading the data, each converter estimates its peak memory from the source's sizes and
refuses (one line, exit status 2) when it exceeds the available memory (``HPC_GRAPH_MEMORY_LIMIT``
overrides what is available; ``--force`` skips the check).
"""
from __future__ import annotations

import argparse

from hpc_graph.cli import CLIError, add_threads_option


def _fractions(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three comma-separated fractions, got {text!r}") from None
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected three comma-separated fractions, got {text!r}")
    return parts  # type: ignore[return-value]


def _common(p: argparse.ArgumentParser, src_help: str) -> None:
    p.add_argument("src", metavar="SRC", help=src_help)
    p.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="dataset file to write")
    p.add_argument("--force", action="store_true",
                   help="overwrite OUT.h5 if it exists, and skip the memory check (start even when the "
                        "estimated peak memory exceeds the available memory)")
    p.add_argument("--name", default=None, help="dataset name (default: from SRC)")


def _graph_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--symmetrize", action="store_true", help="add v->u for every edge u->v")
    p.add_argument("--remove-self-loops", action="store_true", help="drop edges u->u")
    p.add_argument("--dedup", action="store_true", help="keep one copy of repeated edges")
    p.add_argument("--chunk-mb", type=float, default=8.0, help="MiB of text parsed per step (default 8)")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert npz / edge-list / OGB data to a dataset file",
        description="Convert a graph in another format to an hpc_graph dataset file (HDF5, format v1).")
    sub = parser.add_subparsers(dest="format", metavar="FORMAT")
    sub.required = True

    p = sub.add_parser("npz", help="NumPy .npz archive (edge_index, x, y, train/val/test_mask)")
    _common(p, "the .npz archive")
    add_threads_option(p)

    p = sub.add_parser("edgelist", help="SNAP-style edge list: 'src dst [weight]' per line, # or %% comments")
    _common(p, "the edge-list text file (.gz allowed)")
    add_threads_option(p)
    _graph_options(p)
    rel = p.add_mutually_exclusive_group()
    rel.add_argument("--relabel", dest="relabel", action="store_true", default=None,
                     help="compact the ids that occur to 0..N-1 (default: when ids are sparse)")
    rel.add_argument("--no-relabel", dest="relabel", action="store_false", help="keep ids as they are")
    p.add_argument("--num-nodes", type=int, default=None, help="number of nodes (default: max id + 1)")
    p.add_argument("--random-features", type=int, default=0, metavar="F",
                   help="attach F random float32 features per node")
    p.add_argument("--num-classes", type=int, default=0, metavar="C",
                   help="attach labels 0..C-1 (learnable from --random-features) and a random split")
    p.add_argument("--split", type=_fractions, default=(0.6, 0.2, 0.2), metavar="TRAIN,VAL,TEST",
                   help="fractions of nodes in the train/val/test masks (default 0.6,0.2,0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random features, labels and split")

    p = sub.add_parser("ogb", help="OGB node-property folder (raw/edge.csv.gz, raw/node-feat.csv.gz, ...)")
    _common(p, "the dataset folder holding raw/ and split/")
    add_threads_option(p)
    _graph_options(p)
    p.add_argument("--split", default=None, metavar="NAME", help="which split/<NAME> (default: the only one)")

    p = sub.add_parser("ogb-mag", help="OGB-MAG-style heterogeneous folder (raw/relations/*/edge.csv.gz, ...) "
                                       "to a graph with typed edges")
    _common(p, "the dataset folder holding raw/ and split/")
    add_threads_option(p)
    p.add_argument("--split", default=None, metavar="NAME", help="which split/<NAME> (default: the only one)")
    p.add_argument("--target", default=None, metavar="TYPE",
                   help="the labelled node type (default: the only one with raw/node-label/<TYPE>)")
    p.add_argument("--reverse", action=argparse.BooleanOptionalAction, default=True,
                   help="add each edge's reverse with its own edge type (default: on)")
    p.add_argument("--chunk-mb", type=float, default=8.0, help="MiB of text parsed per step (default 8)")

    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from data_io.converters import convert_edgelist, convert_npz, convert_ogb, convert_ogb_mag
    from data_io.dataset import open_dataset

    if args.format == "npz":
        out = convert_npz(args.src, args.output, force=args.force, name=args.name)
    elif args.format == "edgelist":
        if args.chunk_mb <= 0:
            raise CLIError("--chunk-mb: must be positive")
        out = convert_edgelist(
            args.src, args.output, force=args.force, name=args.name, symmetrize=args.symmetrize,
            remove_self_loops=args.remove_self_loops, dedup=args.dedup, relabel=args.relabel,
            num_nodes=args.num_nodes, random_features=args.random_features, num_classes=args.num_classes,
            split=args.split, seed=args.seed, chunk_bytes=int(args.chunk_mb * (1 << 20)))
    elif args.format == "ogb":
        if args.chunk_mb <= 0:
            raise CLIError("--chunk-mb: must be positive")
        out = convert_ogb(args.src, args.output, force=args.force, name=args.name, split=args.split,
                          symmetrize=args.symmetrize, remove_self_loops=args.remove_self_loops,
                          dedup=args.dedup, chunk_bytes=int(args.chunk_mb * (1 << 20)))
    elif args.format == "ogb-mag":
        if args.chunk_mb <= 0:
            raise CLIError("--chunk-mb: must be positive")
        out = convert_ogb_mag(args.src, args.output, force=args.force, name=args.name, split=args.split,
                              target=args.target, reverse=args.reverse, chunk_bytes=int(args.chunk_mb * (1 << 20)))
    else:  # pragma: no cover - argparse restricts the choices
        raise CLIError(f"unknown format {args.format!r}")
    with open_dataset(out, check_values=False) as ds:
        print(f"wrote {out}: {ds.num_nodes} nodes, {ds.num_edges} edges, {ds.feat_dim} features, "
              f"{ds.num_classes} classes, {'directed' if ds.directed else 'undirected'}")
    return 0
