"""Benchmark: the ``apt`` engine's four strategies, the cost model's predictions and ``auto``'s regret.

    python benchmarks/bench_apt.py prepare --scale 18 --work results/apt
    python benchmarks/bench_apt.py prepare --graph csbm --dims 128 --parts 2 --work results/apt
    mpiexec -n 2 python benchmarks/bench_apt.py run --work results/apt --out results/bench_apt_r2.jsonl
    python benchmarks/bench_apt.py matrix --ranks 2 --work results/apt --iters 20 --out results/bench_apt_r2.jsonl
    mpiexec -n 4 python benchmarks/bench_apt.py run --work results/apt --out results/bench_apt_r4.jsonl --iters 2
    python benchmarks/bench_apt.py report results/bench_apt_r2.jsonl --plot docs/img/apt_strategies.png
    python benchmarks/bench_apt.py accuracy --out results/bench_apt_accuracy.json

``prepare``: R-MAT graphs (``hpc-graph generate rmat``, input width d = 128 and 512) and their METIS and
random partitions into 2 and 4 parts.

``run`` (under ``mpiexec``; one line of JSON per configuration): for every configuration (d, hidden d',
cache 0 or 10 % of the remote rows, METIS or random parts), a 2-layer GraphSAGE (mean) with fan-outs
10, 5 and 1024 seeds per rank and iteration: the engine's dry run and profile (timed), its prediction for
every strategy, then for every strategy ``--iters`` training iterations of epoch 9 (past the dry run's
epochs; forward, backward, gradient all-reduce, Adam step), timed on every rank, the strategies taking turns
in ``--passes`` blocks (each after a switch and one untimed warm-up: the machine's speed drifts over seconds,
and every strategy is measured across the same seconds); the measured epoch is the slowest rank's
median iteration times the iterations of an epoch. Bytes per operation measured over the timed iterations
are scaled to an epoch the same way (the 4-rank run checks bytes; its timings share 2 cores among 4 ranks).

``matrix`` (not under ``mpiexec``): ``run`` once per configuration, each in a fresh ``mpiexec -n RANKS`` job,
as a training job would run it (one process running every configuration gets slower as it goes).

``report --median FILE...``: the same configurations measured in several matrices (rounds: the whole matrix
run again, so each configuration's runs fall minutes apart, in different phases of a machine whose speed
moves by 2x over seconds) as one row each: every strategy's median measured and median predicted epoch;
each matrix's plan, its choice and its cost, judged against those medians (regret: the median plan's);
and the measurement's own reproducibility: every matrix's measured epoch of a strategy taken as the
prediction of another matrix's (the error a perfect cost model would show against single measurements).

``report``: the table of measured and predicted epochs, prediction errors, the winner, ``auto``'s choice
and regret, and its speed-up over always-GDP. The plan's cost is shown twice: ``plan_seconds`` (the
first plan of the process: profile, loading the kernels, dry run) and ``warm_plan_seconds`` (a second
dry run, the profile reused: what the plan costs once the process is warm); ``net``: the warm plan less
the sampling of the first epochs' batches that training then takes from the dry run (``reused_seconds``
of the chosen strategy, the slowest rank's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STRATS = ("gdp", "nfp", "snp", "dnp")
EPOCH = 9  # the epoch timed: past the dry run's 8 epochs (whose cache hit rates it saw)


def _name(args) -> str:
    return f"rmat{args.scale}" if args.graph == "rmat" else f"csbm{args.csbm_nodes}"


def prepare(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for d in args.dims:
        h5 = work / f"{_name(args)}_d{d}.h5"
        if not h5.exists():
            if args.graph == "rmat":
                gen = ["rmat", "--scale", str(args.scale)]
            else:  # power-law degrees, neighbours matter (the minibatch benchmark's CSBM, larger)
                gen = ["csbm", "--num-nodes", str(args.csbm_nodes), "--avg-degree", "15", "--power-law", "2.5",
                       "--homophily", "0.6", "--snr", "0.6"]
            subprocess.run(["hpc-graph", "generate", *gen, "--feat-dim", str(d), "-o", str(h5), "--seed", "1"],
                           check=True, env=env)
        for parts in args.parts:
            for method in ("metis", "random"):
                out = work / f"{_name(args)}_d{d}_{method}{parts}"
                if not out.exists():
                    subprocess.run(["hpc-graph", "partition", str(h5), "-o", str(out), "-n", str(parts),
                                    "--method", method], check=True, env=env)


def _configs(args, size: int):
    work = Path(args.work)
    for d in args.dims:
        for hidden in args.hidden:
            for cache in args.cache:
                for method in args.methods:
                    path = work / f"{_name(args)}_d{d}_{method}{size}"
                    if path.exists():
                        yield {"d": d, "hidden": hidden, "cache": cache, "method": method, "path": str(path)}


def run(args) -> None:
    import torch

    from hpc_graph.comm import get_communicator
    from hpc_graph.comm.threads import configure_threads
    from hpc_graph.engines import create_engine

    comm = get_communicator("mpi")
    configure_threads(comm=comm, world=True)
    rank, size = comm.rank, comm.size
    out = open(args.out, "a") if rank == 0 else None
    for cfg in _configs(args, size):
        # cache: a fraction of this rank's remote rows, in MiB
        row = cfg["d"] * 4 + 8
        timing = args.plan_timing
        eng = create_engine("apt", cfg["path"], comm, torch.device("cpu"), torch.float32,
                            {"fanouts": (10, 5), "batch_size": args.batch, "strategy": "auto", "model": "sage",
                             "hidden": cfg["hidden"], "seed": 0, "dry_run_batches": args.dry_batches,
                             "cache_mb": 0.0, "plan_timing": timing})
        if cfg["cache"] > 0:  # the cache size depends on the graph: re-plan with it
            remote = int(eng.dg.node_ranges[-1]) - eng.num_owned
            eng.cache_mb = cfg["cache"] * remote * row / 2**20
            eng.run_dry_run("auto", timing)
        plan = eng.plan
        plan_seconds = plan.dry_seconds + plan.profile.seconds  # the first plan of the process pays the profile
        tune_cold = _tune(eng, cfg, comm)  # training's first iterations, timing the strategies (training timing)
        t1 = time.perf_counter()
        warm = eng.run_dry_run("auto", timing)  # again, warm (kernels loaded, profile kept): what a long job pays
        warm_seconds = time.perf_counter() - t1
        tune_warm = _tune(eng, cfg, comm)
        reused = dict(warm.reused_seconds)  # sampling of the first epochs' batches that training will not repeat
        warm_choice = warm.choice
        eng.plan = plan
        eng.discard_samples()  # timed below: steady-state iterations, every batch sampled
        iters = eng.iterations(EPOCH)
        del warm
        rec = {**cfg, "ranks": size, "iterations": iters, "plan_seconds": plan_seconds,
               "warm_plan_seconds": warm_seconds, "plan_timing": timing, "tune_seconds": tune_cold,
               "warm_tune_seconds": tune_warm, "warm_choice": warm_choice, "reused_seconds": reused,
               "dry_seconds": plan.dry_seconds, "profile_seconds": plan.profile.seconds, "choice": plan.choice,
               "predicted": {s: plan.predicted(s) for s in STRATS},
               "predicted_terms": {s: plan.costs[s].seconds for s in STRATS},
               "predicted_bytes": {s: plan.costs[s].bytes for s in STRATS},
               "fits": {s: plan.costs[s].fits for s in STRATS}, "measured": {}, "measured_bytes": {},
               "cache_hit_rate": {}}
        _, sizes = eng.batch_sizes(EPOCH, iters)
        # the strategies take turns, in --passes blocks each (a warm-up after every switch, untimed): this
        # machine's speed drifts by +-15 % over seconds, and timed one after another each strategy would be
        # measured in its own few seconds; in turns, every strategy's iterations span the whole measurement
        ran = [s for s in STRATS if plan.costs[s].fits]
        steps = {s: _trainer(eng, cfg, comm) for s in ran}
        times = {s: [] for s in ran}
        nbytes = {s: {} for s in ran}
        build = dict.fromkeys(ran, 0.0)
        hits = {s: [0, 0] for s in ran}
        passes = max(1, min(args.passes, args.iters))
        per = -(-args.iters // passes)
        it = 0
        for p in range(passes):
            k = min(per, args.iters - p * per)
            if k <= 0 or it + k + 1 > iters:
                break
            for s in ran:
                eng.use_strategy(s)
                for j in range(k + 1):
                    comm.barrier()
                    t = time.perf_counter()
                    steps[s](EPOCH, it + j, sizes)
                    if j:
                        times[s].append(time.perf_counter() - t)
                    else:
                        eng.reset_stats()  # the warm-up's bytes and cache counts do not count
                st = eng.stats()
                for op, v in st["bytes_by_op"].items():
                    nbytes[s][op] = nbytes[s].get(op, 0) + v
                build[s] += st["build_seconds"]
                store = eng.store.stats()
                hits[s][0] += store["cached"]
                hits[s][1] += store["cached"] + store["fetched"]
            it += k + 1
        rec["measured_iteration_seconds"], rec["measured_mean_iteration"] = {}, {}
        if not all(times.values()):
            raise SystemExit(f"{cfg['path']}: an epoch of {iters} iteration(s) is too short for --passes {passes} "
                             f"x {per} timed iterations and a warm-up each")
        for s in ran:
            med = torch.tensor([statistics.median(times[s]), statistics.fmean(times[s])], dtype=torch.float64)
            comm.allreduce_(med, "max")
            rec["measured_mean_iteration"][s] = float(med[1])
            scale = iters / len(times[s])
            rec["measured"][s] = float(med[0]) * iters
            rec["measured_bytes"][s] = {k: v * scale for k, v in nbytes[s].items()}
            rec["cache_hit_rate"][s] = hits[s][0] / hits[s][1] if hits[s][1] and eng.cache_mb > 0 else None
            rec.setdefault("measured_build", {})[s] = build[s] * scale
            rec["measured_iteration_seconds"][s] = times[s]  # rank 0's
        # what timing the strategies in training cost: its iterations (the last one, which finalizes the plan and
        # switches to the choice, included) less as many iterations of the chosen strategy: its mean iteration,
        # as the timing iterations are summed (the median would charge the timing for the hiccups every
        # iteration has now and then)
        rec["tune_baseline"] = "mean"
        for key, ch, tune in (("plan_seconds", plan.choice, tune_cold), ("warm_plan_seconds", warm_choice, tune_warm)):
            if tune and ch in rec["measured"]:
                rec[key] += sum(tune) - len(tune) * rec["measured_mean_iteration"][ch]
        if rank == 0:
            out.write(json.dumps(rec) + "\n")
            out.flush()
            best = min(rec["measured"], key=rec["measured"].get)
            print(f"d={cfg['d']} d'={cfg['hidden']} cache={cfg['cache']} {cfg['method']}: measured "
                  + " ".join(f"{s} {v:.1f}" for s, v in rec["measured"].items())
                  + " | predicted " + " ".join(f"{s} {v:.1f}" for s, v in rec["predicted"].items())
                  + f" | auto {rec['choice']} best {best} plan {plan_seconds:.1f}s", flush=True)
            print("   build measured " + " ".join(f"{s} {v:.2f}" for s, v in rec["measured_build"].items())
                  + " | predicted terms "
                  + " ".join(f"{s} " + "/".join(f"{v:.2f}" for v in rec["predicted_terms"][s].values())
                             for s in rec["measured"]), flush=True)
        del eng


def _trainer(eng, cfg, comm):
    """A fresh 2-layer GraphSAGE and Adam: ``step(epoch, it, sizes)`` trains one iteration on the engine's batch
    (forward, backward, gradient all-reduce, Adam), as training does."""
    import torch
    import torch.nn.functional as F

    from hpc_graph.nn import build_model

    torch.manual_seed(0)
    model = build_model("sage", eng.num_features, cfg["hidden"], eng.num_classes, num_layers=2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    params = list(model.parameters())

    def step(epoch: int, it: int, sizes) -> None:
        opt.zero_grad()
        batch = eng.batch(epoch, it)
        loss = F.cross_entropy(model(batch.graph, batch.feat), batch.label, reduction="sum") / sizes[it]
        loss.backward()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        comm.allreduce_bucketed_([p.grad for p in params])
        opt.step()

    return step


def _tune(eng, cfg, comm) -> list[float]:
    """Training iterations of epoch 1 while the engine times the strategies in them (``plan_timing:
    training``), the last one (which finalizes the plan) included: each one's seconds (every rank's slowest)."""
    import torch

    if not eng.tuning:
        return []
    step = _trainer(eng, cfg, comm)
    iters = eng.iterations(1)
    _, sizes = eng.batch_sizes(1, iters)
    times, made = [], []
    it = 0
    while eng.tuning and it < iters:
        comm.barrier()
        t = time.perf_counter()
        layout, filled = eng.layout_seconds, eng.fill_seconds
        step(1, it, sizes)
        # the feature cache's filling, once the plan has chosen: a run told to use a strategy fills it too
        times.append(time.perf_counter() - t - (eng.fill_seconds - filled))
        made.append(eng.layout_seconds - layout)
        it += 1
    eng.end_epoch(1, 0.0, 0.0)
    if eng.strategy == "nfp":  # NFP's column layout (when NFP led the timing, or once chosen), kept for training:
        times = [a - b for a, b in zip(times, made)]  # a run told to use NFP makes it too; else the timing's cost
    v = torch.tensor(times, dtype=torch.float64)
    comm.allreduce_(v, "max")
    return v.tolist()


def matrix(args) -> None:
    """``run`` once per configuration, each in a fresh ``mpiexec -n RANKS`` job (not under mpiexec itself): a
    long-lived process that has built and dropped many engines runs the later configurations up to 20 %
    slower than a fresh one does (its memory), which is not what a training job sees."""
    for cfg in _configs(args, args.ranks):
        cmd = ["mpiexec", "-n", str(args.ranks), sys.executable, str(Path(__file__).resolve()), "run",
               "--work", args.work, "--scale", str(args.scale), "--graph", args.graph,
               "--csbm-nodes", str(args.csbm_nodes), "--dims", str(cfg["d"]), "--hidden", str(cfg["hidden"]),
               "--cache", str(cfg["cache"]), "--methods", cfg["method"], "--batch", str(args.batch),
               "--iters", str(args.iters), "--passes", str(args.passes), "--dry-batches", str(args.dry_batches),
               "--plan-timing", args.plan_timing, "--out", args.out]
        subprocess.run(cmd, check=True)


def _groups(rows: list[dict], median: bool) -> list[dict]:
    """The report's configurations: each record alone, or with ``median`` the records of one configuration
    (graph, partition, d, d', cache) from several matrices merged: every strategy's median measured and median
    predicted epoch, and each matrix's own plan (its choice and its warm plan's cost) kept to be judged against
    those medians."""
    rows = [r for r in rows if r["measured"]]
    keyed: dict = {}
    for i, r in enumerate(rows):
        keyed.setdefault((r["path"], r["hidden"], r["cache"]) if median else i, []).append(r)
    out = []
    for g in keyed.values():
        strats = [s for s in STRATS if all(s in r["measured"] for r in g)]
        rec = dict(g[0])
        rec["measured"] = {s: statistics.median(r["measured"][s] for r in g) for s in strats}
        rec["predicted"] = {**g[0]["predicted"], **{s: statistics.median(r["predicted"][s] for r in g) for s in strats}}
        # each matrix's own error, the median over the matrices: a second statistic (the error of the medians
        # takes the measured and the predicted median from different matrices where the machine's phase moved)
        rec["median_run_error"] = {s: statistics.median(abs(r["predicted"][s] - r["measured"][s]) / r["measured"][s]
                                                        for r in g) for s in strats}
        # the machine's own reproducibility: one matrix's measured epoch taken as the prediction of another's
        rec["rerun_errors"] = [abs(a["measured"][s] - b["measured"][s]) / b["measured"][s] for s in strats
                              for a in g for b in g if a is not b]
        rec["plans"] = []
        for r in g:
            ch = r.get("warm_choice", r["choice"])  # the warm plan's choice: the epoch its cost is measured against
            rec["plans"].append({"choice": r["choice"], "warm_choice": ch, "warm_seconds": _warm_plan_seconds(r, ch),
                                 "reused": r.get("reused_seconds", {}).get(ch, 0.0)})
        out.append(rec)
    return out


def report(args) -> None:
    rows = [json.loads(line) for f in args.files for line in open(f) if line.strip()]
    groups = _groups(rows, args.median)
    errs, regrets, speedups, overheads, nets, run_regrets = [], [], [], [], [], []
    print("| d | d' | cache | parts | GDP s | NFP s | SNP s | DNP s | predicted GDP/NFP/SNP/DNP s | best | auto "
          "| regret | auto vs GDP | plan / epoch | net |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for r in groups:
        m, p = r["measured"], r["predicted"]
        best = min(m, key=m.get)
        for s in m:
            errs.append(abs(p[s] - m[s]) / m[s])
        # each plan's choice judged by the (median) measured epochs; a configuration's regret: the median plan's
        reg = [m.get(x["choice"], nan) / m[best] for x in r["plans"]]
        run_regrets += reg
        regrets.append(statistics.median(reg))
        speedups.append(statistics.median(m["gdp"] / m.get(x["choice"], nan) for x in r["plans"]))
        overheads.append(statistics.median(x["warm_seconds"] / m.get(x["warm_choice"], nan) for x in r["plans"]))
        # net of the sampling training takes from the dry run instead of doing it again
        nets.append(statistics.median((x["warm_seconds"] - x["reused"]) / m.get(x["warm_choice"], nan)
                                      for x in r["plans"]))
        cells = [f"{m[s]:.1f}" if s in m else "-" for s in STRATS]
        print(f"| {r['d']} | {r['hidden']} | {r['cache']:.0%} | {r['method']} | " + " | ".join(cells)
              + " | " + "/".join(f"{p[s]:.1f}" for s in STRATS) + f" | {best} | "
              + ",".join(x["choice"] for x in r["plans"]) + f" | {regrets[-1]:.2f} | "
              f"{speedups[-1]:.2f}x | {overheads[-1]:.1%} | {nets[-1]:.1%} |")
    byte_errs = []
    for r in rows:
        for s_, got in r.get("measured_bytes", {}).items():
            want = r["predicted_bytes"][s_]
            tot_g = sum(got.values())
            tot_w = sum(v for op, v in want.items() if op in got)
            if tot_w:
                byte_errs.append(abs(tot_g - tot_w) / tot_w)
    if byte_errs:
        print(f"\nbytes per epoch (all operations but the all-reduce), prediction vs measured over the timed "
              f"iterations: median error {statistics.median(byte_errs):.1%}, max {max(byte_errs):.1%} "
              f"({len(byte_errs)} strategy runs)")
    if args.plot and groups:
        _plot([{**r, "choice": r["plans"][0]["choice"]} for r in groups], args.plot)
    if errs:
        what = "configurations' medians over their matrices" if args.median else "strategy runs"
        print(f"\nprediction error: median {statistics.median(errs):.1%}, max {max(errs):.1%} over {len(errs)} "
              f"{what}; regret of auto: median {statistics.median(regrets):.2f}, max {max(regrets):.2f}; "
              f"auto vs always-GDP: median {statistics.median(speedups):.2f}x; warm plan (dry run) / epoch: "
              f"median {statistics.median(overheads):.1%}, max {max(overheads):.1%}; net of the reused sampling: "
              f"median {statistics.median(nets):.1%}, max {max(nets):.1%}")
        if args.median:
            print(f"every plan's choice against the median epochs: regret median {statistics.median(run_regrets):.2f}, "
                  f"max {max(run_regrets):.2f} over {len(run_regrets)} plans")
            med = [v for r in groups for v in r["median_run_error"].values()]
            print(f"each configuration's median over its matrices of the prediction error: median "
                  f"{statistics.median(med):.1%}, max {max(med):.1%}")
            rerun = [v for r in groups for v in r["rerun_errors"]]
            if rerun:
                print(f"the measurement's own reproducibility (a matrix's measured epoch as the prediction of another "
                      f"matrix's, same configuration and strategy): median {statistics.median(rerun):.1%}, max "
                      f"{max(rerun):.1%}, over 30 %: {sum(v > 0.3 for v in rerun)} of {len(rerun)} pairs")


def _warm_plan_seconds(r: dict, ch: str) -> float:
    """The warm plan's cost, its timing iterations charged beyond the choice's mean iteration (records with
    ``tune_baseline: mean``); older records charged them beyond the median one: rebased here on rank 0's mean
    where the record keeps its iterations."""
    got = r["warm_plan_seconds"]
    if r.get("tune_baseline") != "mean" and ch in r.get("measured_iteration_seconds", {}) and ch in r["measured"]:
        got += len(r.get("warm_tune_seconds") or []) * (r["measured"][ch] / r["iterations"]
                                                         - statistics.fmean(r["measured_iteration_seconds"][ch]))
    return got


def _plot(rows, path) -> None:
    """Measured epoch of every strategy per configuration (bars), the prediction (ticks) and auto's choice."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows)), 4.5), dpi=110)
    colors = {"gdp": "#4c72b0", "nfp": "#dd8452", "snp": "#55a868", "dnp": "#c44e52"}
    width = 0.2
    for i, r in enumerate(rows):
        best = min(r["measured"].values())
        for j, s in enumerate(STRATS):
            if s not in r["measured"]:
                continue
            x = i + (j - 1.5) * width
            ax.bar(x, r["measured"][s] / best, width, color=colors[s], label=s.upper() if i == 0 else None,
                   edgecolor="black" if s == r["choice"] else None, linewidth=1.5 if s == r["choice"] else 0)
            ax.plot([x - width / 2, x + width / 2], [r["predicted"][s] / best] * 2, color="black", lw=1)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"d={r['d']}\nd'={r['hidden']}\n{r['cache']:.0%} {r['method'][:1].upper()}" for r in rows],
                       fontsize=7)
    ax.set_ylabel("epoch / best strategy's epoch")
    ax.set_title("apt: measured epoch per strategy (bars; outlined: auto's choice), prediction (ticks)")
    ax.legend(ncol=4, fontsize=8)
    ax.set_ylim(0.8, None)
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


