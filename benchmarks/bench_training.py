"""Benchmark: full-batch training with the single, dp and sar engines (and PyG, DGL) on R-MAT graphs.

    python benchmarks/bench_training.py --scales 18 20 --ranks 1 2 4 --models gcn sage gat \\
        --engines single dp sar --epochs 5 --workdir DIR --out results/bench_training.json

For every scale the dataset is generated once (``hpc-graph generate rmat --scale S
--edge-factor 16 --feat-dim 128 --num-classes 16``) and METIS-partitioned once per
rank count (``hpc-graph partition ... --method metis``); existing files are reused.
Every configuration then runs as its own job::

    mpiexec -n N python -m hpc_graph.cli train --config DIR/bench_<model>.yaml --set ... --run-dir ...

with ``OMP_NUM_THREADS = NUMBA_NUM_THREADS = max(1, cores // N)`` (``--cores``,
default: this machine's CPU count) and ``OMP_WAIT_POLICY=PASSIVE``
(``--omp-wait-policy``): torch's OpenMP pool and numba's (a second OpenMP
runtime) otherwise spin-wait for each other's cores after every parallel
region, which made epochs 2-3x slower on a busy 2-core machine, PyG's too
(torch's pool against other processes). Every run also gets
``MALLOC_MMAP_THRESHOLD_=1048576`` (``--malloc-mmap-threshold``, 0 = glibc's
default): glibc raises its mmap threshold to 32 MiB after the first large
free, so the many 1-32 MiB halo/block buffers then fragment the heap and the
peak RSS of a rank drifted up by up to 500 MiB from epoch to epoch (GAT,
scale 18, 4 ranks), differently on every rank and run. ``sar`` runs twice, without and with
prefetch (``--sar-prefetch``). ``single`` runs on one rank only, next to the
PyG reference (``benchmarks/pyg_baseline.py``, same model, widths, Adam and
epochs, same threads) unless ``--no-pyg``, and the DGL 2.1 reference
(``benchmarks/dgl_baseline.py`` run by ``--dgl-python``, default
``.venv-dgl/bin/python``: the same models with ``dgl.nn`` layers, same threads
through ``OMP_NUM_THREADS``, ``torch.set_num_threads`` and
``dgl.utils.set_num_threads``) unless ``--no-dgl`` (default: on when that
interpreter exists).

Models: 3-layer GCN (symmetric normalisation with self loops, hidden 128),
GraphSAGE (mean, hidden 128) and GAT (4 heads x 32, one output head), dropout
0.5, Adam lr 0.01, no weight decay, raw features.

Per run the record holds the epoch times of the slowest rank, their median
over epochs 2..E (epoch 1 compiles the kernels), the peak RSS of every rank
(``summary.json``; PyG: ``ru_maxrss`` of its process), the sampled peak of the
whole process tree, bytes sent, the exact command, threads and the load
average before and after. A run that exceeds ``--timeout`` seconds or whose
process tree exceeds ``--mem-limit-gb`` is killed and recorded as skipped with
the reason; one predicted (from the same configuration one or two scales
below, x2 per scale step) to exceed either is skipped without running.

Every configuration also runs at ``--floor-scale`` (default 10: 1024 nodes):
its peak RSS is the per-process floor (Python, torch, numba kernels, MPI,
about 0.45-0.6 GiB), and the memory targets are reported both raw and above
that floor.

A run whose epochs 2..E differ by more than ``--noise-limit`` (1.5x), or
that got less than half of the cores it could use (CPU over wall seconds),
was disturbed by other load: it is repeated up to ``--repeat-noisy`` times and
the fastest attempt kept (the others are listed in its record).

Results are merged into ``--out`` (one JSON record per run, keyed by scale,
model, engine, prefetch and ranks; re-running a configuration replaces its
record; ``--skip-done`` keeps finished ones), written after every run. The
``targets`` section checks the targets of the training benchmark (PyG and DGL: ours against each on one
process, epoch time and peak RSS, raw and above the floor); ``comparison`` holds
the 1-rank table printed at the end (ours vs DGL vs PyG per scale and model); plots go to
``<out stem>_s<S>_<model>/scaling.png`` (median epoch time and peak memory per
rank against ranks, one line per engine, via
``hpc_graph.train.report.plot_compare``) and ``compare_curves.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = {"gcn": 128, "sage": 128, "gat": 32}
MODELS = ("gcn", "sage", "gat")
DGL_PYTHON = ROOT / ".venv-dgl" / "bin" / "python"
HEADS = 4
LAYERS = 3
_BASE_RSS_MB = 600.0  # imports + kernel compilation of one training process (measured at scale 14)


# -- helpers ---------------------------------------------------------------------------------
def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load average: {_load()}"


def _mem_available_gb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def _tree_rss_mb(pid: int) -> float:
    """Resident memory (MiB) of process ``pid`` and all its descendants, 0 when gone."""
    try:
        import psutil
    except ImportError:
        return 0.0
    try:
        proc = psutil.Process(pid)
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _kill_group(proc: subprocess.Popen) -> None:
    """End the job started by us (its own session) with SIGTERM, then SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_job(cmd: list[str], env: dict[str, str], log_path: Path, timeout: float,
             mem_limit_mb: float) -> dict[str, Any]:
    """Run ``cmd`` in its own session, watching wall time and the tree's RSS.

    Returns ``{"rc", "wall_s", "cpu_s", "job_maxrss_mb", "tree_peak_rss_mb", "killed", "stdout_tail"}``:
    ``cpu_s`` (user + system) and ``job_maxrss_mb`` (largest process) come from ``wait4`` and
    cover every process of the job (mpiexec waits for its proxies, they for the ranks);
    ``tree_peak_rss_mb`` is the sampled (4/s) peak of the summed RSS of the tree; ``killed``
    is None, ``"timeout"`` or ``"memory"``.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    usage = None
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
                                start_new_session=True)
        peak, killed = 0.0, None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid != 0:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            rss = _tree_rss_mb(proc.pid)
            peak = max(peak, rss)
            if killed is None and rss > mem_limit_mb:
                killed = "memory"
            elif killed is None and time.perf_counter() - t0 > timeout:
                killed = "timeout"
            if killed is not None:
                _kill_group(proc)  # reaps the child; its usage is lost, which is fine for a killed run
                usage = None
                break
            time.sleep(0.25)
    wall = time.perf_counter() - t0
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return {"rc": proc.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1) if usage is not None else None,
            "job_maxrss_mb": round(usage.ru_maxrss / 1024, 1) if usage is not None else None,
            "tree_peak_rss_mb": round(peak, 1), "killed": killed, "stdout_tail": text[-2000:]}


def _last_json(log_path: Path) -> dict[str, Any] | None:
    """The last line of a log that parses as a JSON object (a baseline script's result), or None."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _check_call(cmd: list[str], what: str, timeout: float) -> None:
    print(f"{what}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    print(f"  done in {time.perf_counter() - t0:.1f} s: {proc.stdout.strip().splitlines()[0] if proc.stdout else ''}",
          flush=True)


def _hpc_graph() -> list[str]:
    return [sys.executable, "-m", "hpc_graph.cli"]


# -- data ------------------------------------------------------------------------------------
def dataset_path(workdir: Path, scale: int) -> Path:
    return workdir / f"rmat-s{scale}-ef16-f128.h5"


def partition_dir(workdir: Path, scale: int, parts: int) -> Path:
    return workdir / f"rmat-s{scale}-metis-{parts}"


def prepare_data(workdir: Path, scale: int, parts: list[int], timeout: float) -> dict[str, Any]:
    """Generate the scale-``scale`` dataset and its METIS partitions (reused when present); their stats."""
    src = dataset_path(workdir, scale)
    if not src.exists():
        _check_call(_hpc_graph() + ["generate", "rmat", "-o", str(src), "--scale", str(scale), "--edge-factor",
                                    "16", "--feat-dim", "128", "--num-classes", "16"], f"generate scale {scale}",
                    timeout)
    from data_io.dataset import open_dataset

    with open_dataset(str(src)) as ds:
        info: dict[str, Any] = {"path": str(src), "num_nodes": int(ds.num_nodes), "num_edges": int(ds.num_edges),
                                "size_bytes": src.stat().st_size, "partitions": {}}
    for p in parts:
        out = partition_dir(workdir, scale, p)
        if not (out / "partition.json").exists():
            _check_call(_hpc_graph() + ["partition", str(src), "-o", str(out), "-n", str(p), "--method", "metis",
                                        "--force"], f"partition scale {scale} into {p}", timeout)
        meta = json.loads((out / "partition.json").read_text())
        info["partitions"][str(p)] = {k: meta.get(k) for k in ("edge_cut", "edge_cut_fraction", "balance",
                                                               "replication_factor")}
    return info


def write_configs(workdir: Path, epochs: int) -> dict[str, Path]:
    """One YAML per model in ``workdir`` (data path and engine are set per run with --set)."""
    paths = {}
    for model in MODELS:
        text = (f"# written by benchmarks/bench_training.py\n"
                f"data: {{path: PLACEHOLDER, feature_norm: none}}\n"
                f"engine: {{name: single, prefetch: false}}\n"
                f"model: {{name: {model}, hidden: {HIDDEN[model]}, num_layers: {LAYERS}, heads: {HEADS}, "
                f"out_heads: 1, dropout: 0.5, attn_dropout: 0.0}}\n"
                f"optim: {{name: adam, lr: 0.01, weight_decay: 0.0}}\n"
                f"train: {{epochs: {epochs}, seed: 0, eval_every: {epochs}, progress: false}}\n")
        path = workdir / f"bench_{model}.yaml"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        paths[model] = path
    return paths


# -- runs ------------------------------------------------------------------------------------
def _key(rec: dict[str, Any]) -> tuple:
    return (rec["scale"], rec["model"], _label(rec["engine"], rec.get("prefetch"), rec.get("adj")), rec["ranks"])


def _label(engine: str, prefetch: bool | None, adj: str | None = None) -> str:
    if engine == "pyg" and adj == "csr":
        return "pyg-csr"
    return "sar+prefetch" if engine == "sar" and prefetch else engine


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The configurations to run, in order: per scale, per model, per ranks, per engine."""
    prefetches = {"off": [False], "on": [True], "both": [False, True]}[args.sar_prefetch]
    out = []
    for scale in args.scales:
        for model in args.models:
            for n in args.ranks:
                for engine in args.engines:
                    if engine == "single":
                        if n == 1:
                            out.append({"scale": scale, "model": model, "engine": "single", "prefetch": None,
                                        "ranks": 1})
                            for adj in (args.pyg_adj if args.pyg else []):
                                if adj == "csr" and model != "sage":
                                    continue  # GATConv needs edge_index (self loops)
                                out.append({"scale": scale, "model": model, "engine": "pyg", "prefetch": None,
                                            "adj": adj, "ranks": 1})
                            if args.dgl:
                                out.append({"scale": scale, "model": model, "engine": "dgl", "prefetch": None,
                                            "ranks": 1})
                        continue
                    for pf in (prefetches if engine == "sar" else [None]):
                        out.append({"scale": scale, "model": model, "engine": engine, "prefetch": pf, "ranks": n})
    return out


def _threads(args: argparse.Namespace, ranks: int) -> int:
    return max(1, args.cores // ranks)


def _env(threads: int, wait_policy: str, mmap_threshold: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if mmap_threshold > 0:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy != "unset":
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    env.setdefault("PYTHONPATH", str(ROOT))
    return env


def _env_text(threads: int, wait_policy: str, mmap_threshold: int) -> str:
    text = f"OMP_NUM_THREADS={threads} NUMBA_NUM_THREADS={threads}"
    text += f" OMP_WAIT_POLICY={wait_policy.upper()}" if wait_policy != "unset" else ""
    return text + (f" MALLOC_MMAP_THRESHOLD_={mmap_threshold}" if mmap_threshold > 0 else "")


def command(cfg: dict[str, Any], args: argparse.Namespace, configs: dict[str, Path], run_dir: Path) -> list[str]:
    """The exact command line of one configuration."""
    scale, model, engine, n = cfg["scale"], cfg["model"], cfg["engine"], cfg["ranks"]
    if engine == "pyg":
        cmd = [sys.executable, str(ROOT / "benchmarks" / "pyg_baseline.py"), str(dataset_path(args.workdir, scale)),
               "--model", model, "--hidden", str(HIDDEN[model]), "--heads", str(HEADS), "--num-layers",
               str(LAYERS), "--epochs", str(args.epochs), "--adj", cfg["adj"], "--run-dir", str(run_dir)]
        return cmd
    if engine == "dgl":
        return [str(args.dgl_python), str(ROOT / "benchmarks" / "dgl_baseline.py"),
                str(dataset_path(args.workdir, scale)), "--model", model, "--hidden", str(HIDDEN[model]),
                "--heads", str(HEADS), "--num-layers", str(LAYERS), "--epochs", str(args.epochs),
                "--idtype", args.dgl_idtype, "--threads", str(_threads(args, n)), "--run-dir", str(run_dir)]
    data = dataset_path(args.workdir, scale) if engine == "single" else partition_dir(args.workdir, scale, n)
    sets = [f"data.path={data}", f"engine.name={engine}", f"engine.prefetch={str(bool(cfg['prefetch'])).lower()}"]
    cmd = ["mpiexec", "-n", str(n)] + _hpc_graph() + ["train", "--config", str(configs[model])]
    for s in sets:
        cmd += ["--set", s]
    return cmd + ["--run-dir", str(run_dir)]


def _prediction(cfg: dict[str, Any], done: dict[tuple, dict[str, Any]]) -> dict[str, float] | None:
    """Wall time and tree RSS of this configuration extrapolated (x2 per scale step) from the same
    configuration measured at most two scales below; None when there is none."""
    best = None
    want = _key(cfg)[1:]
    for key, rec in done.items():
        scale = key[0]
        if key[1:] == want and cfg["scale"] - 2 <= scale < cfg["scale"] and rec.get("status") == "ok" \
                and (best is None or scale > best["scale"]):
            best = rec
    if best is None:
        return None
    f = 2.0 ** (cfg["scale"] - best["scale"])
    base = _BASE_RSS_MB * cfg["ranks"]
    rss = best.get("tree_peak_rss_mb") or 0.0
    return {"from_scale": best["scale"], "wall_s": best["wall_s"] * f, "tree_rss_mb": base + max(rss - base, 0) * f}


def _noisy(rec: dict[str, Any], limit: float, cores: int | None = None) -> bool:
    """True when other load disturbed the run: the slowest and fastest of epochs 2..E differ by
    more than ``limit`` x, or the job got less than half of the cores it could use (CPU seconds
    over wall seconds x min(cores, ranks x threads))."""
    steady = rec.get("epoch_seconds", [])[1:]
    if len(steady) > 1 and min(steady) > 0 and max(steady) / min(steady) > limit:
        return True
    cpu, wall = rec.get("cpu_s"), rec.get("wall_s")
    usable = min(cores or os.cpu_count() or 1, rec["ranks"] * rec.get("threads_per_rank", 1))
    return bool(cpu and wall and cpu / (wall * usable) < 0.5)


def _median_steady(seconds: list[float]) -> float | None:
    steady = seconds[1:] if len(seconds) > 1 else seconds
    return statistics.median(steady) if steady else None


def collect(cfg: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Numbers of a finished run from its metrics and summary.json."""
    from hpc_graph.train.report import load_run, summarize

    run = load_run(run_dir)
    s = summarize(run)
    per_epoch = []
    for e in run.epochs:
        vals = [r["epoch_seconds"] for r in run.rows if r["epoch"] == e and r.get("epoch_seconds") is not None]
        per_epoch.append(max(vals))
    summary = run.summary or {}
    peaks = summary.get("peak_rss_mb") or s["peak_rss_mb_per_rank"]
    return {"epoch_seconds": [round(x, 4) for x in per_epoch],
            "median_epoch_s": _median_steady(per_epoch),
            "median_epoch_s_all_epochs": s["median_epoch_seconds"],
            "peak_rss_mb_per_rank": [round(x, 1) for x in peaks],
            "max_peak_rss_mb": round(max(peaks), 1),
            "mean_peak_rss_mb": round(sum(peaks) / len(peaks), 1),
            "median_comm_s_per_rank": s["median_comm_seconds_per_rank"],
            "bytes_per_epoch": s["bytes_per_epoch"], "final_loss": s["final_loss"],
            "final_test_acc": s["final_test_acc"]}


def run_one(cfg: dict[str, Any], args: argparse.Namespace, configs: dict[str, Path],
            done: dict[tuple, dict[str, Any]], attempt: int = 0) -> dict[str, Any]:
    label = _label(cfg["engine"], cfg["prefetch"], cfg.get("adj"))
    name = f"s{cfg['scale']}-{cfg['model']}-{label.replace('+', '-')}-n{cfg['ranks']}"
    name += f"-try{attempt + 1}" if attempt else ""
    run_dir = args.workdir / "runs" / name
    threads = _threads(args, cfg["ranks"])
    cmd = command(cfg, args, configs, run_dir)
    env_text = _env_text(threads, args.omp_wait_policy, args.malloc_mmap_threshold)
    rec = {**cfg, "label": label, "threads_per_rank": threads, "omp_wait_policy": args.omp_wait_policy,
           "malloc_mmap_threshold": args.malloc_mmap_threshold,
           "epochs": args.epochs, "run_dir": str(run_dir),
           "command": env_text + " " + " ".join(shlex.quote(c) for c in cmd)}
    mem_limit_mb = args.mem_limit_gb * 1024
    for key, old in done.items():  # too big at a smaller scale: too big here
        if key[1:] == _key(cfg)[1:] and key[0] < cfg["scale"] and old.get("status") == "skipped":
            return {**rec, "status": "skipped", "reason": f"skipped at scale {key[0]}: {old.get('reason')}"}
    pred = _prediction(cfg, done)
    if pred is not None:
        rec["predicted"] = {k: round(v, 1) for k, v in pred.items()}
        if pred["wall_s"] > args.timeout:
            return {**rec, "status": "skipped", "reason": f"predicted {pred['wall_s']:.0f} s (from scale "
                    f"{pred['from_scale']}) > --timeout {args.timeout:.0f} s"}
        if pred["tree_rss_mb"] > mem_limit_mb:
            return {**rec, "status": "skipped", "reason": f"predicted {pred['tree_rss_mb'] / 1024:.1f} GiB (from "
                    f"scale {pred['from_scale']}) > --mem-limit-gb {args.mem_limit_gb:.1f}"}
    avail = _mem_available_gb() * 1024
    limit = min(mem_limit_mb, 0.95 * avail)
    rec["load_avg_before"] = _load()
    if run_dir.exists():
        for f in run_dir.glob("*"):
            if f.is_file():
                f.unlink()
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {rec['command']}", flush=True)
    env = _env(threads, args.omp_wait_policy, args.malloc_mmap_threshold)
    if cfg["engine"] in ("pyg", "dgl"):
        # peers run as their users run them: torch's huge-page switch (which importing hpc_graph,
        # here and in our runs, turns on) only with --peer-thp on
        env.pop("THP_MEM_ALLOC_ENABLE", None)
        if args.peer_thp == "on":
            env["THP_MEM_ALLOC_ENABLE"] = "1"
        rec["peer_thp"] = args.peer_thp
    res = _run_job(cmd, env, args.workdir / "logs" / f"{name}.log", args.timeout, limit)
    rec["load_avg_after"] = _load()
    for k in ("wall_s", "cpu_s", "job_maxrss_mb", "tree_peak_rss_mb"):
        rec[k] = res[k]
    if res["killed"] == "timeout":
        return {**rec, "status": "skipped", "reason": f"killed after --timeout {args.timeout:.0f} s"}
    if res["killed"] == "memory":
        return {**rec, "status": "skipped", "reason": f"killed: process tree above {limit / 1024:.1f} GiB "
                f"(--mem-limit-gb {args.mem_limit_gb:.1f}, MemAvailable {avail / 1024:.1f} GiB)"}
    if res["rc"] != 0 or not (run_dir / "summary.json").exists():
        return {**rec, "status": "failed", "reason": f"exit status {res['rc']}", "log_tail": res["stdout_tail"]}
    rec.update(collect(cfg, run_dir))
    if cfg["engine"] in ("pyg", "dgl"):
        keep = {"pyg": ("adj", "torch_threads", "load_seconds"),
                "dgl": ("idtype", "init", "formats", "graph_edges", "self_loops", "torch_threads", "dgl_threads",
                        "load_seconds", "graph_seconds", "versions")}[cfg["engine"]]
        last = _last_json(args.workdir / "logs" / f"{name}.log")
        if last:
            rec[cfg["engine"]] = {k: v for k, v in last.items() if k in keep}
    rec["status"] = "ok"
    return rec


# -- evaluation against the targets ----------------------------------------------------------------
def _find(records: list[dict[str, Any]], **kw) -> dict[str, Any] | None:
    for r in records:
        if r.get("status") == "ok" and all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _net(records: list[dict[str, Any]], rec: dict[str, Any], floor_scale: int | None) -> float | None:
    """Peak RSS per rank of ``rec`` above the floor: the same configuration's peak at ``floor_scale``."""
    if not floor_scale:
        return None
    base = _find(records, scale=floor_scale, model=rec["model"], label=rec["label"], ranks=rec["ranks"])
    return round(rec["max_peak_rss_mb"] - base["max_peak_rss_mb"], 1) if base else None


def targets(records: list[dict[str, Any]], floor_scale: int | None = None) -> list[dict[str, Any]]:
    """The targets (SAR's memory against dp, ours against PyG and DGL), checked on whatever has been measured (memory
    also net of the floor)."""
    out = []
    scales = sorted({r["scale"] for r in records} - {floor_scale})
    ranks_all = sorted({r["ranks"] for r in records})
    for s in scales:
        for pf in (False, True):
            lab = _label("sar", pf)
            dp = _find(records, scale=s, model="gat", engine="dp", ranks=4)
            sar = _find(records, scale=s, model="gat", engine="sar", prefetch=pf, ranks=4)
            if dp and sar:
                r = _ratio(sar["max_peak_rss_mb"], dp["max_peak_rss_mb"])
                out.append({"goal": f"s{s} GAT 4 ranks: peak RSS per rank {lab} / dp <= 0.6",
                            "value": r, "met": r is not None and r <= 0.6})
                net = _ratio(_net(records, sar, floor_scale), _net(records, dp, floor_scale))
                if net is not None:
                    out.append({"goal": f"s{s} GAT 4 ranks: peak RSS per rank above the s{floor_scale} floor, "
                                        f"{lab} / dp <= 0.6", "value": net, "met": net <= 0.6})
            peaks = [(n, _find(records, scale=s, model="gat", engine="sar", prefetch=pf, ranks=n)) for n in ranks_all]
            peaks = [(n, r["max_peak_rss_mb"]) for n, r in peaks if r]
            if len(peaks) > 1:
                falling = all(b[1] < a[1] for a, b in zip(peaks, peaks[1:]))
                out.append({"goal": f"s{s} GAT: {lab} peak RSS per rank falls with more ranks",
                            "value": {str(n): v for n, v in peaks}, "met": falling})
            for n in ranks_all:
                dp = _find(records, scale=s, model="sage", engine="dp", ranks=n)
                sar = _find(records, scale=s, model="sage", engine="sar", prefetch=pf, ranks=n)
                if dp and sar:
                    r = _ratio(sar["median_epoch_s"], dp["median_epoch_s"])
                    out.append({"goal": f"s{s} SAGE {n} ranks: epoch time {lab} / dp <= 1.3",
                                "value": r, "met": r is not None and r <= 1.3})
        for model, want in (("sage", 2.0), ("gat", 3.0)):
            one = _find(records, scale=s, model=model, engine="single", ranks=1)
            pyg = _find(records, scale=s, model=model, engine="pyg", adj="edge_index", ranks=1)
            if one and pyg:
                r = _ratio(pyg["median_epoch_s"], one["median_epoch_s"])
                out.append({"goal": f"s{s} {model.upper()}: single >= {want:g}x faster than PyG", "value": r,
                            "met": r is not None and r >= want})
                m = _ratio(one["max_peak_rss_mb"], pyg["max_peak_rss_mb"])
                out.append({"goal": f"s{s} {model.upper()}: single peak RSS < PyG", "value": m,
                            "met": m is not None and m < 1.0})
        for model in MODELS:  # full-batch CPU training: ours against DGL 2.1
            one = _find(records, scale=s, model=model, engine="single", ranks=1)
            dgl = _find(records, scale=s, model=model, engine="dgl", ranks=1)
            if one and dgl:
                r = _ratio(one["median_epoch_s"], dgl["median_epoch_s"])
                out.append({"goal": f"s{s} {model.upper()}: single epoch time / DGL < 1", "value": r,
                            "met": r is not None and r < 1.0})
                m = _ratio(one["max_peak_rss_mb"], dgl["max_peak_rss_mb"])
                out.append({"goal": f"s{s} {model.upper()}: single peak RSS / DGL < 1", "value": m,
                            "met": m is not None and m < 1.0})
                net = _ratio(_net(records, one, floor_scale), _net(records, dgl, floor_scale))
                if net is not None:
                    out.append({"goal": f"s{s} {model.upper()}: single peak RSS above the s{floor_scale} "
                                        f"floor / DGL's < 1", "value": net, "met": net < 1.0})
    return out


def comparison(records: list[dict[str, Any]], floor_scale: int | None = None) -> list[dict[str, Any]]:
    """One row per (scale, model) with a 1-rank ``single`` run: its epoch time and peak RSS next to
    DGL's and PyG's (edge_index), the ratios ours / theirs (< 1: ours faster / smaller) and the
    peaks above each process's own floor (the same configuration at ``floor_scale``)."""
    rows = []
    for s in sorted({r["scale"] for r in records} - {floor_scale}):
        for model in MODELS:
            one = _find(records, scale=s, model=model, engine="single", ranks=1)
            if not one:
                continue
            row: dict[str, Any] = {"scale": s, "model": model, "threads": one.get("threads_per_rank"),
                                   "ours_epoch_s": one["median_epoch_s"], "ours_peak_mb": one["max_peak_rss_mb"],
                                   "ours_net_peak_mb": _net(records, one, floor_scale)}
            for name, rec in (("dgl", _find(records, scale=s, model=model, engine="dgl", ranks=1)),
                              ("pyg", _find(records, scale=s, model=model, engine="pyg", adj="edge_index",
                                            ranks=1))):
                if rec is None:
                    continue
                net = _net(records, rec, floor_scale)
                row.update({f"{name}_epoch_s": rec["median_epoch_s"], f"{name}_peak_mb": rec["max_peak_rss_mb"],
                            f"{name}_net_peak_mb": net,
                            f"epoch_ours_over_{name}": _ratio(one["median_epoch_s"], rec["median_epoch_s"]),
                            f"peak_ours_over_{name}": _ratio(one["max_peak_rss_mb"], rec["max_peak_rss_mb"]),
                            f"net_peak_ours_over_{name}": _ratio(row["ours_net_peak_mb"], net)})
            rows.append(row)
    return rows


def comparison_table(rows: list[dict[str, Any]], floor_scale: int | None = None) -> str:
    """The 1-rank comparison as text: seconds, MiB, and ours/theirs ratios (net: above the floor)."""
    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    head = (f"{'scale':>5} {'model':5} {'thr':>3} {'ours s':>8} {'DGL s':>8} {'PyG s':>8} {'s/DGL':>6} "
            f"{'s/PyG':>6} {'ours MiB':>8} {'DGL MiB':>8} {'PyG MiB':>8} {'MiB/DGL':>7} {'MiB/PyG':>7} "
            f"{'net/DGL':>7} {'net/PyG':>7}")
    lines = [f"1-rank comparison (ratios ours/theirs, < 1 is better for ours; net: peak above the "
             f"s{floor_scale} floor of each process)", head]
    for r in rows:
        lines.append(f"{r['scale']:>5} {r['model']:5} {f(r.get('threads'), 'd'):>3} {f(r['ours_epoch_s'], '.3f'):>8} "
                     f"{f(r.get('dgl_epoch_s'), '.3f'):>8} {f(r.get('pyg_epoch_s'), '.3f'):>8} "
                     f"{f(r.get('epoch_ours_over_dgl'), '.3f'):>6} {f(r.get('epoch_ours_over_pyg'), '.3f'):>6} "
                     f"{f(r['ours_peak_mb'], '.0f'):>8} {f(r.get('dgl_peak_mb'), '.0f'):>8} "
                     f"{f(r.get('pyg_peak_mb'), '.0f'):>8} {f(r.get('peak_ours_over_dgl'), '.3f'):>7} "
                     f"{f(r.get('peak_ours_over_pyg'), '.3f'):>7} {f(r.get('net_peak_ours_over_dgl'), '.3f'):>7} "
                     f"{f(r.get('net_peak_ours_over_pyg'), '.3f'):>7}")
    return "\n".join(lines)


# -- output ----------------------------------------------------------------------------------
def plots(records: list[dict[str, Any]], out: Path, skip_scale: int | None = None) -> list[str]:
    """``<out stem>_s<S>_<model>/{scaling,compare_curves}.png`` per scale and model (epochs 2..E)."""
    try:
        from hpc_graph.train.report import load_run, plot_compare
    except ImportError:
        return []
    paths = []
    for s in sorted({r["scale"] for r in records} - {skip_scale}):
        for model in MODELS:
            runs, labels = [], []
            for r in sorted((r for r in records if r["scale"] == s and r["model"] == model and r["status"] == "ok"),
                            key=lambda r: (r["label"], r["ranks"])):
                try:
                    run = load_run(r["run_dir"])
                except Exception:  # noqa: BLE001 - the run directory may have been removed
                    continue
                run.rows = [row for row in run.rows if row["epoch"] >= 2] or run.rows
                run.summary = {**(run.summary or {}), "engine": r["label"]}
                runs.append(run)
                labels.append(f"{r['label']}{r['ranks']}")
            if runs:
                try:
                    paths += [str(p) for p in plot_compare(runs, labels, out.parent / f"{out.stem}_s{s}_{model}")]
                except ImportError:
                    return paths
    return paths


def table(records: list[dict[str, Any]]) -> str:
    lines = [f"{'scale':>5} {'model':5} {'engine':13} {'ranks':>5} {'thr':>3} {'status':8} {'epoch s':>8} "
             f"{'max RSS MiB':>11} {'RSS/rank MiB':28} {'wall s':>7}"]
    for r in sorted(records, key=lambda r: (r["scale"], r["model"], r["ranks"], r["label"])):
        med = f"{r['median_epoch_s']:.3f}" if r.get("median_epoch_s") is not None else "-"
        peak = f"{r['max_peak_rss_mb']:.0f}" if r.get("max_peak_rss_mb") is not None else "-"
        per = ",".join(f"{x:.0f}" for x in r.get("peak_rss_mb_per_rank") or [])
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") is not None else "-"
        lines.append(f"{r['scale']:>5} {r['model']:5} {r['label']:13} {r['ranks']:>5} {r['threads_per_rank']:>3} "
                     f"{r['status']:8} {med:>8} {peak:>11} {per:28} {wall:>7}"
                     + (f"  ({r['reason']})" if r.get("reason") else ""))
    return "\n".join(lines)


def save(out: Path, doc: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=int, nargs="+", default=[18])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=["sage", "gat"])
    ap.add_argument("--engines", nargs="+", choices=("single", "dp", "sar"), default=["single", "dp", "sar"])
    ap.add_argument("--sar-prefetch", choices=("off", "on", "both"), default="both",
                    help="sar runs without and/or with prefetch (default: both)")
    ap.add_argument("--epochs", type=int, default=5, help="epochs per run; the median is over epochs 2..E")
    ap.add_argument("--workdir", type=Path, default=ROOT / "results" / "bench_training_work",
                    help="datasets, partitions, configs, run directories and logs")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_training.json")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (default: %(default)s)")
    ap.add_argument("--mem-limit-gb", type=float, default=None,
                    help="kill a run whose process tree exceeds this (default: 80%% of MemAvailable at start)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                    help="threads per rank = max(1, cores // ranks) (default: CPU count, %(default)s)")
    ap.add_argument("--omp-wait-policy", choices=("passive", "active", "unset"), default="passive",
                    help="OMP_WAIT_POLICY of every run (default: passive; see the module docstring)")
    ap.add_argument("--malloc-mmap-threshold", type=int, default=1 << 20, metavar="BYTES",
                    help="MALLOC_MMAP_THRESHOLD_ of every run (default: %(default)s; 0: glibc's dynamic "
                         "default; see the module docstring)")
    ap.add_argument("--floor-scale", type=int, default=10,
                    help="also run every configuration at this tiny scale; its peak RSS is the per-process "
                         "floor (libraries, kernels, MPI) subtracted for the net memory ratios (0: off)")
    ap.add_argument("--peer-thp", choices=("off", "on"), default="off",
                    help="THP_MEM_ALLOC_ENABLE=1 (torch's large tensors on huge pages, hpc_graph's default) for "
                         "the PyG/DGL runs too (default: %(default)s, as their users run them)")
    ap.add_argument("--no-pyg", dest="pyg", action="store_false", help="no PyG reference runs")
    ap.add_argument("--dgl", dest="dgl", action="store_true", default=None,
                    help="run the DGL reference next to every 1-rank single run (default: when --dgl-python "
                         "exists)")
    ap.add_argument("--no-dgl", dest="dgl", action="store_false", help="no DGL reference runs")
    ap.add_argument("--dgl-python", type=Path, default=DGL_PYTHON,
                    help="interpreter of the DGL environment (default: %(default)s; "
                         "bash benchmarks/setup_baselines.sh --dgl creates it)")
    ap.add_argument("--dgl-idtype", choices=("auto", "int32", "int64"), default="auto",
                    help="DGL graph id type (auto: int32 when the graph fits; DGL's default is int64)")
    ap.add_argument("--pyg-adj", nargs="+", choices=("edge_index", "csr"), default=["edge_index", "csr"],
                    help="graph inputs of the PyG runs: edge_index (PyG's default, the targets' reference) "
                         "and/or a torch.sparse_csr adjacency (SAGE only; label pyg-csr)")
    ap.add_argument("--repeat-noisy", type=int, default=2, metavar="K",
                    help="re-run a configuration up to K times while its epochs 2..E vary by more than "
                         "--noise-limit (other load on the machine) and keep the fastest (default: %(default)s)")
    ap.add_argument("--noise-limit", type=float, default=1.5,
                    help="max/min ratio of epochs 2..E above which a run counts as disturbed (default: %(default)s)")
    ap.add_argument("--skip-done", action="store_true", help="keep records already 'ok' in --out")
    ap.add_argument("--redo-noisy", action="store_true",
                    help="with --skip-done: run again the finished records whose epochs were disturbed")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and predictions, run nothing")
    args = ap.parse_args(argv)
    if args.epochs < 2:
        ap.error("--epochs: at least 2 (epoch 1 compiles the kernels and is left out of the median)")
    if any(n < 1 for n in args.ranks):
        ap.error("--ranks: positive integers")
    if args.dgl is None:
        args.dgl = args.dgl_python.exists()
        if not args.dgl:
            print(f"no DGL reference runs: {args.dgl_python} not found (bash benchmarks/setup_baselines.sh --dgl)",
                  flush=True)
    elif args.dgl and not args.dgl_python.exists():
        ap.error(f"--dgl: {args.dgl_python} not found (bash benchmarks/setup_baselines.sh --dgl, or --dgl-python)")
    args.workdir = args.workdir.resolve()
    args.out = args.out if args.out.is_absolute() else (Path.cwd() / args.out)
    if args.floor_scale and args.floor_scale not in args.scales:
        args.scales = [args.floor_scale] + list(args.scales)
    if args.mem_limit_gb is None:
        args.mem_limit_gb = round(0.8 * _mem_available_gb(), 1)

    doc: dict[str, Any] = {"benchmark": "training", "records": [], "datasets": {}, "uptime": []}
    if args.out.exists():
        doc = {**doc, **json.loads(args.out.read_text())}
    done = {_key(r): r for r in doc["records"]}
    todo = plan(args)
    if args.dry_run:
        for cfg in todo:
            pred = _prediction(cfg, done)
            print(cfg, "predicted:", pred)
        return 0

    args.workdir.mkdir(parents=True, exist_ok=True)
    configs = write_configs(args.workdir, args.epochs)
    doc["machine"] = {"cpus": os.cpu_count(), "mem_available_gb_at_start": round(_mem_available_gb(), 1),
                      "python": platform.python_version(), "node": platform.node()}
    doc["uptime"].append({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "uptime": _uptime(), "event": "start"})
    for s in args.scales:
        parts = sorted({c["ranks"] for c in todo if c["scale"] == s and c["engine"] in ("dp", "sar")})
        doc["datasets"][str(s)] = prepare_data(args.workdir, s, parts, timeout=7200)
    for cfg in todo:
        key = _key(cfg)
        old = done.get(key, {})
        redo = args.redo_noisy and _noisy(old, args.noise_limit, args.cores)
        if args.skip_done and old.get("status") == "ok" and not redo:
            continue
        rec = run_one(cfg, args, configs, done)
        attempts = []
        while (rec["status"] == "ok" and _noisy(rec, args.noise_limit, args.cores)
               and len(attempts) < args.repeat_noisy):
            attempts.append({k: rec.get(k) for k in ("median_epoch_s", "epoch_seconds", "max_peak_rss_mb",
                                                     "load_avg_before", "cpu_s")})
            print(f"  noisy epochs {rec['epoch_seconds']}: repeating", flush=True)
            again = run_one(cfg, args, configs, done, attempt=len(attempts))
            if again["status"] != "ok":
                break
            rec = min(rec, again, key=lambda r: r["median_epoch_s"])
        if attempts:
            rec["noisy_attempts"] = attempts
        done[key] = rec
        doc["records"] = sorted(done.values(), key=lambda r: (r["scale"], r["model"], r["ranks"], r["label"]))
        doc["targets"] = targets(doc["records"], args.floor_scale)
        doc["comparison"] = comparison(doc["records"], args.floor_scale)
        save(args.out, doc)
        extra = rec.get("reason") or (f"median epoch {rec['median_epoch_s']:.3f} s, max peak RSS "
                                      f"{rec['max_peak_rss_mb']:.0f} MiB")
        print(f"  -> {rec['status']}: {extra}", flush=True)
    doc["uptime"].append({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "uptime": _uptime(), "event": "end"})
    doc["plots"] = plots(doc["records"], args.out, args.floor_scale)
    doc["targets"] = targets(doc["records"], args.floor_scale)
    doc["comparison"] = comparison(doc["records"], args.floor_scale)
    save(args.out, doc)
    print(table(doc["records"]))
    if doc["comparison"]:
        print(comparison_table(doc["comparison"], args.floor_scale))
    for t in doc["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS'} {t['goal']}: {t['value']}")
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
