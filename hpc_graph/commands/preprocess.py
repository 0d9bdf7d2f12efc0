"""``hpc-graph preprocess lap-pe FILE``: add derived per-node fields to a dataset file.

``lap-pe`` writes ``/node/lap_pe`` (float32[N, k]), the Laplacian eigenvector positional
encodings of the ``gt`` graph transformer (``model.pe_dim`` of them are used).
"""
from __future__ import annotations

import time

from hpc_graph.cli import CLIError, add_threads_option


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("preprocess", help="add derived fields (positional encodings) to a dataset file",
                              description="Compute a derived per-node field and store it in the dataset file "
                                          "(all or nothing: a failure leaves the file unchanged).")
    sub = p.add_subparsers(dest="step", metavar="STEP")
    sub.required = True
    lp = sub.add_parser("lap-pe", help="Laplacian eigenvector positional encodings -> /node/lap_pe",
                        description="The k eigenvectors of the normalised Laplacian (graph made undirected) "
                                    "with the smallest non-trivial eigenvalues, as /node/lap_pe float32[N, k].")
    lp.add_argument("path", metavar="FILE", help="dataset file (.h5), modified in place")
    lp.add_argument("--k", type=int, default=8, help="eigenvectors to keep (default: 8)")
    lp.add_argument("--seed", type=int, default=0, help="ARPACK start vector seed (default: 0)")
    lp.add_argument("--force", action="store_true", help="replace an existing /node/lap_pe")
    add_threads_option(lp)
    p.set_defaults(func=run)


def run(args) -> int:
    from data_io.dataset import open_dataset
    from data_io.errors import FormatError
    from data_io.preprocess import add_node_field, laplacian_pe

    if args.k < 1:
        raise CLIError(f"--k: must be >= 1, got {args.k}")
    t0 = time.perf_counter()
    try:
        with open_dataset(args.path) as ds:
            if ds.has("lap_pe") and not args.force:
                raise CLIError(f"{args.path}: /node/lap_pe already present (use --force to replace it)")
            n = ds.num_nodes
            indptr, indices = ds.indptr(), ds.indices()
            graph_ptr = ds.graph_ptr() if ds.has("graph_ptr") else None
        per = f" ({len(graph_ptr) - 1} graphs, each on its own)" if graph_ptr is not None else ""
        print(f"[preprocess] {args.path}: Laplacian eigenvectors of {n} nodes{per}, k={args.k} ...", flush=True)
        pe = laplacian_pe(indptr, indices, n, args.k, seed=args.seed, graph_ptr=graph_ptr)
        add_node_field(args.path, "lap_pe", pe, force=args.force)
    except (FormatError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    print(f"[preprocess] wrote /node/lap_pe float32[{n}, {args.k}] in {time.perf_counter() - t0:.1f} s")
    return 0
