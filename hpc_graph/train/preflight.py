"""What the trainer checks before anything is loaded, and how a multi-rank job fails.

Every rank checks its inputs (the config against the engine it resolved to, the data source the engine
declares, the rank count, a checkpoint to resume from), then the ranks agree: on any rank's problem every
rank raises (its own error, or one naming the failing rank) instead of some waiting for the others. Then the
ranks of a host add up their predicted memory and refuse together if it does not fit
(:func:`check_memory`). Once training runs, an exception that the other ranks do not raise too ends the job
(:func:`fail_fast`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Iterator

from data_io.errors import DataError, is_disk_full
from hpc_graph.comm.malloc import configure_malloc
from hpc_graph.engines import engine_class, resolve_engine
from hpc_graph.train import checkpoint as ckpt
from hpc_graph.train.config import (Config, ConfigError, check_paths, check_resolved_engine, config_to_dict)
from hpc_graph.train.recipes import check_recipes

log = logging.getLogger(__name__)


def agreed(exc: BaseException) -> BaseException:
    """Mark an exception that every rank raises at the same point (no abort needed; the CLI prints it once)."""
    exc._hpc_graph_agreed = True  # type: ignore[attr-defined]
    exc.collective = True  # type: ignore[attr-defined]
    return exc


def flush_logs() -> None:
    for h in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            h.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()


def choose_engine(name: str, size: int, data_path: str, model: str | None = None) -> str:
    """Resolve ``engine.name`` (:func:`hpc_graph.engines.resolve_engine`) for a job of ``size`` ranks on
    ``data_path`` training model ``model`` (a ``model.name``). Raises ConfigError for ``single`` with more than
    one rank."""
    from hpc_graph.nn.models import MODEL_SPECS

    return resolve_engine(name, size, data_path, MODEL_SPECS.get(model) if model is not None else None)


def malloc_threshold(config: Any, engine_name: str) -> int:
    """The C allocator's mmap threshold a run gets (bytes; 0: glibc's adaptive default):
    ``train.malloc_mmap_threshold`` when set, else what the engine declares
    (:attr:`~hpc_graph.engines.base.Engine.malloc_mmap_threshold`)."""
    given = config.train.malloc_mmap_threshold
    if given is not None:
        return int(given)
    return int(engine_class(engine_name, config.data.path).malloc_mmap_threshold)


def check_data(config: Config, engine_name: str, comm: Any, rank: int, size: int) -> None:
    """The data source is what the engine declares (``data_source``): a dataset file, or a partition directory
    with one part per rank whose part file this rank can read (DataError/ConfigError otherwise)."""
    path = Path(config.data.path)
    cls = engine_class(engine_name, config.data.path)
    if path.is_file():
        from data_io.dataset import dataset_task

        if dataset_task(path) == "graph":
            rc = config.recipes
            if rc.label_aug > 0 or rc.correct_smooth:
                raise ConfigError("recipes: label_aug and correct_smooth work on node labels; "
                                  f"{path} is a graph-level dataset (one label per graph)")
            if cls.graph_level:  # the engine's graph-level variant reads the whole file on every rank
                return
    if cls.data_source == "file":
        if not path.is_file():
            raise ConfigError(f"data.path: engine {engine_name!r} needs a dataset file, {path} is a directory")
        return
    if cls.data_source == "partition_or_file" and path.is_file() and size == 1:
        return  # one process may take a whole dataset file
    if not path.is_dir():
        raise ConfigError(f"data.path: engine {engine_name!r} needs a partition directory "
                          f"(hpc-graph partition), {path} is a file"
                          + (" (a dataset file works on one process)" if cls.data_source == "partition_or_file"
                             else ""))
    from data_io.partition import part_file_name, read_partition_meta
    from hpc_graph.graph.dist_graph import check_ranks

    meta = read_partition_meta(path)
    check_ranks(int(meta["num_parts"]), comm, str(path))
    part = path / part_file_name(rank)
    try:
        with open(part, "rb") as fh:
            fh.read(8)
    except OSError as exc:
        raise DataError(f"{part}: cannot read part file of rank {rank} ({exc.strerror or exc})") from None


def check_resume(tr: Any, path: Path, state: dict[str, Any]) -> None:
    """ConfigError listing every difference between the checkpoint and this run (ranks, data, config)."""
    probs = []
    if state.get("world_size") != tr.size:
        probs.append(f"number of ranks: the checkpoint was written by {state.get('world_size')} rank(s), "
                     f"this job has {tr.size}")
    probs += ckpt.config_problems(state.get("config") or {}, config_to_dict(tr.config),
                                  defaults=config_to_dict(Config()))
    if not probs:
        tr._identity = ckpt.data_identity(tr.config.data.path)
        probs += ckpt.identity_problems(state.get("data") or {}, tr._identity)
    if probs:
        raise ConfigError(f"--resume: {path} does not match this run: " + "; ".join(probs))


def preflight(tr: Any, resume: str | os.PathLike | None, optional: bool = False) -> dict[str, Any] | None:
    """Check config, data and checkpoint on every rank, then agree: on any rank's problem every rank raises
    (its own error, or one naming the failing rank). Sets ``tr.engine_name``, ``tr.device`` and the
    allocator policy; returns the checkpoint state to resume from (None for a new run: also with ``optional``
    when ``resume`` holds no checkpoint file, the same on every rank)."""
    from hpc_graph.train.faults import FaultInjector

    config = tr.config
    problem: BaseException | None = None
    state = None
    found = None
    try:
        injector = FaultInjector.from_env()
        if injector is not None:
            tr.step_hooks.append(injector)
        check_paths(config)
        tr.device = tr._device(config.train.device)
        tr.engine_name = choose_engine(config.engine.name, tr.size, config.data.path, config.model.name)
        check_resolved_engine(config, tr.engine_name)
        check_recipes(config, tr.engine_name)
        try:
            engine_class(tr.engine_name, config.data.path).check_options(
                engine_class(tr.engine_name, config.data.path).options_from_config(config), tr.size)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        configure_malloc(malloc_threshold(config, tr.engine_name))  # before a checkpoint or the data comes in
        if resume is not None and optional and not ckpt.list_checkpoints(resume):
            log.info("%s: no checkpoint yet, starting afresh", resume)
        elif resume is not None:
            path, state = ckpt.latest_checkpoint(resume)
            found = (str(path), int(state.get("epoch", -1)))
            check_resume(tr, path, state)
            tr.resumed_from = path
        check_data(config, tr.engine_name, tr.comm, tr.rank, tr.size)
    except (ConfigError, DataError, OSError) as exc:
        problem = exc
    if tr.size > 1:
        reports = tr.comm.allgather_object(
            (None if problem is None else f"{type(problem).__name__}: {problem}", found))
        failed = [(r, msg) for r, (msg, _) in enumerate(reports) if msg is not None]
        if problem is None and failed:
            r, msg = failed[0]
            more = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
            raise ConfigError(f"rank {r}: {msg}{more}")
        if problem is None and len({f for _, f in reports}) > 1:
            raise ConfigError(f"--resume {resume}: ranks found different checkpoints "
                              f"({sorted({f for _, f in reports})}); is the run directory shared?")
        if problem is not None and len(failed) == tr.size and len({m for _, m in failed}) == 1:
            problem.collective = True  # every rank refused alike: the CLI prints it once (rank 0)
    if problem is not None:
        raise problem
    return state


def check_memory(tr: Any, force: bool) -> None:
    """Refuse to start when the ranks of a host would need more memory than it has (collective).

    Each rank predicts what it will still allocate (:func:`hpc_graph.plan.predict.train_estimate`: its step run
    on shapes, in a forked child so that the estimate's own imports stay out of the training process; nothing to
    check for an engine without a planning path, e.g. the sampled engines); the ranks of a
    host add theirs up and compare the sum with the memory available there
    (:func:`data_io.memory.require_memory`); if any rank refuses, every rank raises the same
    :class:`~data_io.memory.MemoryRefusal` (one line; ``force`` only warns). An estimate that fails for an
    engine that can be planned refuses too (one line naming why; ``force`` starts anyway with a warning): a
    planner that falls behind the code never turns the check off silently.
    """
    from data_io.memory import MemoryRefusal, available_bytes, require_memory
    from hpc_graph.plan.predict import KERNEL_ALLOWANCE_BYTES, PlanError, train_estimate_apart

    failure = None
    if _plainly_fits(str(tr.config.data.path), KERNEL_ALLOWANCE_BYTES, available_bytes()):
        return  # agreed without a message: every rank sees the same data and the same bound
    try:
        est = train_estimate_apart(tr.config, tr.engine_name, tr.rank, tr.size)
    except PlanError as exc:
        est, failure = None, str(exc)
    if failure is not None:
        text = (f"memory check: cannot estimate train ({tr.engine_name} {tr.config.model.name}, rank {tr.rank}): "
                f"{failure}")
        if not force:
            failure = f"{text}; pass --force to start anyway"
        else:
            log.warning("%s (--force: starting anyway)", text)
            failure = None
    host = socket.gethostname()
    mine = (host, None if est is None else est[0])
    reports = tr.comm.allgather_object(mine) if tr.size > 1 else [mine]
    local = [need for h, need in reports if h == host and need is not None]
    refusal = None
    if est is not None:
        what = f"train ({est[1]})" if len(local) == 1 else \
            f"train ({len(local)} ranks on host {host} together; {est[1]})"
        advice = ("this engine holds the whole graph on every rank: use an engine that partitions it (sar, dp, "
                  "sylvie)" if engine_class(tr.engine_name, tr.config.data.path).replicated
                  else "use more ranks or engine sar")
        try:
            require_memory(sum(local), what, force=force,
                           hint=f"{advice} (hpc-graph plan --memory-per-rank SIZE shows what fits)")
        except MemoryRefusal as exc:
            refusal = str(exc)
    if failure is not None:
        refusal = failure
    verdicts = tr.comm.allgather_object(refusal) if tr.size > 1 else [refusal]
    refused = [(r, v) for r, v in enumerate(verdicts) if v is not None]
    if refused:
        r, text = refused[0]
        raise agreed(MemoryRefusal(refusal if refusal is not None else f"rank {r}: {text}"))


#: a job whose data on disk, times this, plus the kernels' allowance, is at most half the memory available is
#: not estimated (the step run on shapes costs seconds of start-up, and such a job fits by a wide margin)
PLAINLY_FITS_FACTOR = 64


def _plainly_fits(path: str, allowance: int, available: int) -> bool:
    """Whether the data at ``path`` (a dataset file, or a partition directory: all its files) are so small beside
    ``available`` bytes that no estimate is needed (:data:`PLAINLY_FITS_FACTOR`)."""
    try:
        if os.path.isdir(path):
            size = sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        else:
            size = os.path.getsize(path)
    except OSError:
        return False
    return PLAINLY_FITS_FACTOR * size + allowance <= available // 2


#: exit status of bad input, configuration or output location (a full disk included): the same on every engine
EXIT_BAD_INPUT = 2


def exit_status(exc: BaseException) -> int:
    """The documented exit status of a job that ends with ``exc``: :data:`EXIT_BAD_INPUT` for a data or
    configuration error or a full disk, 1 for anything else."""
    return EXIT_BAD_INPUT if isinstance(exc, (DataError, ConfigError)) or is_disk_full(exc) else 1


#: seconds a rank other than 0 waits before it reports an expected error and aborts the job: an input every rank
#: reads (a damaged dataset file) fails on rank 0 too, whose abort then ends the job with one line, not one per
#: rank; a rank that alone failed reports it after this wait
ERROR_REPORT_DELAY_S = 3.0


@contextlib.contextmanager
def fail_fast(tr: Any) -> Iterator[None]:
    """In a multi-rank job, an exception that the other ranks do not raise too ends the job now
    (logged as one line ``rank R: Type: message`` for an expected error, with the traceback for any other,
    then ``comm.abort`` with :func:`exit_status`) instead of leaving them waiting. An expected error on a rank
    other than 0 is reported after :data:`ERROR_REPORT_DELAY_S`, so that one every rank meets is printed once."""
    try:
        yield
    except BaseException as exc:
        if tr.size > 1 and not getattr(exc, "_hpc_graph_agreed", False):
            status = exit_status(exc)
            if status == EXIT_BAD_INPUT and tr.rank != 0:
                import time

                time.sleep(ERROR_REPORT_DELAY_S)  # rank 0's abort ends this process here if it failed alike
            log.critical("rank %d: %s: %s (aborting all %d ranks)", tr.rank, type(exc).__name__, exc,
                         tr.size, exc_info=status != EXIT_BAD_INPUT)
            flush_logs()
            tr.comm.abort(status)
        raise
