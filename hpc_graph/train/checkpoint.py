"""Training checkpoints: ``RUN_DIR/checkpoints/ckpt-<epoch>.pt``, written atomically, verified on load.

A checkpoint file is a ``torch.save`` of a small envelope::

    {"format": "hpc_graph.checkpoint", "version": 1, "epoch": E,
     "sha256": hex digest of payload, "payload": bytes}

where ``payload`` is itself a ``torch.save`` of the training state (built by the
:class:`~hpc_graph.train.trainer.Trainer`: model, optimiser, schedule, best
validation state, every rank's RNG states, config, data identity, parameter
shapes). A truncated or corrupt file fails either ``torch.load`` or the digest
check; :func:`latest_checkpoint` then falls back to the previous file with a
warning. Both levels load with ``weights_only=True`` (no arbitrary pickles):
the state holds only tensors, numbers, strings, bytes, lists, tuples and dicts.

Files are written to a temporary name, flushed to disk and renamed; only the
newest :data:`KEEP_LAST` are kept.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable

import torch

from data_io.errors import DataError, atomic_output

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
KEEP_LAST = 2
_FORMAT = "hpc_graph.checkpoint"
_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d+)\.pt$")

# train.* fields that may differ between a checkpoint's config and the config of the resumed run
RESUMABLE_FIELDS = ("train.epochs", "train.eval_every", "train.checkpoint_every", "train.on_nonfinite",
                    "train.diverge_factor", "train.nonfinite_streak",
                    "train.progress", "train.comm_backend", "train.run_dir", "train.threads",
                    # Correct & Smooth runs after training: changing it does not change the trained weights
                    "recipes.correct_smooth", "recipes.cs_correct_layers", "recipes.cs_correct_alpha",
                    "recipes.cs_smooth_layers", "recipes.cs_smooth_alpha", "recipes.cs_autoscale",
                    "recipes.cs_scale")


class CheckpointError(DataError, ValueError):
    """A checkpoint that cannot be used (missing, corrupt, or not matching the run); names the file."""


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    """``RUN_DIR/checkpoints``."""
    return Path(run_dir) / CHECKPOINT_DIR


def checkpoint_path(run_dir: str | os.PathLike, epoch: int) -> Path:
    """``RUN_DIR/checkpoints/ckpt-<epoch>.pt`` (epoch not padded)."""
    return checkpoint_dir(run_dir) / f"ckpt-{int(epoch)}.pt"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every checkpoint file in ``run_dir``, oldest first (temporary files ignored)."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name)) and p.is_file()]
    return sorted(found)


def save_checkpoint(run_dir: str | os.PathLike, epoch: int, state: dict[str, Any],
                    keep: int = KEEP_LAST) -> Path:
    """Write ``state`` as ``ckpt-<epoch>.pt`` atomically, then delete all but the newest ``keep`` files.

    Returns the path written. Raises DataError naming the file when the write fails (e.g. disk full).
    """
    if keep < 1:
        raise ValueError(f"save_checkpoint: keep must be >= 1, got {keep}")
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    envelope = {"format": _FORMAT, "version": _VERSION, "epoch": int(epoch),
                "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}
    path = checkpoint_path(run_dir, epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(envelope, buf)  # in memory: torch's own file writer reports a full disk as a RuntimeError
    size = len(payload)
    del envelope, payload
    with atomic_output(path, force=True) as tmp:  # an OSError (disk full) becomes one DataError line
        with open(tmp, "wb") as fh:
            fh.write(buf.getbuffer())
            fh.flush()
            os.fsync(fh.fileno())
    for _, old in list_checkpoints(run_dir)[:-keep]:
        try:
            old.unlink()
        except FileNotFoundError:
            pass
    log.info("checkpoint: epoch %d written to %s (%.1f MiB)", epoch, path, size / 2**20)
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read and verify one checkpoint file; returns the state passed to :func:`save_checkpoint`.

    Raises:
        CheckpointError: naming the file, if it is unreadable, truncated, not a checkpoint, or its
        payload does not match the stored sha256.
    """
    path = Path(path)
    try:
        envelope = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except Exception as exc:  # truncated zip, bad pickle, I/O error: all mean "unusable"
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(envelope, dict) or envelope.get("format") != _FORMAT:
        raise CheckpointError(f"{path}: not an hpc_graph checkpoint")
    if envelope.get("version") != _VERSION:
        raise CheckpointError(f"{path}: checkpoint version {envelope.get('version')!r} is not supported "
                              f"(expected {_VERSION})")
    payload = envelope.get("payload")
    if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != envelope.get("sha256"):
        raise CheckpointError(f"{path}: payload does not match its sha256 (corrupt checkpoint)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: payload not loadable ({type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: payload is not a training state")
    return state


