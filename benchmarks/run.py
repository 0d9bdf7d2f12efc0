"""The benchmark suite: one runner for every table of docs/benchmarks.md, and the report rendered from its results.

    python benchmarks/run.py run --quick --out benchmarks/measured/quick-a.json   # <= 15 min on 2 cores
    python benchmarks/run.py run --full --out benchmarks/measured/full.json       # every table (about 45 min)
    python benchmarks/run.py run --quick --only engines-s15 --rounds 5            # one cell, more rounds
    python benchmarks/run.py render            # docs/benchmarks.md and README's table from benchmarks/measured/
    python benchmarks/run.py render --check    # exit 1 when the committed report is not what the results give

A *cell* is one comparison: a reference side (a peer framework, or the ``single`` engine that every other
engine must match) and the sides measured against it, on the same data with the same model. Every round runs
each side of a cell once, the sides' order rotating from round to round, so a slow spell of a shared machine
falls on all of them; a side's number is the median over rounds (``--rounds``, at least 3 for a report) of
one run's median epoch (epochs 2 and later, the slowest rank; epoch 1 compiles kernels and warms caches).
Beside each ratio goes its spread over the rounds ((max - min) / median of the per-round ratios): a ratio
inside its spread is no difference.

Peer frameworks run in their own environments (``bash benchmarks/setup_baselines.sh --dgl --pyg``:
``.venv-dgl``, ``.venv-pyg``); a side whose environment is missing is recorded as skipped, with the command
that makes it. The results file (JSON) holds every run, the summaries, and the machine: CPU model, cores,
memory, library versions, git commit, thread settings, load average before and after.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "benchmarks" / "measured"
REPORT = REPO / "docs" / "benchmarks.md"
README = REPO / "README.md"
SCHEMA = 1
THREAD_VARS = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
FLOOR_SCALE = 10
PEER_ENVS = {"dgl": ".venv-dgl", "pyg": ".venv-pyg"}


# -- what is measured ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """One program measured in a cell.

    ``kind``: ``train`` (``hpc-graph train`` with ``sets``; ``mpiexec -n ranks`` above one rank, on METIS
    parts of the cell's graph when ``parts``), ``dgl`` / ``pyg`` (full-batch peers,
    ``benchmarks/{dgl,pyg}_baseline.py``), ``dgl-mini`` / ``pyg-mini`` (sampled peers,
    ``benchmarks/minibatch_baseline.py``).
    """
    label: str
    kind: str = "train"
    ranks: int = 1
    parts: bool = False
    sets: tuple[tuple[str, Any], ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str | None], ...] = ()  # environment beside the suite's (None: unset)


@dataclass(frozen=True)
class Target:
    """A goal beside a number: ``metric`` of comparison ``pair`` (index into the cell's ``compare``) or of
    side ``side``, ``op`` (``>=``, ``<=``) ``value``."""
    text: str
    metric: str
    op: str
    value: float
    pair: int | None = None
    side: str | None = None


@dataclass(frozen=True)
class Cell:
    key: str
    section: str
    title: str
    data: str                      # "rmat-sNN" or "cora"
    sides: tuple[Side, ...]
    compare: tuple[tuple[str, str], ...]  # (measured label, reference label)
    epochs: int = 4
    floor: bool = False            # also run each side on the scale-10 graph: memory above its process floor
    seeds: tuple[int, ...] = ()    # accuracy cells: one run per seed instead of timed rounds
    profiles: tuple[str, ...] = ("quick", "full")
    targets: tuple[Target, ...] = ()


def _sets(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((k.replace("__", "."), v) for k, v in kw.items())


_FULL = _sets(data__feature_norm="none", model__num_layers=3, model__heads=4, model__out_heads=1,
              model__dropout=0.5, model__attn_dropout=0.0, optim__lr=0.01, optim__weight_decay=0.0)
_WIDTH = {"gcn": 128, "sage": 128, "gat": 32}
_SAMPLED = _sets(model__name="sage", model__hidden=256, model__num_layers=3, model__dropout=0.5, optim__lr=0.003,
                 sampler__fanouts="[15,10,5]", sampler__batch_size=1024)


def _peer_cell(model: str, scale: int, peers: tuple[str, ...], profiles: tuple[str, ...]) -> Cell:
    ours = Side("hpc_graph", sets=_FULL + _sets(engine__name="single", model__name=model,
                                                model__hidden=_WIDTH[model]))
    args = ("--model", model, "--hidden", str(_WIDTH[model]), "--heads", "4", "--num-layers", "3",
            "--dropout", "0.5", "--lr", "0.01")
    name = {"gcn": "GCN", "sage": "SAGE (mean)", "gat": "GAT (4 heads x 32)"}[model]
    if peers == ("dgl-plain",):  # DGL as its users run it: without the huge-page switch the suite gives every side
        plain = Side("DGL without huge pages", kind="dgl", args=args, env=(("THP_MEM_ALLOC_ENABLE", None),))
        targets = (Target("at least 1.5x the speed of DGL as installed", "speed", ">=", 1.5, pair=0),
                   Target("at most 0.5x its memory above the process floor", "memory_net", "<=", 0.5, pair=0))
        return Cell(f"peers-plain-{model}-s{scale}", "peers", f"{name}, R-MAT scale {scale}, DGL as installed",
                    f"rmat-s{scale}", (ours, plain), (("hpc_graph", plain.label),), epochs=4, floor=True,
                    profiles=profiles, targets=targets)
    sides = [ours] + [Side({"dgl": "DGL", "pyg": "PyG"}[p], kind=p, args=args) for p in peers]
    compare = tuple(("hpc_graph", s.label) for s in sides[1:])
    return Cell(f"peers-{model}-s{scale}", "peers", f"{name}, R-MAT scale {scale}", f"rmat-s{scale}", tuple(sides),
                compare, epochs=4, floor=True, profiles=profiles)


def _layers_cell(scale: int, which: str, profiles: tuple[str, ...]) -> Cell:
    """Layers written by a user from the public API (examples/custom_layer.py's GIN through ``graph.aggregate``,
    examples/message_passing.py's GATv2 through ``graph.message_passing``) against PyG's own (``which``: ``gin``
    with the GATv2 against the built-in GAT's fused kernels, what the generic path costs; ``gatv2``: against PyG's
    GATv2Conv, whose per-edge tensors need about 5 KB per edge and do not fit this machine at scale 18)."""
    env = (("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "examples")])),)
    common = ("--num-layers", "3", "--dropout", "0.5", "--lr", "0.01")
    gatv2 = Side("GATv2 of one's own", sets=_FULL + _sets(engine__name="single", model__name="message_passing:GATv2",
                                                          model__hidden=128), env=env)
    if which == "gin":
        sides = (Side("GIN of one's own", sets=_FULL + _sets(engine__name="single", model__name="custom_layer:GIN",
                                                             model__hidden=128), env=env),
                 Side("PyG GINConv", kind="pyg", args=("--model", "gin", "--hidden", "128", *common)),
                 gatv2, Side("built-in GAT", sets=_FULL + _sets(engine__name="single", model__name="gat",
                                                                model__hidden=32)))
        pairs = (("GIN of one's own", "PyG GINConv"), ("GATv2 of one's own", "built-in GAT"))
        title = "3 layers: GIN 128 wide against PyG; GATv2 (4 heads x 32) against the built-in GAT"
    else:
        sides = (gatv2, Side("PyG GATv2Conv", kind="pyg", args=("--model", "gatv2", "--hidden", "32", "--heads",
                                                                 "4", *common)))
        pairs = (("GATv2 of one's own", "PyG GATv2Conv"),)
        title = "3 GATv2 layers (4 heads x 32) against PyG"
    targets = (Target(f"{pairs[0][0]}: at least 2x the speed of {pairs[0][1]}", "speed", ">=", 2.0, pair=0),
               Target(f"{pairs[0][0]}: at most 0.5x its memory above the process floor", "memory_net", "<=", 0.5,
                      pair=0))
    return Cell(f"layers-{which}-s{scale}", "layers", f"{title}, R-MAT scale {scale}", f"rmat-s{scale}", sides,
                pairs, epochs=4, floor=True, profiles=profiles, targets=targets)


def _engines_cell(scale: int, profiles: tuple[str, ...], four: bool) -> Cell:
    base = _FULL + _sets(model__name="gcn", model__hidden=128)
    sides = [Side("single", sets=base + _sets(engine__name="single")),
             Side("dp, 2 ranks", ranks=2, parts=True, sets=base + _sets(engine__name="dp")),
             Side("sar, 2 ranks", ranks=2, parts=True, sets=base + _sets(engine__name="sar")),
             Side("sylvie 2-bit, 2 ranks", ranks=2, parts=True,
                  sets=base + _sets(engine__name="sylvie", engine__bits=2))]
    if four:
        sides += [Side("dp, 4 ranks", ranks=4, parts=True, sets=base + _sets(engine__name="dp")),
                  Side("sar, 4 ranks", ranks=4, parts=True, sets=base + _sets(engine__name="sar"))]
    pairs = tuple((s.label, "single") for s in sides[1:])
    n = 4 if four else 2
    pairs += ((f"sar, {n} ranks", f"dp, {n} ranks"),)
    targets = (Target(f"sar's peak per rank at most dp's on {n} ranks, above the process floor (one remote block "
                      "at a time)", "memory_net", "<=", 1.0, pair=len(pairs) - 1),
               Target("dp's peak per rank on 2 ranks below one process's, above the process floor", "memory_net", "<",
                      1.0, pair=0))
    return Cell(f"engines-s{scale}", "engines", f"3-layer GCN, R-MAT scale {scale}, METIS parts", f"rmat-s{scale}",
                tuple(sides), pairs, epochs=4, floor=True, profiles=profiles, targets=targets)


def _sampled_peer_cell(scale: int, profiles: tuple[str, ...]) -> Cell:
    args = ("--model", "sage", "--fanouts", "15", "10", "5", "--batch-size", "1024", "--hidden", "256",
            "--dropout", "0.5", "--lr", "0.003", "--sampling-passes", "0")
    sides = (Side("hpc_graph minibatch", sets=_SAMPLED + _sets(engine__name="minibatch")),
             Side("PyG NeighborLoader", kind="pyg-mini", args=args),
             Side("DGL NeighborSampler", kind="dgl-mini", args=args))
    return Cell(f"minibatch-peers-s{scale}", "minibatch", f"3-layer SAGE hidden 256, fan-outs 15/10/5, batch 1024, "
                f"R-MAT scale {scale}", f"rmat-s{scale}", sides,
                (("hpc_graph minibatch", "PyG NeighborLoader"), ("hpc_graph minibatch", "DGL NeighborSampler")),
                epochs=3, profiles=profiles,
                targets=(Target("faster than PyG's NeighborLoader", "speed", ">=", 1.0, pair=0),
                         Target("faster than DGL's NeighborSampler", "speed", ">=", 1.0, pair=1)))


def _apt_cell(scale: int, profiles: tuple[str, ...]) -> Cell:
    sides = (Side("minibatch, 1 process", sets=_SAMPLED + _sets(engine__name="minibatch")),
             Side("apt GDP, 2 ranks", ranks=2, parts=True,
                  sets=_SAMPLED + _sets(engine__name="apt", engine__strategy="gdp", sampler__batch_size=512)),
             Side("minibatch hec, 2 ranks", ranks=2, parts=True,
                  sets=_SAMPLED + _sets(engine__name="minibatch", sampler__batch_size=512, hec__mode="hec")))
    return Cell(f"sampled-s{scale}", "sampled", f"3-layer SAGE hidden 256, fan-outs 15/10/5, 1024 seeds per step "
                f"(512 per rank), R-MAT scale {scale}", f"rmat-s{scale}", sides,
                tuple((s.label, sides[0].label) for s in sides[1:]), epochs=3, profiles=profiles)


def _flow_cell(scale: int, profiles: tuple[str, ...]) -> Cell:
    base = _sets(model__name="gcn", model__hidden=128, model__num_layers=8, model__residual="true",
                 model__batchnorm="true", model__dropout=0.0)
    sides = (Side("single", sets=base + _sets(engine__name="single")),
             Side("flow, 2 stages", ranks=2, sets=base + _sets(engine__name="flow", engine__microbatches=4,
                                                                engine__cross_edges="exact")))
    return Cell(f"flow-s{scale}", "flow", f"8-layer residual GCN hidden 128 with batch norm, 4 micro-batches, "
                f"R-MAT scale {scale}", f"rmat-s{scale}", sides, (("flow, 2 stages", "single"),), epochs=4,
                floor=True, profiles=profiles,
                targets=(Target("peak per rank above the process floor at most one process's", "memory_net", "<=",
                                1.0, pair=0),))


def _seqpar_cell(scale: int, profiles: tuple[str, ...]) -> Cell:
    base = _sets(model__name="graphormer", model__hidden=64, model__num_layers=4, model__heads=8,
                 model__attention="sparse", model__dropout=0.0, optim__weight_decay=0.0)
    sides = (Side("single", sets=base + _sets(engine__name="single")),
             Side("seqpar, 2 ranks", ranks=2, sets=base + _sets(engine__name="seqpar")))
    return Cell(f"seqpar-s{scale}", "transformers", f"Graphormer 4 layers x 64 x 8 heads, sparse attention, "
                f"R-MAT scale {scale} (S = {2 ** scale} tokens)", f"rmat-s{scale}", sides,
                (("seqpar, 2 ranks", "single"),), epochs=3, floor=True, profiles=profiles,
                targets=(Target("peak per rank above the process floor below one process's", "memory_net", "<",
                                1.0, pair=0),))


def _accuracy_cell(model: str, seeds: tuple[int, ...], profiles: tuple[str, ...], suffix: str) -> Cell:
    cfg = str(REPO / "configs" / f"single_{model}.yaml")
    sides = (Side("single", args=("--config", cfg), sets=_sets(engine__name="single")),
             Side("dp, 2 ranks", ranks=2, parts=True, args=("--config", cfg), sets=_sets(engine__name="dp")))
    ref = REFERENCE_ACCURACY[model]
    return Cell(f"accuracy-{model}{suffix}", "accuracy", f"{model.upper()} on Cora (Planetoid split), "
                f"configs/single_{model}.yaml, {len(seeds)} seeds", "cora", sides, (("dp, 2 ranks", "single"),),
                epochs=200, seeds=seeds, profiles=profiles,
                targets=(Target(f"within 0.01 of PyG's {ref[0]:.3f}", "acc", ">=", ref[0] - 0.01, side="single"),))


# Test accuracy on Cora's public split, PyTorch Geometric 2.8.1, mean of 5 seeds, best-validation epoch, 200
# epochs (../shared/datasets/README.md, the dataset's own notes), and the published numbers.
REFERENCE_ACCURACY = {"gcn": (0.822, 0.006, "GCN 81.5 % (Kipf & Welling 2017)"),
                      "gat": (0.826, 0.004, "GAT 83.0 % (Velickovic et al. 2018)")}

_Q, _F, _QF = ("quick",), ("full",), ("quick", "full")
CELLS: tuple[Cell, ...] = (
    _peer_cell("gcn", 15, ("dgl", "pyg"), _QF),
    _peer_cell("gcn", 18, ("dgl", "pyg"), _F),
    _peer_cell("sage", 18, ("dgl", "pyg"), _F),
    _peer_cell("gat", 18, ("dgl",), _F),
    _layers_cell(18, "gin", _F),
    _layers_cell(16, "gatv2", _F),
    _peer_cell("gcn", 18, ("dgl-plain",), _F),
    _peer_cell("sage", 18, ("dgl-plain",), _F),
    _peer_cell("gat", 18, ("dgl-plain",), _F),
    _engines_cell(15, _QF, four=False),
    _engines_cell(18, _F, four=True),
    _sampled_peer_cell(14, _QF),
    _apt_cell(15, _QF),
    _flow_cell(14, _QF),
    _seqpar_cell(12, _QF),
    _accuracy_cell("gcn", (0, 1, 2, 3, 4), _F, ""),
    _accuracy_cell("gcn", (0, 1, 2), _Q, "-3seeds"),
    _accuracy_cell("gat", (0, 1, 2, 3, 4), _F, ""),
)

SECTIONS = {
    "peers": ("Full-batch training against DGL and PyG, one process",
              "The same 3-layer model in each framework (GCN and SAGE 128 wide, GAT 4 heads x 32; dropout 0.5 before "
              "every layer; Adam; "
              "cross entropy over the training nodes; the whole graph every step), R-MAT graphs with 128 "
              "features and 16 classes, 2 threads. *speed*: the peer's epoch over ours (above 1: we are "
              "faster). *memory*: our peak RSS over the peer's; *net*: both above their own process floor (the "
              "same program on a 1,024-node graph: Python, torch, kernels; a peer's floor includes its "
              "framework), the share that grows with the graph."),
    "layers": ("Layers of one's own against PyG's, one process",
               "Models written from the public API only: a GIN (sum aggregation through `graph.aggregate`, an MLP, "
               "a learnable epsilon; examples/custom_layer.py) and a GATv2 (scores from both ends of every edge "
               "through `graph.message_passing`, which recomputes the messages in backward instead of keeping "
               "them; examples/message_passing.py), against PyG's `GINConv` and `GATv2Conv` in the same 3-layer "
               "model, and the GATv2 against the built-in GAT's fused kernels: what the generic path costs. Same "
               "settings as the section above. PyG's GATv2Conv keeps several per-edge tensors of every layer for "
               "its backward pass (9.2 GB at scale 16, 4.8 GB at 15): at scale 18 (7.6 M edges) it would need "
               "about 40 GB, more than this machine has, so that pair runs at scale 16."),
    "engines": ("Full-graph engines across ranks",
                "Every engine here computes what `single` computes (the tests check it to 1e-10 in float64, "
                "dropout included); what changes is the memory per rank, the epoch and the bytes sent. "
                "*memory*: the largest peak RSS of a rank over one process's; *speed*: one process's epoch "
                "over the engine's (ranks share this machine's cores, so more ranks do not mean more compute)."),
    "minibatch": ("Sampled training against PyG and DGL, one process",
                  "One epoch: every training node once as a seed, in shuffled batches; sampling, feature "
                  "gather, forward, backward and Adam step included. PyG's `NeighborLoader` (torch-sparse "
                  "sampler) and DGL's `NeighborSampler` run the same fan-outs, seed hop first."),
    "sampled": ("Sampled engines across ranks",
                "`apt` (its GDP strategy: each rank gathers its batch's input features) and `minibatch` with "
                "the historical embedding cache, on 2 ranks with half the seeds each, against `minibatch` on "
                "one process."),
    "flow": ("`flow`: a deep GNN pipelined over ranks by layers",
             "Each rank holds half the layers; the graph goes through in micro-batches, cross edges exact "
             "(the numbers of one process). *memory*: the larger stage's peak over one process's."),
    "transformers": ("`seqpar`: graph transformers split by sequence",
                     "Each rank holds a slice of the token sequence and its share of the sparse attention "
                     "pattern; the model's numbers are one process's."),
    "accuracy": ("Accuracy on Cora",
                 "Test accuracy at the best validation epoch, mean and standard deviation over seeds, against "
                 "PyTorch Geometric 2.8.1 on the same split and settings (`../shared/datasets/README.md`)."),
}


# -- the machine ----------------------------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def environment(cores: int) -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, memory, library versions, commit, thread settings, load."""
    cpu = re.search(r"^model name\s*:\s*(.+)$", _read("/proc/cpuinfo"), re.M)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo"), re.M)
    versions = {"python": platform.python_version()}
    for mod in ("torch", "numpy", "numba", "h5py", "mpi4py", "scipy"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - an absent library is recorded as absent
            versions[mod] = None
    from hpc_graph.version import __version__
    return {
        "cpu": cpu.group(1).strip() if cpu else platform.processor(),
        "logical_cpus": os.cpu_count(), "affinity_cpus": len(os.sched_getaffinity(0)),
        "cores_used": cores, "memory_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "os": platform.platform(), "versions": versions,
        "mpi": _mpi_version() or None,
        "hpc_graph": __version__, "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "threads": {v: os.environ.get(v) for v in THREAD_VARS},
        "thp": _read("/sys/kernel/mm/transparent_hugepage/enabled").strip(),
        "loadavg_before": list(os.getloadavg()),
    }


# -- data -------------------------------------------------------------------------------------------------------
def _hpc(*args: str) -> list[str]:
    return [sys.executable, "-m", "hpc_graph.cli", "-q", *args]


def _log(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def _check(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(2))
    if proc.returncode:
        raise SystemExit(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")


def dataset(work: Path, name: str) -> Path:
    """The dataset file ``name`` (``rmat-sNN`` or ``cora``), made once under ``work``."""
    path = work / f"{name}.h5"
    if path.exists():
        return path
    work.mkdir(parents=True, exist_ok=True)
    tmp = work / f".{name}.tmp.h5"
    if name == "cora":
        npz = REPO / "tests" / "data" / "cora.npz"
        _log(f"converting {npz} -> {path}")
        _check(_hpc("convert", "npz", str(npz), "-o", str(tmp)), f"converting {npz}")
    else:
        scale = int(name.removeprefix("rmat-s"))
        _log(f"generating R-MAT scale {scale} -> {path}")
        _check(_hpc("generate", "rmat", "--scale", str(scale), "-o", str(tmp)), f"generating {path}")
    tmp.replace(path)
    return path


def partitions(work: Path, name: str, parts: int) -> Path:
    """METIS parts of dataset ``name`` for ``parts`` ranks, made once under ``work``."""
    out = work / f"{name}-metis{parts}"
    if (out / "partition.json").exists():
        return out
    src = dataset(work, name)
    _log(f"partitioning {src.name} into {parts}")
    shutil.rmtree(out, ignore_errors=True)
    _check(_hpc("partition", str(src), "-o", str(out), "-n", str(parts), "--method", "metis"),
           f"partitioning {src}")
    return out


# -- one run ---------------------------------------------------------------------------------------------------
def _env(threads: int, extra: tuple[tuple[str, str | None], ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS and k != "HPC_GRAPH_EXPORTED_THREADS"}
    for var in THREAD_VARS:
        env[var] = str(threads)
    # torch's large CPU tensors on transparent huge pages: hpc_graph turns it on for itself; the peers get it too
    # (the stricter comparison: without it their large allocations page-fault 4 KiB at a time)
    env["THP_MEM_ALLOC_ENABLE"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for key, value in extra:
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@functools.lru_cache(maxsize=1)
def _mpi_version() -> str:
    if not shutil.which("mpiexec"):
        return ""
    out = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True).stdout
    line = next((x for x in out.splitlines() if "Open MPI" in x or "Version:" in x), "")
    return ("MPICH " + line.split(":", 1)[1].strip()) if line.strip().startswith("Version:") else line.strip()


def mpiexec(ranks: int) -> list[str]:
    """``mpiexec -n ranks``, with Open MPI's flags for more ranks than cores (and for root) when it is Open MPI."""
    cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks)]
    if "Open MPI" in _mpi_version():
        cmd.append("--oversubscribe")
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd


def peer_python(kind: str) -> Path | None:
    """The python of a peer's environment (``.venv-dgl``, ``.venv-pyg``), or None when it is not made."""
    exe = REPO / PEER_ENVS[kind.split("-")[0]] / "bin" / "python"
    return exe if exe.exists() else None


def side_command(side: Side, data: Path, epochs: int, cores: int, run_dir: Path, seed: int | None) -> list[str]:
    threads = max(1, cores // side.ranks)
    if side.kind == "train":
        settings = dict(side.sets)
        settings.update({"data.path": str(data), "train.epochs": epochs, "train.progress": "false"})
        if seed is None:
            settings["train.eval_every"] = 1000
        else:
            settings.update({"train.seed": seed, "train.eval_every": 1})
        args = list(side.args) or ["--config", os.devnull]
        cmd = _hpc("train", *args, "--run-dir", str(run_dir), "--threads", str(threads))
        for k, v in settings.items():
            cmd += ["--set", f"{k}={v}"]
        if side.ranks > 1:
            cmd = mpiexec(side.ranks) + cmd
        return cmd
    exe = peer_python(side.kind)
    script = {"dgl": "dgl_baseline.py", "pyg": "pyg_baseline.py"}.get(side.kind, "minibatch_baseline.py")
    cmd = [str(exe), str(REPO / "benchmarks" / script), str(data), *side.args, "--epochs", str(epochs)]
    if side.kind.endswith("-mini"):
        cmd += ["--framework", side.kind.split("-")[0], "--threads", str(threads)]
    elif side.kind == "dgl":
        cmd += ["--threads", str(threads)]
    return cmd


def _steady(seconds: list[float]) -> float:
    later = seconds[1:] or seconds
    return statistics.median(later)


def run_side(side: Side, data: Path, epochs: int, cores: int, work: Path, seed: int | None = None,
             timeout: float = 3600) -> dict[str, Any]:
    """One run of ``side``: its median epoch (epochs 2+, slowest rank), largest peak RSS of a rank, bytes sent
    per epoch (all ranks), test accuracy; ``error`` / ``skipped`` instead when it could not run."""
    if side.kind != "train" and peer_python(side.kind) is None:
        env = PEER_ENVS[side.kind.split("-")[0]]
        return {"skipped": f"{env} not found: bash benchmarks/setup_baselines.sh --{side.kind.split('-')[0]}"}
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    cmd = side_command(side, data, epochs, cores, run_dir, seed)
    rec: dict[str, Any] = {"command": " ".join(cmd)}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(max(1, cores // side.ranks), side.env),
                              timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        shutil.rmtree(run_dir, ignore_errors=True)
        return {**rec, "error": f"timed out after {timeout:.0f} s"}
    rec["wall_seconds"] = time.perf_counter() - t0
    try:
        if proc.returncode:
            rec["error"] = f"exit {proc.returncode}: {proc.stderr[-2000:]}"
        elif side.kind == "train":
            by_epoch: dict[int, float] = {}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines():
                row = json.loads(line)
                by_epoch[row["epoch"]] = max(by_epoch.get(row["epoch"], 0.0), row["epoch_seconds"])
            summary = json.loads((run_dir / "summary.json").read_text())
            rec.update({"epoch_seconds": [by_epoch[e] for e in sorted(by_epoch)],
                        "peak_rss_mb": max(summary["peak_rss_mb"]),
                        "bytes_per_epoch": summary.get("bytes_per_epoch"), "test_acc": summary.get("test_acc")})
        else:
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            rec.update({"epoch_seconds": out["epoch_seconds"], "peak_rss_mb": out["peak_rss_mb"],
                        "versions": out.get("versions")})
        if "epoch_seconds" in rec:
            rec["median_epoch_seconds"] = _steady(rec["epoch_seconds"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        rec["error"] = f"unreadable output ({exc}): {proc.stdout[-500:]} {proc.stderr[-1500:]}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return rec


# -- statistics ------------------------------------------------------------------------------------------------
def spread(values: list[float]) -> float | None:
    """(max - min) / median; None for fewer than two values."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def summarise_side(runs: list[dict[str, Any]], floor: dict[str, Any] | None) -> dict[str, Any]:
    ok = [r for r in runs if "median_epoch_seconds" in r]
    out: dict[str, Any] = {"runs": len(ok), "failed": sum("error" in r for r in runs),
                           "skipped": next((r["skipped"] for r in runs if "skipped" in r), None)}
    if not ok:
        return out
    epochs = [r["median_epoch_seconds"] for r in ok]
    peaks = [r["peak_rss_mb"] for r in ok]
    out.update({"epoch_seconds": statistics.median(epochs), "epoch_spread": spread(epochs),
                "peak_rss_mb": statistics.median(peaks), "peak_spread": spread(peaks)})
    sent = [r["bytes_per_epoch"] for r in ok if r.get("bytes_per_epoch") is not None]
    if sent:
        out["bytes_per_epoch"] = statistics.median(sent)
    accs = [r["test_acc"] for r in ok if r.get("test_acc") is not None]
    if accs:
        out["test_acc_mean"] = statistics.fmean(accs)
        out["test_acc_std"] = statistics.pstdev(accs) if len(accs) > 1 else 0.0
    if floor and "peak_rss_mb" in floor:
        out["floor_rss_mb"] = floor["peak_rss_mb"]
        out["net_rss_mb"] = out["peak_rss_mb"] - floor["peak_rss_mb"]
    return out


def compare(ours: dict[str, Any], base: dict[str, Any], ours_runs: list[dict], base_runs: list[dict]
            ) -> dict[str, Any]:
    """Ratios of side ``ours`` to reference ``base``: speed = base epoch / ours (above 1: ours is faster), memory
    = ours peak / base peak (net: above each one's floor), and the speed ratio of each round with its spread."""
    out: dict[str, Any] = {}
    if "epoch_seconds" in ours and "epoch_seconds" in base:
        out["speed"] = base["epoch_seconds"] / ours["epoch_seconds"]
        per_round = [b["median_epoch_seconds"] / o["median_epoch_seconds"] for o, b in zip(ours_runs, base_runs)
                     if "median_epoch_seconds" in o and "median_epoch_seconds" in b]
        out["speed_rounds"] = per_round
        out["speed_spread"] = spread(per_round)
        out["memory"] = ours["peak_rss_mb"] / base["peak_rss_mb"]
        if "net_rss_mb" in ours and "net_rss_mb" in base and base["net_rss_mb"] > 0:
            out["memory_net"] = ours["net_rss_mb"] / base["net_rss_mb"]
    if "test_acc_mean" in ours and "test_acc_mean" in base:
        out["acc_difference"] = ours["test_acc_mean"] - base["test_acc_mean"]
    return out


def _metric(cell_result: dict[str, Any], target: Target) -> float | None:
    if target.pair is not None:
        return cell_result["comparisons"][target.pair].get(target.metric)
    side = cell_result["sides"].get(target.side or "", {})
    return side.get({"acc": "test_acc_mean"}.get(target.metric, target.metric))


def judge(cell_result: dict[str, Any], target: Target) -> dict[str, Any]:
    value = _metric(cell_result, target)
    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b, ">": lambda a, b: a > b}
    met = None if value is None else ops[target.op](value, target.value)
    return {"text": target.text, "metric": target.metric, "op": target.op, "value": target.value,
            "measured": value, "met": met}


# -- a cell, a profile ----------------------------------------------------------------------------------------
def run_cell(cell: Cell, work: Path, rounds: int, cores: int, scale_shift: int, epochs: int | None,
             skip_peers: bool = False, floors_too: bool = True) -> dict[str, Any]:
    name = cell.data
    if name.startswith("rmat-s") and scale_shift:
        name = f"rmat-s{max(6, int(name.removeprefix('rmat-s')) + scale_shift)}"
    ep = epochs or cell.epochs
    data = {s.label: (partitions(work, name, s.ranks) if s.parts and s.ranks > 1 else dataset(work, name))
            for s in cell.sides}
    runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in cell.sides}
    seeds = list(cell.seeds)
    n = len(seeds) if seeds else rounds
    started = time.time()
    for r in range(n):
        order = cell.sides[r % len(cell.sides):] + cell.sides[:r % len(cell.sides)]
        for side in order:
            if skip_peers and side.kind != "train":
                rec = {"skipped": "--no-peers"}
            else:
                rec = run_side(side, data[side.label], ep, cores, work, seed=seeds[r] if seeds else None)
            rec["round"] = r
            runs[side.label].append(rec)
            what = rec.get("skipped") or rec.get("error", "")[:300] or (
                f"{rec['median_epoch_seconds']:.3f} s/epoch, {rec['peak_rss_mb']:.0f} MiB"
                + (f", test acc {rec['test_acc']:.3f}" if seeds and rec.get("test_acc") is not None else ""))
            _log(f"{cell.key} round {r + 1}/{n} {side.label}: {what}")
    floors: dict[str, dict[str, Any]] = {}
    if cell.floor and floors_too:
        tiny = f"rmat-s{FLOOR_SCALE}"
        for side in cell.sides:
            if skip_peers and side.kind != "train":
                continue
            where = partitions(work, tiny, side.ranks) if side.parts and side.ranks > 1 else dataset(work, tiny)
            floors[side.label] = run_side(side, where, 2, cores, work)
    sides = {s.label: summarise_side(runs[s.label], floors.get(s.label)) for s in cell.sides}
    comparisons = []
    for ours, base in cell.compare:
        c = compare(sides[ours], sides[base], runs[ours], runs[base])
        comparisons.append({"side": ours, "reference": base, **c})
    result = {"key": cell.key, "section": cell.section, "title": cell.title, "data": name, "epochs": ep,
              "rounds": n, "seeds": seeds, "seconds": time.time() - started, "sides": sides,
              "side_order": [s.label for s in cell.sides], "comparisons": comparisons, "runs": runs,
              "floors": floors}
    result["targets"] = [judge(result, t) for t in cell.targets]
    return result


def select(profile: str, only: list[str] | None) -> list[Cell]:
    cells = [c for c in CELLS if profile in c.profiles]
    if only:
        known = {c.key for c in cells}
        bad = [k for k in only if k not in known]
        if bad:
            raise SystemExit(f"--only: no cell {', '.join(bad)} in the {profile} profile "
                             f"(cells: {', '.join(sorted(known))})")
        cells = [c for c in cells if c.key in only]
    return cells


def run_profile(args: argparse.Namespace) -> dict[str, Any]:
    profile = "full" if args.full else "quick"
    cells = select(profile, args.only)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"schema": SCHEMA, "profile": profile, "rounds": args.rounds,
                           "scale_shift": args.scale_shift, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           "command": " ".join(["python", "benchmarks/run.py", *sys.argv[1:]]) if args.argv is None
                           else " ".join(["python", "benchmarks/run.py", *args.argv]),
                           "environment": environment(args.cores), "cells": []}
    t0 = time.time()
    for i, cell in enumerate(cells):
        _log(f"cell {i + 1}/{len(cells)}: {cell.key} ({cell.title})")
        doc["cells"].append(run_cell(cell, work, args.rounds, args.cores, args.scale_shift, args.epochs,
                                     skip_peers=args.no_peers, floors_too=not args.no_floors))
        _save(Path(args.out), doc)
    doc["seconds"] = time.time() - t0
    doc["environment"]["loadavg_after"] = list(os.getloadavg())
    _save(Path(args.out), doc)
    return doc


def _save(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def validate(doc: dict[str, Any], where: str) -> None:
    """Raise ValueError naming ``where`` and the field when ``doc`` is not a results file of this schema."""
    def need(obj: dict, key: str, kind: type | tuple, at: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise ValueError(f"{where}: {at}{key} is missing")
        if not isinstance(obj[key], kind):
            raise ValueError(f"{where}: {at}{key} should be {kind}, got {type(obj[key]).__name__}")
        return obj[key]

    if need(doc, "schema", int, "") != SCHEMA:
        raise ValueError(f"{where}: schema {doc['schema']} (this runner reads {SCHEMA})")
    if need(doc, "profile", str, "") not in ("quick", "full"):
        raise ValueError(f"{where}: profile {doc['profile']!r} is neither quick nor full")
    need(doc, "environment", dict, "")
    for key in ("cpu", "logical_cpus", "memory_gib", "versions", "commit", "threads"):
        need(doc["environment"], key, object, "environment.")
    for i, cell in enumerate(need(doc, "cells", list, "")):
        at = f"cells[{i}]."
        for key, kind in (("key", str), ("section", str), ("title", str), ("sides", dict),
                          ("comparisons", list), ("runs", dict), ("targets", list), ("side_order", list)):
            need(cell, key, kind, at)
        if cell["section"] not in SECTIONS:
            raise ValueError(f"{where}: {at}section {cell['section']!r} is not a section of the report")
        for comp in cell["comparisons"]:
            for key in ("side", "reference"):
                if need(comp, key, str, at + "comparisons.") not in cell["sides"]:
                    raise ValueError(f"{where}: {at}comparisons names an unknown side {comp[key]!r}")


# -- the report --------------------------------------------------------------------------------------------------
def load_results(folder: Path = MEASURED) -> dict[str, dict[str, Any]]:
    """Every results file of ``folder`` by name (``full.json``, ``quick-a.json`` ...), each validated."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        validate(doc, str(path.relative_to(REPO) if path.is_relative_to(REPO) else path))
        out[path.stem] = doc
    return out


def _f(v: float | None, fmt: str, suffix: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{suffix}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f} %"


def _side_text(s: dict[str, Any]) -> str:
    if "epoch_seconds" not in s:
        return f"skipped ({s['skipped']})" if s.get("skipped") else f"failed ({s.get('failed', 0)} runs)"
    text = f"{s['epoch_seconds']:.3g} s, {s['peak_rss_mb']:.0f} MiB"
    if s.get("bytes_per_epoch"):
        text += f", {s['bytes_per_epoch'] / 2**20:.0f} MiB sent"
    return text


def _quick_noise(results: dict[str, dict], key: str, i: int) -> str:
    """The speed ratio of comparison ``i`` of cell ``key`` in each quick results file, and their spread."""
    vals = [c["comparisons"][i].get("speed") for doc in _quick_docs(results) for c in doc["cells"]
            if c["key"] == key and i < len(c["comparisons"])]
    vals = [v for v in vals if v is not None]
    if len(vals) < 2:
        return ""
    return " / ".join(f"{v:.2f}x" for v in vals) + f" ({_pct(spread(vals))})"


def _quick_docs(results: dict[str, dict]) -> list[dict]:
    return [doc for name, doc in sorted(results.items()) if doc["profile"] == "quick"]


def _latest(results: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    """Each cell key's results: from the full-profile file started last that has it (``--only`` reruns of some
    cells win over the run they refine), else from the first quick file (by name) that has it."""
    out: dict[str, tuple[str, dict]] = {}
    full = sorted(((d["started"], n, d) for n, d in results.items() if d["profile"] == "full"), reverse=True)
    quick = sorted((n, d) for n, d in results.items() if d["profile"] == "quick")
    for name, doc in [(n, d) for _s, n, d in full] + quick:
        for cell in doc["cells"]:
            out.setdefault(cell["key"], (name, cell))
    return out


def _cells_for(results: dict[str, dict], section: str) -> list[tuple[str, dict]]:
    """The cells of ``section`` (:func:`_latest`), in the runner's order."""
    latest = _latest(results)
    order = [c.key for c in CELLS] + sorted(k for k in latest if k not in {c.key for c in CELLS})
    return [latest[k] for k in order if k in latest and latest[k][1]["section"] == section]


def _timing_table(results: dict[str, dict], cells: list[tuple[str, dict]]) -> list[str]:
    lines = ["| configuration | side: epoch, peak RSS | reference: epoch, peak RSS | speed (round spread) | memory "
             "| net memory | quick runs: speed (spread) |", "|---|---|---|---|---|---|---|"]
    for _name, cell in cells:
        for i, comp in enumerate(cell["comparisons"]):
            ours, base = cell["sides"][comp["side"]], cell["sides"][comp["reference"]]
            speed = f"{comp['speed']:.2f}x ({_pct(comp.get('speed_spread'))})" if "speed" in comp else "n/a"
            noise = _quick_noise(results, cell["key"], i) or "-"
            lines.append(f"| {cell['title'] if i == 0 else ''} | {comp['side']}: {_side_text(ours)} | "
                         f"{comp['reference']}: {_side_text(base)} | {speed} | {_f(comp.get('memory'), '.2f', 'x')} "
                         f"| {_f(comp.get('memory_net'), '.2f', 'x')} | {noise} |")
    return lines


def _accuracy_table(cells: list[tuple[str, dict]]) -> list[str]:
    lines = ["| configuration | side | test accuracy (mean +- std) | seeds | PyG 2.8.1 (published) |",
             "|---|---|---|---|---|"]
    for _name, cell in cells:
        model = cell["key"].split("-")[1]
        ref = REFERENCE_ACCURACY.get(model)
        for label in cell["side_order"]:
            s = cell["sides"][label]
            acc = (f"{s['test_acc_mean']:.3f} +- {s['test_acc_std']:.3f}" if "test_acc_mean" in s else
                   _side_text(s))
            first = label == cell["side_order"][0]
            refs = f"{ref[0]:.3f} +- {ref[1]:.3f} ({ref[2]})" if ref and first else ""
            lines.append(f"| {cell['title'] if first else ''} | {label} | {acc} | {len(cell['seeds'])} | {refs} |")
    return lines


def _targets(cells: list[tuple[str, dict]]) -> list[str]:
    """Each cell's targets as the runner defines them now (judged on the stored numbers), or as stored for a cell
    the runner no longer has."""
    defined = {c.key: c.targets for c in CELLS}
    out = []
    for _name, cell in cells:
        judged = [judge(cell, t) for t in defined[cell["key"]]] if cell["key"] in defined else cell["targets"]
        for t in judged:
            mark = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
            value = "n/a" if t["measured"] is None else (f"{t['measured']:.3f}" if t["metric"] == "acc"
                                                          else f"{t['measured']:.2f}x")
            out.append(f"* {cell['title']}: {t['text']} ({t['metric']} {t['op']} {t['value']:g}): {value}, {mark}")
    return out


def _machine(doc: dict[str, Any]) -> str:
    e = doc["environment"]
    v = e["versions"]
    return (f"{e['cpu']}, {e['cores_used']} of {e['logical_cpus']} logical CPUs used, {e['memory_gib']} GiB; "
            f"{e['os']}; Python {v.get('python')}, torch {v.get('torch')}, numba {v.get('numba')}, "
            f"NumPy {v.get('numpy')}, h5py {v.get('h5py')}, mpi4py {v.get('mpi4py')}; {e.get('mpi') or 'no MPI'}; "
            f"hpc_graph {e['hpc_graph']} at {e['commit'][:10]}{' (with uncommitted changes)' if e['dirty'] else ''}; "
            f"load average {e['loadavg_before'][0]:.2f} before, "
            f"{e.get('loadavg_after', [float('nan')])[0]:.2f} after; {doc['started']}, "
            f"{doc.get('seconds', 0) / 60:.0f} min")


def _peer_versions(results: dict[str, dict]) -> str:
    found = {}
    for doc in results.values():
        for cell in doc["cells"]:
            for label, runs in cell["runs"].items():
                for r in runs:
                    if r.get("versions"):
                        found.setdefault(label.split()[0], r["versions"])
    return "; ".join(f"{k}: " + ", ".join(f"{m} {v}" for m, v in sorted(vs.items()) if v not in (None, False, True))
                     for k, vs in sorted(found.items()))


def render(results: dict[str, dict]) -> str:
    """docs/benchmarks.md from the results files (by name: ``full``, ``quick-a``, ``quick-b`` ...)."""
    lines = ["# Benchmark report", "",
             "<!-- Generated by `python benchmarks/run.py render` from benchmarks/measured/*.json; edit the runner "
             "or rerun it, not this file (tests/bench/test_run.py checks that they agree). -->", "",
             "Every table below comes from one runner, `benchmarks/run.py`, and the results files it wrote "
             "(`benchmarks/measured/`, committed). To measure your machine:", "",
             "```bash", "bash benchmarks/setup_baselines.sh --dgl --pyg        # once: the peers' environments",
             "python benchmarks/run.py run --quick --out my-quick.json  # <= 15 min on 2 cores: one row per engine "
             "and per peer",
             "python benchmarks/run.py run --full --out my-full.json    # every table",
             "python benchmarks/run.py render --results my-full.json my-quick.json --out my-report.md", "```", "",
             "**Method.** A cell compares sides on the same data and model. Each round runs every side once, the "
             "order rotating between rounds, so the machine's slow spells fall on all sides; a side's epoch is the "
             "median over rounds of one run's median epoch (epochs 2 and later; the slowest rank), its memory the "
             "median over rounds of its largest per-rank peak RSS. Every side runs with the same threads "
             "(`OMP_NUM_THREADS` and its kin) and with `THP_MEM_ALLOC_ENABLE=1`, torch's huge-page switch that "
             "hpc_graph turns on for itself, given to the peers too. *speed* is the reference's epoch over the "
             "side's (above 1: the side is faster), *round spread* the (max - min) / median of the per-round "
             "ratios, and *quick runs* the same ratio in each run of the quick profile with their spread: the "
             "measurement's own noise on this machine. A ratio inside its spread is no difference.", ""]
    docs = {n: d for n, d in results.items()}
    lines += ["**Machines.**", ""]
    for name, doc in sorted(docs.items()):
        lines.append(f"* `{name}` ({doc['profile']}, {doc['rounds']} rounds; `{doc['command']}`): {_machine(doc)}")
    pv = _peer_versions(results)
    if pv:
        lines += ["", f"Peers: {pv}."]
    lines.append("")
    num = 0
    for section, (title, about) in SECTIONS.items():
        cells = _cells_for(results, section)
        if not cells:
            continue
        num += 1
        lines += [f"## {num}. {title}", "", about, ""]
        lines += _accuracy_table(cells) if section == "accuracy" else _timing_table(results, cells)
        lines.append("")
        tg = _targets(cells)
        if tg:
            lines += ["Targets:", ""] + tg + [""]
        keys = " ".join(c["key"] for _n, c in cells)
        lines += [f"Cells: `{keys}` (`python benchmarks/run.py run --full --only {keys}`).", ""]
    lines += _reliability(num + 1)
    lines += ["## History", "",
              "Measurements this suite does not repeat on every run, and those of earlier versions, are in the "
              f"report's history, which the other documents cite as *history §N*: `git show {HISTORY_COMMIT}:"
              "docs/benchmarks.md`. Each section there gives the script and command that measured it "
              "([benchmarks/README.md](../benchmarks/README.md) lists the scripts).", "",
              "| § | capability | script |", "|---|---|---|"]
    lines += [f"| {i} | {what} | `{script}` |" for i, (what, script) in enumerate(HISTORY, start=1)]
    lines += ["", "Not part of any run of the suite: `hpc-graph plan` against measured runs (36 configurations, "
              "hours; [plan.md](plan.md), records in `benchmarks/measured/scripts/bench_plan.json`), and the GPU "
              "path (`bash benchmarks/gpu/run_gpu_checks.sh` on a machine with an NVIDIA GPU).", ""]
    return "\n".join(lines).rstrip() + "\n"


def _reliability(num: int, folder: Path = MEASURED / "scripts") -> list[str]:
    """The fault matrix, the checksums' cost and the soak, from ``benchmarks/fault_matrix.py``,
    ``benchmarks/checksum_cost.py`` and ``benchmarks/soak.py`` (their results in ``benchmarks/measured/scripts/``),
    when measured."""
    faults, sums, soak = folder / "faults.json", folder / "checksums.json", folder / "soak.json"
    if not faults.is_file() and not sums.is_file() and not soak.is_file():
        return []
    lines = [f"## {num}. Reliability: injected faults, checksums" + (", soak" if soak.is_file() else ""), ""]
    if faults.is_file():
        import importlib.util

        spec = importlib.util.spec_from_file_location("fault_matrix", Path(__file__).with_name("fault_matrix.py"))
        fm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fm)
        lines += ["Every engine, every fault, injected for real into a 2-rank job (`single`: 1 rank) of a 600-node "
                  "CSBM graph; each cell the exit status and the seconds from the fault to the end of the job (for "
                  "faults present from the start, from the launch). The column head says the documented status "
                  "(docs/configuration.md); a cell in bold departs from it. The damaged inputs (`flip_byte`, "
                  "`nan_feature`) are rank 1's: a rank other than 0 reports an input error after a 3 s wait, so "
                  "that one every rank meets is printed once (by rank 0).", "",
                  fm.render(json.loads(faults.read_text())), "",
                  "Command: `python benchmarks/fault_matrix.py` (results: "
                  "`benchmarks/measured/scripts/faults.json`, with each case's first error line).", ""]
    if sums.is_file():
        c = json.loads(sums.read_text())
        w, wo = c["with"], c["without"]
        lines += [f"What the checksums cost on R-MAT scale {c['scale']} ({c['feat_bytes'] / 2**20:.0f} MiB of "
                  "features): each variant in a fresh process, alternating, "
                  f"{c['rounds']} rounds; median seconds (spread = (max - min) / median).", "",
                  "| | with checksums | without | ratio |", "|---|---|---|---|",
                  f"| write (`write_rmat`: generate, write, digest) | {w['write']['median']:.2f} s "
                  f"({w['write']['spread']:.0%}) | {wo['write']['median']:.2f} s ({wo['write']['spread']:.0%}) | "
                  f"{c['write_ratio']:.3f} |",
                  f"| load (structure, labels, all features) | {w['load']['median']:.2f} s "
                  f"({w['load']['spread']:.0%}) | {wo['load']['median']:.2f} s ({wo['load']['spread']:.0%}) | "
                  f"{c['load_ratio']:.3f} |",
                  f"| NaN/Inf scan of the features at load | {w['scan']['median']:.3f} s | | |",
                  "", "File size: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in c["file_bytes"].items())
                  + ". Command: `python benchmarks/checksum_cost.py --scale "
                  f"{c['scale']} --rounds {c['rounds']}`.", "",
                  "Target: at most 5 % on writing and on loading: "
                  + ", ".join(f"{k} {c[f'{k}_ratio'] - 1:+.1%} ({'met' if c[f'{k}_ratio'] <= 1.05 else '**not met**'})"
                              for k in ("write", "load"))
                  + ". What is left is HDF5's own Fletcher32, computed on every chunk written and verified on every "
                  "chunk read, single-threaded (on this machine a chunked float32 array reads at 0.9 GB/s with the "
                  "filter and 1.7 GB/s without), and sha256 over the content as it is written (1.3 GB/s; the "
                  "digests are fed the rows in memory, not read back). Loading from the page cache is the worst "
                  "case: from a parallel file system the read itself dominates.", ""]
    if soak.is_file():
        s = json.loads(soak.read_text())
        per = ", ".join(f"`{e}` {v['equal']}/{v['jobs']}" for e, v in sorted(s["per_engine"].items()))
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(s["exit_codes"].items(), key=lambda kv: int(kv[0])))
        lines += [f"Soak: {s['minutes']:g} minutes of jobs on random engines, each started afresh with "
                  "`--resume-if-possible` and, at a random moment, let finish, preempted (SIGTERM to every process) "
                  "or hit by SIGKILL on one rank, then resubmitted until it exits 0 "
                  f"({s['jobs']} jobs, {s['launches']} launches, {s['sigterm']} SIGTERM, {s['sigkill']} SIGKILL; exit "
                  f"statuses {codes}). Jobs whose final weights equal an uninterrupted run's bit for bit: "
                  f"{s['equal']} of {s['jobs']} ({per}); different: {len(s['different'])}; failed (hang, an "
                  f"undocumented status, or more than 40 launches): {len(s['failed'])}"
                  + (" (" + ", ".join(f"`{f['engine']}` " + (f"status {f['rc']}" if "rc" in f else f["why"])
                                      for f in s["failed"]) + ")" if s["failed"] else "") + ".", "",
                  f"Command: `python benchmarks/soak.py --minutes {s['minutes']:g} --seed {s['seed']}` (results: "
                  "`benchmarks/measured/scripts/soak.json`).", ""]
    return lines


HISTORY_COMMIT = "823dcba"
HISTORY = (("data pipeline: generation, conversion, HDF5 reads", "bench_generate.py"),
           ("kernels: SpMM, SDDMM, edge softmax, gathers", "hpc-graph bench kernels"),
           ("full-batch training: equivalence, speed and memory per rank, memory breakdown", "bench_training.py"),
           ("threads per rank", "bench_threads.py"),
           ("`sylvie`: accuracy, bytes, modelled links, bit policy", "bench_sylvie.py"),
           ("`minibatch`: accuracy, peers, `hec`/`exact`/`drop` on 2 and 4 ranks", "bench_minibatch.py"),
           ("model zoo: accuracy, speed, RevGCN memory, R-GCN", "bench_models.py"),
           ("against DGL: epochs and kernels", "bench_training.py --dgl"),
           ("graph transformers: attention, `seqpar`, accuracy, graph tasks, cluster layout", "bench_attention.py"),
           ("`apt`: strategy matrices, cost model, dry run", "bench_apt.py"),
           ("distributed partitioning", "bench_dist_partition.py"),
           ("`hpc-graph plan` against measured runs", "bench_plan.py"),
           ("`flow`: memory per stage, idle fraction, accuracy, LM co-training", "bench_flow.py"),
           ("the GPU path", "gpu/run_gpu_checks.sh"))

README_BEGIN = "<!-- peers table: generated by `python benchmarks/run.py render` from benchmarks/measured/ -->"
README_END = "<!-- end of generated peers table -->"


def readme_table(results: dict[str, dict]) -> str:
    """README's comparison with DGL and PyG: the full profile's one-process cells at scale 18."""
    cells = [(n, c) for n, c in _cells_for(results, "peers") if c["key"].endswith("-s18")
             and not c["key"].startswith("peers-plain-") and results[n]["profile"] == "full"]
    plain = {c["key"].replace("peers-plain-", "peers-"): c for _n, c in _cells_for(results, "peers")
             if c["key"].startswith("peers-plain-")}
    if not cells:
        raise ValueError("no full-profile results with the scale-18 peer cells in benchmarks/measured/: README's "
                         "table is rendered from them")
    rows = ["| model, R-MAT scale 18 | epoch vs DGL, both with huge pages (round spread) | epoch vs DGL as "
            "installed | net memory vs DGL | epoch vs PyG |", "|---|---|---|---|---|"]

    def speed(c: dict) -> str:
        return f"{_f(c.get('speed'), '.2f', 'x')} ({_pct(c.get('speed_spread'))})" if c.get("speed") else "not run"

    for _name, cell in cells:
        by_ref = {c["reference"]: c for c in cell["comparisons"]}
        by_ref.update({c["reference"]: c for c in plain.get(cell["key"], {}).get("comparisons", [])})
        dgl, as_installed, pyg = (by_ref.get(k, {}) for k in ("DGL", "DGL without huge pages", "PyG"))
        rows.append(f"| {cell['title'].split(', R-MAT')[0]} | {speed(dgl)} | {speed(as_installed)} | "
                    f"{_f(dgl.get('memory_net'), '.2f', 'x')} | {speed(pyg)} |")
    return "\n".join([README_BEGIN, *rows, README_END])


def with_readme_table(text: str, table: str) -> str:
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < a:
        raise ValueError(f"{README}: the markers of the generated peers table are missing")
    return text[:a] + table + text[b + len(README_END):]


def cmd_render(args: argparse.Namespace) -> int:
    if args.results:
        results = {}
        for p in args.results:
            path = Path(p)
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise SystemExit(f"--results: cannot read {path}: {exc}") from None
            validate(doc, str(path))
            results[path.stem] = doc
    else:
        results = load_results(Path(args.measured))
    if not results:
        raise SystemExit(f"no results files in {args.measured} (python benchmarks/run.py run --quick --out ...)")
    report = render(results)
    out = Path(args.out)
    targets = [(out, report)]
    if not args.results and any(d["profile"] == "full" for d in results.values()):
        targets.append((README, with_readme_table(README.read_text(), readme_table(results))))
    stale = [str(p) for p, text in targets if not p.exists() or p.read_text() != text]
    if args.check:
        if stale:
            print(f"out of date with the results: {', '.join(stale)} (python benchmarks/run.py render)",
                  file=sys.stderr)
            return 1
        return 0
    for p, text in targets:
        p.write_text(text)
    print(f"wrote {', '.join(str(p) for p, _ in targets)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure a profile")
    prof = r.add_mutually_exclusive_group(required=True)
    prof.add_argument("--quick", action="store_true", help="one row per engine and per peer (<= 15 min, 2 cores)")
    prof.add_argument("--full", action="store_true", help="every table of the report")
    r.add_argument("--out", required=True, help="results file (JSON), rewritten after every cell")
    r.add_argument("--only", nargs="+", default=None, help="these cells of the profile only")
    r.add_argument("--rounds", type=int, default=3, help="runs of each side, interleaved (default 3)")
    r.add_argument("--work", default=str(REPO / "results" / "suite_work"), help="generated data (kept)")
    r.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="CPU threads shared by a run's "
                   "ranks (default: this process's CPUs)")
    r.add_argument("--scale-shift", type=int, default=0, help="add to every R-MAT scale (negative: a smoke run)")
    r.add_argument("--epochs", type=int, default=None, help="epochs of every run (default: each cell's)")
    r.add_argument("--no-peers", action="store_true", help="record the DGL / PyG sides as skipped")
    r.add_argument("--no-floors", action="store_true", help="no process-floor runs (no net memory; a smoke run)")
    rd = sub.add_parser("render", help="docs/benchmarks.md (and README's table) from results files")
    rd.add_argument("--measured", default=str(MEASURED), help="folder of committed results files")
    rd.add_argument("--results", nargs="+", default=None, help="render these files instead (README untouched)")
    rd.add_argument("--out", default=str(REPORT))
    rd.add_argument("--check", action="store_true", help="exit 1 when the files differ from what would be written")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.cmd == "run":
        if args.rounds < 1 or args.cores < 1 or (args.epochs is not None and args.epochs < 2):
            ap.error("--rounds and --cores must be >= 1, --epochs >= 2")
        doc = run_profile(args)
        bad = sum(s.get("failed", 0) for c in doc["cells"] for s in c["sides"].values())
        print(f"wrote {args.out}: {len(doc['cells'])} cells in {doc['seconds'] / 60:.1f} min"
              + (f", {bad} failed runs" if bad else ""))
        return 1 if bad else 0
    return cmd_render(args)


if __name__ == "__main__":
    sys.exit(main())