def accuracy(args) -> None:
    """Cora on 2 ranks: every strategy (and ``minibatch`` exact, the GDP reference) over seeds; test accuracy
    at the best validation epoch. Same samples, same model: the strategies should agree."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    h5, parts = work / "cora.h5", work / "cora-2parts"
    if not h5.exists():
        subprocess.run(["hpc-graph", "convert", "npz", str(REPO / "tests/data/cora.npz"), "-o", str(h5)], check=True,
                       env=env)
    if not parts.exists():
        subprocess.run(["hpc-graph", "partition", str(h5), "-o", str(parts), "-n", "2"], check=True, env=env)
    results = {}
    runs = [("minibatch-exact", ["engine.name=minibatch", "hec.mode=exact"])] + \
        [(s, [f"engine.strategy={s}"]) for s in STRATS]
    for name, sets in runs:
        accs = []
        for seed in range(args.seeds):
            run_dir = work / f"cora_{name}_{seed}"
            cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "hpc_graph.cli", "train", "--config",
                   str(REPO / "configs/apt_sage.yaml"), "--set", f"data.path={parts}", "--set",
                   f"train.run_dir={run_dir}", "--set", f"train.seed={seed}", "--set", "train.progress=false",
                   "--set", f"model.dropout={args.dropout}"]
            for kv in sets:
                cmd += ["--set", kv]
            if name == "minibatch-exact":
                cmd = [c for c in cmd if not c.startswith("engine.strategy")]
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            summary = json.loads((run_dir / "summary.json").read_text())
            accs.append(summary["test_acc_at_best"] if "test_acc_at_best" in summary else summary["test_acc"])
        results[name] = accs
        print(f"{name}: test acc {statistics.mean(accs):.4f} +- {statistics.pstdev(accs):.4f} ({accs})", flush=True)
    Path(args.out).write_text(json.dumps(results))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare")
    pp.add_argument("--scale", type=int, default=18)
    pp.add_argument("--graph", choices=("rmat", "csbm"), default="rmat")
    pp.add_argument("--csbm-nodes", type=int, default=200_000)
    pp.add_argument("--dims", type=int, nargs="+", default=[128, 512])
    pp.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    pp.add_argument("--work", default="results/apt")
    for name in ("run", "matrix"):
        rp = sub.add_parser(name)
        rp.add_argument("--work", default="results/apt")
        rp.add_argument("--scale", type=int, default=18)
        rp.add_argument("--graph", choices=("rmat", "csbm"), default="rmat")
        rp.add_argument("--csbm-nodes", type=int, default=200_000)
        rp.add_argument("--dims", type=int, nargs="+", default=[128, 512])
        rp.add_argument("--hidden", type=int, nargs="+", default=[16, 64, 256])
        rp.add_argument("--cache", type=float, nargs="+", default=[0.0, 0.1])
        rp.add_argument("--methods", nargs="+", default=["metis", "random"])
        rp.add_argument("--batch", type=int, default=1024)
        rp.add_argument("--iters", type=int, default=6, help="timed iterations of each strategy, in all")
        rp.add_argument("--passes", type=int, default=4,
                        help="the strategies take turns this many times (a warm-up after each switch)")
        rp.add_argument("--dry-batches", type=int, default=20)
        rp.add_argument("--plan-timing", choices=("training", "dry_run"), default="training")
        rp.add_argument("--out", required=True)
        if name == "matrix":
            rp.add_argument("--ranks", type=int, default=2)
    ap_ = sub.add_parser("accuracy")
    ap_.add_argument("--work", default="results/apt")
    ap_.add_argument("--seeds", type=int, default=5)
    ap_.add_argument("--dropout", type=float, default=0.5)
    ap_.add_argument("--out", default="results/bench_apt_accuracy.json")
    rr = sub.add_parser("report")
    rr.add_argument("files", nargs="+")
    rr.add_argument("--plot", help="write the figure of measured and predicted epochs here (PNG)")
    rr.add_argument("--median", action="store_true",
                    help="merge the records of one configuration from several files (matrices run again): "
                         "medians of the measured and the predicted epochs, every matrix's plan judged by them")
    args = ap.parse_args()
    {"prepare": prepare, "run": run, "matrix": matrix, "report": report, "accuracy": accuracy}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
