"""``hpc-graph generate {rmat,csbm,tag,reg3cc,pathspd}``: write a synthetic dataset file.

    hpc-graph generate rmat -o rmat20.h5 --scale 20 --edge-factor 16
    hpc-graph generate csbm -o csbm.h5 --num-nodes 100000 --homophily 0.9 --power-law 2.5
    hpc-graph generate tag -o tag.h5 --num-nodes 10000                # text-attributed (/node/text)
    hpc-graph generate reg3cc -o reg3cc.h5 --num-graphs 2000          # graph-level: one label per graph
    hpc-graph generate pathspd -o pathspd.h5 --num-graphs 2000 --max-dist 6

Prints one summary line (nodes, edges, seconds); progress goes to the log. Before anything is
allocated the generator's peak memory is estimated and the command refuses (one line, exit
status 2) when it exceeds the available memory (``HPC_GRAPH_MEMORY_LIMIT`` overrides what is
available; ``--force`` skips the check).
"""
from __future__ import annotations

import argparse
import time

from hpc_graph.cli import add_threads_option



def _add_common(p: argparse.ArgumentParser, feat_dim: int, num_classes: int) -> None:
    p.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="dataset file to write")
    p.add_argument("--force", action="store_true",
                   help="overwrite OUT.h5 if it exists, and skip the memory check "
                        "(start even when the estimated peak memory exceeds the available memory)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--feat-dim", type=int, default=feat_dim, help="feature width (default: %(default)s)")
    p.add_argument("--num-classes", type=int, default=num_classes,
                   help="number of label classes (default: %(default)s)")
    p.add_argument("--train-frac", type=float, default=0.6, help="training fraction (default: %(default)s)")
    p.add_argument("--val-frac", type=float, default=0.2, help="validation fraction (default: %(default)s)")
    p.add_argument("--test-frac", type=float, default=0.2, help="test fraction (default: %(default)s)")
    p.add_argument("--edge-types", type=int, default=0, metavar="R",
                   help="write /graph/edge_type with R relation types (0: untyped; default: %(default)s)")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate a synthetic dataset (rmat, csbm, tag, reg3cc, pathspd)",
                                   description="Generate a synthetic graph dataset file.")
    kinds = parser.add_subparsers(dest="generator", metavar="GENERATOR")
    kinds.required = True

    r = kinds.add_parser("rmat", help="Graph500 Kronecker (R-MAT) graph, random features and labels",
                         description="Graph500 Kronecker graph: 2**scale nodes, edge_factor * 2**scale "
                                     "generated edges, random features, labels and split.")
    r.add_argument("--scale", type=int, default=16, help="log2 of the node count, 1..40 (default: %(default)s)")
    r.add_argument("--edge-factor", type=int, default=16, help="edges per node (default: %(default)s)")
    r.add_argument("--a", type=float, default=0.57, help="R-MAT probability a (default: %(default)s)")
    r.add_argument("--b", type=float, default=0.19, help="R-MAT probability b (default: %(default)s)")
    r.add_argument("--c", type=float, default=0.19, help="R-MAT probability c (default: %(default)s)")
    r.add_argument("--symmetrize", action=argparse.BooleanOptionalAction, default=True,
                   help="add reverse edges: undirected graph (default: on)")
    r.add_argument("--remove-self-loops", action=argparse.BooleanOptionalAction, default=True,
                   help="drop self-loops (default: on)")
    r.add_argument("--remove-duplicates", action=argparse.BooleanOptionalAction, default=True,
                   help="drop duplicate edges (default: on)")
    _add_common(r, feat_dim=128, num_classes=16)
    add_threads_option(r)
    r.set_defaults(func=run)

    c = kinds.add_parser("csbm", help="contextual stochastic block model (node classification)",
                         description="Contextual SBM: class-homophilous graph with Gaussian class-mean "
                                     "features; optional power-law degrees.")
    c.add_argument("--num-nodes", type=int, default=10000, help="node count (default: %(default)s)")
    c.add_argument("--avg-degree", type=float, default=10.0, help="mean degree (default: %(default)s)")
    c.add_argument("--homophily", type=float, default=0.8,
                   help="fraction of edges inside a class, 0..1 (default: %(default)s)")
    c.add_argument("--snr", type=float, default=1.0,
                   help="class-mean norm vs unit noise; small = weak features (default: %(default)s)")
    c.add_argument("--power-law", type=float, default=None, metavar="EXPONENT",
                   help="degree-corrected: propensities from a power law with this exponent (> 2)")
    _add_common(c, feat_dim=128, num_classes=5)
    add_threads_option(c)
    c.set_defaults(func=run)

    tg = kinds.add_parser("tag", help="text-attributed graph: label = graph community x text topic",
                          description="Text-attributed graph (/node/text): each node's label is its graph "
                                      "community x the topic of its text; the bag-of-words features miss most "
                                      "topic words and the text names the community rarely, so text alone and "
                                      "structure alone stay well below both together.")
    tg.add_argument("--num-nodes", type=int, default=10000, help="node count (default: %(default)s)")
    tg.add_argument("--communities", type=int, default=4, help="graph communities, 1..8 (default: %(default)s)")
    tg.add_argument("--topics", type=int, default=5, help="text topics, 1..8 (default: %(default)s)")
    tg.add_argument("--avg-degree", type=float, default=10.0, help="mean degree (default: %(default)s)")
    tg.add_argument("--homophily", type=float, default=0.9,
                    help="fraction of edges inside a community (default: %(default)s)")
    tg.add_argument("--topic-words", type=int, default=4, help="topic words per text (default: %(default)s)")
    tg.add_argument("--words", type=int, default=14, help="words per text (default: %(default)s)")
    tg.add_argument("--topic-visible", type=float, default=0.2,
                    help="fraction of each topic's words in the bag-of-words features (default: %(default)s)")
    tg.add_argument("--community-mention", type=float, default=0.5,
                    help="probability a text names a community place word (default: %(default)s)")
    tg.add_argument("--community-signal", type=float, default=0.5,
                    help="probability a named community is the node's own (default: %(default)s)")

    g = kinds.add_parser("reg3cc", help="graph-level: one connected 3-regular graph vs two (structure only)",
                         description="REG3-CC: each graph is one connected random 3-regular graph (label 1) or "
                                     "two disjoint ones of half the size (label 0); constant features, so "
                                     "message passing without structural encodings is at chance.")
    g.add_argument("--num-graphs", type=int, default=2000, help="graphs (default: %(default)s)")
    g.add_argument("--min-nodes", type=int, default=16, help="smallest graph, a multiple of 4 (default: %(default)s)")
    g.add_argument("--max-nodes", type=int, default=32, help="largest graph, a multiple of 4 (default: %(default)s)")
    t = kinds.add_parser("pathspd", help="graph-level: distance between two marked nodes of a random tree",
                         description="PATH-SPD: random trees with two marked nodes; the label is their "
                                     "distance minus 1 (drawn uniformly from 1..max-dist).")
    t.add_argument("--num-graphs", type=int, default=2000, help="graphs (default: %(default)s)")
    t.add_argument("--min-nodes", type=int, default=8, help="smallest tree (default: %(default)s)")
    t.add_argument("--max-nodes", type=int, default=24, help="largest tree (default: %(default)s)")
    t.add_argument("--max-dist", type=int, default=6, help="largest distance = classes (default: %(default)s)")
    for sub in (tg, g, t):
        sub.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="dataset file to write")
        sub.add_argument("--force", action="store_true",
                         help="overwrite OUT.h5 if it exists, and skip the memory check "
                              "(start even when the estimated peak memory exceeds the available memory)")
        sub.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
        what = "nodes" if sub is tg else "graphs"
        sub.add_argument("--train-frac", type=float, default=0.6, help=f"training {what} (default: %(default)s)")
        sub.add_argument("--val-frac", type=float, default=0.2, help=f"validation {what} (default: %(default)s)")
        sub.add_argument("--test-frac", type=float, default=0.2, help=f"test {what} (default: %(default)s)")
        add_threads_option(sub)
        sub.set_defaults(func=run)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from data_io.errors import DataError
    from data_io.generators import GeneratorParamError, write_csbm, write_graph_task, write_rmat, write_tag

    if args.generator == "tag":
        t0 = time.perf_counter()
        try:
            info = write_tag(args.output, args.num_nodes, args.communities, args.topics, avg_degree=args.avg_degree,
                             homophily=args.homophily, topic_words=args.topic_words, words=args.words,
                             topic_visible=args.topic_visible, community_mention=args.community_mention,
                             community_signal=args.community_signal, train_frac=args.train_frac,
                             val_frac=args.val_frac, test_frac=args.test_frac, seed=args.seed, force=args.force)
        except GeneratorParamError as exc:
            raise DataError(f"--{exc.param.replace('_', '-')}: {exc.message}") from None
        print(f"{args.output}: tag graph, {info['num_nodes']} nodes, {info['num_edges']} edges, "
              f"{info['feat_dim']} bag-of-words features, node text, {time.perf_counter() - t0:.1f} s")
        return 0
    if args.generator in ("reg3cc", "pathspd"):
        sizes = dict(num_graphs=args.num_graphs, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
                     train_frac=args.train_frac, val_frac=args.val_frac, test_frac=args.test_frac, seed=args.seed)
        if args.generator == "pathspd":
            sizes["max_dist"] = args.max_dist
        t0 = time.perf_counter()
        try:
            info = write_graph_task(args.output, args.generator, force=args.force, **sizes)
        except GeneratorParamError as exc:
            raise DataError(f"--{exc.param.replace('_', '-')}: {exc.message}") from None
        print(f"{args.output}: {args.generator}, {info['num_graphs']} graphs, {info['num_nodes']} nodes, "
              f"{info['num_edges']} edges, {info['feat_dim']} features, {time.perf_counter() - t0:.1f} s")
        return 0
    common = dict(feat_dim=args.feat_dim, num_classes=args.num_classes, train_frac=args.train_frac,
                  val_frac=args.val_frac, test_frac=args.test_frac, seed=args.seed, force=args.force,
                  edge_types=args.edge_types)
    t0 = time.perf_counter()
    try:
        if args.generator == "rmat":
            info = write_rmat(args.output, args.scale, args.edge_factor, a=args.a, b=args.b, c=args.c,
                              symmetrize=args.symmetrize, remove_self_loops=args.remove_self_loops,
                              remove_duplicates=args.remove_duplicates, **common)
        else:
            info = write_csbm(args.output, args.num_nodes, avg_degree=args.avg_degree,
                              homophily=args.homophily, snr=args.snr, power_law=args.power_law, **common)
    except GeneratorParamError as exc:
        # name the command-line option instead of the Python parameter
        raise DataError(f"--{exc.param.replace('_', '-')}: {exc.message}") from None
    seconds = time.perf_counter() - t0
    print(f"{args.output}: {args.generator} graph, {info['num_nodes']} nodes, {info['num_edges']} edges, "
          f"{info['feat_dim']} features, {seconds:.1f} s")
    return 0
