"""``hpc-graph info PATH`` and ``hpc-graph check PATH``: summarise or validate a dataset or partition.

PATH is a dataset file (``*.h5``) or a partition directory. ``check`` exits 0
when valid, 1 with one line per problem (naming file and field) otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys

from hpc_graph.cli import add_threads_option


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "info", help="summarise a dataset file or a partition directory",
        description="Counts, degree statistics, classes, splits and fields of a dataset file, or the "
                    "per-part table of a partition directory.")
    p.add_argument("path", metavar="PATH", nargs="?", help="dataset file (.h5) or partition directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--env", action="store_true",
                   help="instead of PATH: print what every rank detected (launcher, rank, size, local "
                        "rank, the CPU threads it will use and why, CUDA devices); run it under your "
                        "launcher, e.g. srun hpc-graph info --env")
    p.add_argument("--backend", default="mpi", choices=["mpi", "torch"],
                   help="with --env: communicator to gather with (torch also shows the derived "
                        "MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK)")
    add_threads_option(p)
    p.set_defaults(func=run_info)

    c = subparsers.add_parser(
        "check", help="fully validate a dataset file or a partition directory",
        description="Validate every array of a dataset file, or a partition directory including "
                    "cross-partition consistency (ranges, halo / send lists, edges against the source). "
                    "Exit status 0 when valid, 1 otherwise.")
    c.add_argument("path", metavar="PATH", help="dataset file (.h5) or partition directory")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    add_threads_option(c)
    c.set_defaults(func=run_check)


def _stats(d: dict) -> str:
    return f"min {d['min']}, mean {d['mean']:.2f}, median {d['median']:g}, max {d['max']}"


def format_info(info: dict) -> str:
    """Text form of :func:`data_io.inspect.info`."""
    if info["kind"] == "partition":
        from hpc_graph.commands.partition import format_partition_stats

        src = info.get("source") or {}
        return "\n".join([f"{info['path']}: partitioned dataset (format v{info['version']})",
                          format_partition_stats(info),
                          f"features {info['feat_dim']}, classes {info['num_classes']}, "
                          f"fields: {', '.join(info.get('fields', [])) or '-'}",
                          f"source: {src.get('path')} (sha256 {str(src.get('sha256'))[:16]}...)"])
    lines = [
        f"{info['path']}: dataset {info['name']!r} ({info['task']} task, "
        f"{'directed' if info['directed'] else 'undirected'}), {info['file_size_bytes'] / 2**20:.1f} MiB",
        f"nodes {info['num_nodes']}, edges {info['num_edges']}, features {info['feat_dim']}, "
        f"classes {info['num_classes']}",
        f"in-degree: {_stats(info['in_degree'])}",
        f"out-degree: {_stats(info['out_degree'])}",
        f"isolated nodes {info['isolated_nodes']}, self loops {info['self_loops']}",
    ]
    if "num_graphs" in info:
        per = info.get("graph_nodes")
        lines.append(f"graphs {info['num_graphs']}" + (f", nodes per graph: {_stats(per)}" if per else "")
                     + " (graph-level: engine single, or dp over the batches of graphs)")
        if info.get("graph_splits"):
            lines.append("graph splits: " + ", ".join(f"{k} {v}" for k, v in info["graph_splits"].items()))
        if "graph_class_counts" in info:
            lines.append(f"labelled graphs {info['labelled_graphs']}, per class: "
                         + ", ".join(str(x) for x in info["graph_class_counts"][:20])
                         + (", ..." if len(info["graph_class_counts"]) > 20 else ""))
    if info.get("splits"):
        lines.append("splits: " + ", ".join(f"{k} {v}" for k, v in info["splits"].items()))
    if "class_counts" in info:
        cc = info["class_counts"]
        shown = ", ".join(str(x) for x in cc[:20]) + (", ..." if len(cc) > 20 else "")
        lines.append(f"labelled nodes {info['labelled_nodes']}, per class: {shown}")
    lines.append(f"fields: {', '.join(info['fields']) or '-'}")
    return "\n".join(lines)


def run_env(args: argparse.Namespace) -> int:
    """Gather :func:`describe_environment` from every rank; rank 0 prints a table (or JSON)."""
    import os

    from hpc_graph.comm import describe_environment, get_communicator, install_abort_handler
    from hpc_graph.comm.threads import configure_threads

    plan = configure_threads(args.threads, explicit_name="--threads", world=True)  # decided by the CLI already
    comm = get_communicator(args.backend)
    install_abort_handler(comm)
    mine = describe_environment()
    mine["threads"]["decided"] = plan.as_dict()
    mine["backend"] = comm.backend
    # GPU halo exchange: CUDA tensors go to MPI directly when the library reads device memory, else through
    # host buffers (staging); the device is the one `train.device: cuda` gives this rank
    cuda_aware = getattr(comm, "cuda_aware", None)
    mine["cuda"]["mpi_cuda_aware"] = cuda_aware
    mine["cuda"]["gpu_exchange"] = (None if not mine["cuda"].get("device_count") else
                                    "direct (CUDA-aware MPI)" if cuda_aware else "host staging")
    if mine["cuda"].get("device_count"):
        mine["cuda"]["rank_device"] = f"cuda:{mine['local_rank'] % mine['cuda']['device_count']}"
    mine["torch_distributed_env"] = {k: os.environ.get(k) for k in
                                     ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    everyone = comm.allgather_object(mine)
    if comm.rank != 0:
        return 0
    if args.json:
        print(json.dumps(everyone, indent=1))
        return 0
    first = everyone[0]
    print(f"launcher {first['launcher']}, {first['size']} rank(s), backend {first['backend']}, "
          f"python {first['python']}, " + ", ".join(f"{k} {v}" for k, v in first["packages"].items()))
    print(f"{'rank':>4} {'local':>5} {'host':<20} {'pid':>8} {'cpus':>5} {'threads':>7} {'torch':>5} "
          f"{'cuda':>5}  why")
    for e in everyone:
        t, c = e["threads"], e["cuda"]
        p = t["decided"]
        why = p["reason"] + (f"; node oversubscribed: {p['node_threads']} threads on {p['node_cpus']} CPU(s)"
                             if p["oversubscribed"] else "")
        print(f"{e['rank']:>4} {e['local_rank']:>5} {e['hostname'][:20]:<20} {e['pid']:>8} "
              f"{t['cpu_affinity']!s:>5} {p['threads']:>7} {t['torch_num_threads']!s:>5} "
              f"{c['device_count']!s:>5}  {why}")
    gpus = [e for e in everyone if e["cuda"].get("device_count")]
    if gpus:
        print("GPUs: " + "; ".join(f"rank {e['rank']} -> {e['cuda']['rank_device']} "
                                   f"({e['cuda']['devices'][int(e['cuda']['rank_device'].split(':')[1])]})"
                                   for e in gpus))
        print("GPU halo exchange: " + ", ".join(sorted({e["cuda"]["gpu_exchange"] for e in gpus}))
              + " (MPI CUDA-aware: " + ", ".join(sorted({str(e["cuda"]["mpi_cuda_aware"]) for e in gpus}))
              + "; force with HPC_GRAPH_CUDA_AWARE_MPI=0|1)")
    if args.backend == "torch":
        print("torch.distributed: " + "; ".join(
            f"rank {e['rank']}: " + (" ".join(f"{k}={v}" for k, v in e["torch_distributed_env"].items()
                                              if v is not None) or "-") for e in everyone))
    return 0


def run_info(args: argparse.Namespace) -> int:
    from data_io.inspect import info

    if args.env:
        return run_env(args)
    if args.path is None:
        from hpc_graph.cli import CLIError
        raise CLIError("PATH: give a dataset file or partition directory (or --env)")
    res = info(args.path)
    print(json.dumps(res, indent=1) if args.json else format_info(res))
    return 0


def run_check(args: argparse.Namespace) -> int:
    from data_io.inspect import check

    res = check(args.path)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for note in res["notes"]:
            print(f"note: {note}")
        if res["valid"]:
            print(f"{args.path}: OK ({res['kind']})")
        else:
            print(f"{args.path}: {len(res['problems'])} problem(s):", file=sys.stderr)
            for prob in res["problems"]:
                print(f"  {prob}", file=sys.stderr)
    return 0 if res["valid"] else 1


run = run_info  # the module-level entry point the CLI registry expects
