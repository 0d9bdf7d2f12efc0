"""Replay sylvie's bit policy on recorded training runs: the thesis' LDR sign and no cooldown vs ours.

    python benchmarks/sylvie_policy_replay.py RUN_DIR [RUN_DIR ...]

Reads ``metrics.jsonl`` of ``sylvie`` runs (``bits: auto``): the global loss
of every epoch and the slowest rank's epoch time, i.e. what every rank's
policy saw. Feeds them to :class:`hpc_graph.engines.sylvie.BitPolicy` in
three variants and prints, per run and variant, how often the base width
changed and the mean base width:

* ``thesis``: LDR as printed in the thesis, ``(F_t - F_(t-1)) / time``, no cooldown;
* ``sign``: our positive rate ``(F_(t-1) - F_t) / time``, no cooldown;
* ``ours``: our rate and a cooldown of delta epochs after each change (what the engine runs).

A replay is exact for the first epochs only: in the real run the widths the
policy chose changed the losses and times that followed. It shows how each
rule reacts to the same signal.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from hpc_graph.engines.sylvie import BitPolicy


def replay(losses: list[float], seconds: list[float], smoothing: float, window: int, **variant) -> dict:
    p = BitPolicy(smoothing, window, **variant)
    bits = [p.bits]
    for loss, sec in zip(losses, seconds):
        bits.append(p.update(loss, sec).bits)
    changes = sum(1 for a, b in zip(bits, bits[1:]) if a != b)
    return {"changes": changes, "mean_bits": statistics.fmean(bits[1:]), "last_bits": bits[-1],
            "bits": bits[1:]}


def main(argv: list[str]) -> int:
    for run in argv:
        run = Path(run)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        cfg = json.loads((run / "summary.json").read_text())["config"]["engine"]
        by_epoch: dict[int, list[dict]] = {}
        for r in rows:
            by_epoch.setdefault(r["epoch"], []).append(r)
        epochs = sorted(by_epoch)
        losses = [by_epoch[e][0]["loss"] for e in epochs]
        seconds = [max(r["epoch_seconds"] for r in by_epoch[e]) for e in epochs]
        if cfg.get("ldr_time") == "epochs":
            seconds = [1.0] * len(seconds)
        print(f"{run}: {len(epochs)} epochs, lambda {cfg['ldr_smoothing']}, delta {cfg['ldr_window']}")
        for name, variant in (("thesis", {"thesis_sign": True, "cooldown": False}),
                              ("sign", {"cooldown": False}), ("ours", {})):
            r = replay(losses, seconds, cfg["ldr_smoothing"], cfg["ldr_window"], **variant)
            print(f"  {name:7} width changes {r['changes']:4d}, mean width {r['mean_bits']:.2f}, "
                  f"last {r['last_bits']}, first 40: {''.join(str(b) for b in r['bits'][:40])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