def clean_orphans(run_dir: str | os.PathLike, ranks: int) -> list[Path]:
    """Remove what killed jobs left in ``run_dir``: temporary checkpoint files (``checkpoints/.ckpt-N.pt.tmp-PID``)
    whose writing process no longer runs on this host, and ``pids/rank<R>`` files of ranks this job does not
    have (``R >= ranks``; its own ranks rewrite theirs). Returns the removed paths (each logged)."""
    removed = []
    for tmp in checkpoint_dir(run_dir).glob(".ckpt-*.pt.tmp-*"):
        try:
            pid = int(tmp.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if not _running(pid):
            removed.append(tmp)
    for pid_file in (Path(run_dir) / "pids").glob("rank*"):
        if pid_file.name[4:].isdigit() and int(pid_file.name[4:]) >= ranks:
            removed.append(pid_file)
    for path in removed:
        path.unlink(missing_ok=True)
        log.info("checkpoint: removed %s, left by an earlier job", path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def latest_checkpoint(run_dir: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint of ``run_dir`` that loads and verifies: ``(path, state)``.

    Every newer file that fails is skipped with a warning naming it and the reason.
    Raises CheckpointError if ``run_dir`` has no usable checkpoint.
    """
    found = list_checkpoints(run_dir)
    if not found:
        where = checkpoint_dir(run_dir)
        raise CheckpointError(f"{run_dir}: no checkpoint to resume from (no ckpt-<epoch>.pt in {where})")
    reasons = []
    for _, path in reversed(found):
        try:
            state = load_checkpoint(path)
        except CheckpointError as exc:
            log.warning("checkpoint: skipping %s", exc)
            reasons.append(str(exc))
            continue
        if reasons:
            log.warning("checkpoint: resuming from the older %s", path)
        return path, state
    raise CheckpointError(f"{run_dir}: no usable checkpoint ({'; '.join(reasons)})")


def data_identity(data_path: str | os.PathLike) -> dict[str, Any]:
    """What a checkpoint records about its input so that a resume can refuse different data.

    A dataset file: ``{"kind": "dataset", "sha256": <of the file>, "num_parts": None, "layout": None}``.
    A partition directory: ``sha256`` of its source dataset (from ``partition.json``), ``num_parts``,
    and ``layout``: sha256 of ``partition.json`` without its timings and source path (so two
    partitionings of the same source differ, a copied directory does not).
    """
    from data_io.partition import read_partition_meta
    from data_io.partitioner import file_sha256

    path = Path(data_path)
    if path.is_dir():
        meta = read_partition_meta(path)
        source = dict(meta.get("source") or {})
        stable = {k: v for k, v in meta.items() if k not in ("timings_s", "source")}
        stable["source_sha256"] = source.get("sha256")
        layout = hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()
        return {"kind": "partition", "sha256": source.get("sha256"), "num_parts": int(meta["num_parts"]),
                "layout": layout}
    try:
        digest = file_sha256(path)
    except OSError as exc:
        raise DataError(f"{path}: cannot read dataset ({exc.strerror or exc})") from None
    return {"kind": "dataset", "sha256": digest, "num_parts": None, "layout": None}


def identity_problems(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences between a checkpoint's data identity and the current one (empty: same)."""
    probs = []
    if saved.get("kind") != current.get("kind"):
        probs.append(f"data.path: the checkpoint was trained on a {saved.get('kind')}, this run has a "
                     f"{current.get('kind')}")
        return probs
    if saved.get("sha256") != current.get("sha256"):
        what = "source dataset" if current.get("kind") == "partition" else "dataset file"
        probs.append(f"data.path: different {what} (sha256 {_short(saved.get('sha256'))} in the checkpoint, "
                     f"{_short(current.get('sha256'))} now)")
    if saved.get("num_parts") != current.get("num_parts"):
        probs.append(f"data.path: the checkpoint's partition directory has {saved.get('num_parts')} parts, "
                     f"this one {current.get('num_parts')}")
    elif saved.get("layout") != current.get("layout") and not probs:
        probs.append("data.path: different partition directory (same source, but another partitioning: "
                     f"checksum {_short(saved.get('layout'))} in the checkpoint, {_short(current.get('layout'))} now)")
    return probs


def config_problems(saved: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]],
                    allowed: Iterable[str] = RESUMABLE_FIELDS,
                    defaults: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Fields (``section.key``) whose values differ between two config dicts, except ``allowed`` ones.

    ``defaults`` (nested like the configs) fills sections and keys that ``saved`` lacks: a checkpoint written
    before a field existed ran with that field's default, so it matches a current config that keeps it.
    """
    allowed = set(allowed)
    probs = []
    for section in sorted(set(saved) | set(current)):
        a = {**((defaults or {}).get(section) or {}), **(saved.get(section) or {})}
        b = current.get(section) or {}
        for key in sorted(set(a) | set(b)):
            name = f"{section}.{key}"
            if name in allowed or name == "data.path":  # data are compared by content, not by name
                continue
            if a.get(key) != b.get(key):
                probs.append(f"{name}: {a.get(key)!r} in the checkpoint, {b.get(key)!r} now")
    return probs


def shape_problems(saved: dict[str, list[int]], current: dict[str, list[int]]) -> list[str]:
    """Differences between two ``{parameter name: shape}`` maps (empty when the models match)."""
    probs = []
    for name in sorted(set(saved) | set(current)):
        a, b = saved.get(name), current.get(name)
        if a is None or b is None:
            probs.append(f"model: parameter {name} {'missing in the checkpoint' if a is None else 'not in this model'}")
        elif list(a) != list(b):
            probs.append(f"model: parameter {name} has shape {tuple(a)} in the checkpoint, {tuple(b)} now")
    return probs


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "unknown"


def checkpoint_config(run_dir: str | os.PathLike, overrides: Iterable[str] = (), *, validate: bool = True):
    """The validated :class:`~hpc_graph.train.config.Config` stored in ``run_dir``'s newest valid
    checkpoint, with ``"section.key=value"`` ``overrides`` applied (ConfigError naming a bad field);
    ``validate=False``: the nested dicts, not yet validated."""
    from hpc_graph.train.config import apply_overrides, config_from_dict

    path, state = latest_checkpoint(run_dir)
    raw = state.get("config")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: no config stored")
    raw = apply_overrides(raw, overrides)
    return config_from_dict(raw) if validate else raw


# -- a trainer's state ----------------------------------------------------------------------------------------
def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states: torch (CPU and, on a GPU, the device's), NumPy and ``random``."""
    import random

    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def param_shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def owned_state(tr: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of a full model state this rank holds (a pipeline stage holds its units' only)."""
    mine = tr.model.state_dict()
    return {k: v for k, v in state.items() if k in mine and not mine[k].is_meta}


def load_model_state(tr: Any, state: dict[str, torch.Tensor]) -> None:
    if tr.pipeline:
        tr.model.load_state_dict(owned_state(tr, state), strict=False)
    else:
        tr.model.load_state_dict(state)


def model_state(tr: Any) -> dict[str, torch.Tensor]:
    """The whole model's state on CPU; collective for a pipeline of several stages (each gives its part)."""
    own = {k: v.detach().to("cpu", copy=True) for k, v in tr.model.state_dict().items() if not v.is_meta}
    if not tr.pipeline or tr.size == 1:
        return own
    return {k: v for part in tr.comm.allgather_object(own) for k, v in part.items()}


def save_trainer(tr: Any) -> Path:
    """Write ``RUN_DIR/checkpoints/ckpt-<epoch>.pt`` of trainer ``tr`` (collective: every rank calls it; rank 0
    writes): model, optimiser, scheduler, epoch, best-validation state, every rank's RNG states (gathered), the
    config, the data identity, the number of ranks, the parameter shapes, the engine's and the co-training's
    state."""
    from hpc_graph.train.config import config_to_dict

    rng = rng_state(tr.device)
    states = tr.comm.allgather_object(rng) if tr.size > 1 else [rng]
    model, best_state = model_state(tr), tr.best_state
    optimizer_state: Any = tr.optimizer.state_dict()
    engine_state: Any = tr.engine.state_dict()
    if tr.pipeline and tr.size > 1:  # each stage holds its own parameters, optimiser and engine state
        parts = tr.comm.allgather_object((tr.best_state, optimizer_state, engine_state))
        optimizer_state = [opt for _, opt, _ in parts]
        engine_state = [eng for _, _, eng in parts]  # e.g. each stage's stale history
        if best_state is not None:
            best_state = {k: v for own, _, _ in parts for k, v in (own or {}).items()}
    elif tr.engine.rank_state and tr.size > 1:  # e.g. each rank's halo rows of a pipelined exchange
        engine_state = tr.comm.allgather_object(engine_state)
    lm_state = None
    if tr.cotrain is not None:  # the LM is the same on every rank; its random stream is not
        lm_state = tr.cotrain.state_dict()
        lm_state["rng"] = tr.comm.allgather_object(lm_state["rng"]) if tr.size > 1 else [lm_state["rng"]]
    path = checkpoint_path(tr.run_dir, tr.epoch)
    if tr.rank == 0:
        if tr._identity is None:
            tr._identity = data_identity(tr.config.data.path)
        state = {
            "epoch": tr.epoch,
            "model": model,
            "optimizer": optimizer_state,
            "scheduler": None if tr.scheduler is None else tr.scheduler.state_dict(),
            "best": dict(tr.best),
            "best_state": best_state,
            "last_eval": dict(tr._last_eval),
            "loss": tr._last_loss,
            "diverge_reference": tr._divergence.first,
            "rng": states,
            "config": config_to_dict(tr.config),
            "data": tr._identity,
            "world_size": tr.size,
            "engine": tr.engine_name,
            "engine_state": engine_state,
            "param_shapes": param_shapes(tr.model),
            "lm_state": lm_state,
        }
        path = save_checkpoint(tr.run_dir, tr.epoch, state)
    if tr.size > 1:
        tr.comm.barrier()
    return path


def restore_trainer(tr: Any, state: dict[str, Any]) -> None:
    """Load a checkpoint's training state into trainer ``tr`` (freshly built); this rank's RNG states too."""
    from hpc_graph.options import ConfigError
    from hpc_graph.train.preflight import agreed

    probs = shape_problems(state.get("param_shapes") or {}, param_shapes(tr.model))
    if probs:
        raise agreed(ConfigError(f"--resume: {tr.resumed_from} does not match this run: " + "; ".join(probs)))
    load_model_state(tr, state["model"])
    opt = state["optimizer"]
    tr.optimizer.load_state_dict(opt[tr.rank] if isinstance(opt, list) else opt)
    if tr.scheduler is not None and state.get("scheduler") is not None:
        tr.scheduler.load_state_dict(state["scheduler"])
    tr.epoch = int(state["epoch"])
    tr.best = dict(state["best"])
    tr.best_state = state.get("best_state")
    if tr.best_state is not None and tr.pipeline:
        tr.best_state = owned_state(tr, tr.best_state)
    tr._last_eval = dict(state.get("last_eval") or {})
    tr._last_loss = float(state.get("loss", float("nan")))
    tr._divergence.first = state.get("diverge_reference")  # None in older checkpoints: the next step sets it
    set_rng_state(state["rng"][tr.rank], tr.device)
    if tr.cotrain is not None:
        lm_state = state.get("lm_state")
        if lm_state is None or len(lm_state["rng"]) != tr.size:
            raise agreed(ConfigError(f"--resume: {tr.resumed_from} holds no LM co-training state for "
                                     f"{tr.size} rank(s) (lm.enabled)"))
        tr.cotrain.load_state_dict(lm_state, tr.rank, tr.epoch)
        tr.feat = tr.cotrain.inputs(tr._base_feat)
