"""CPU threads per rank: decided once at start-up, applied to numba, torch and BLAS.

Several MPI ranks on one node each start numba's and torch's thread pools.
Left alone, every pool sizes itself to all the node's cores, so two ranks on
two cores run four busy threads, and OpenMP's spinning idle threads steal the
cores the other rank needs (a 2-rank Cora epoch took 50x longer than it should).
:func:`configure_threads` fixes the count for every entry point (the CLI, the
:class:`~hpc_graph.train.trainer.Trainer`, benchmarks, tests).

Order of precedence (first that is set wins):

1. an explicit setting: config ``train.threads`` or ``--threads``;
2. ``NUMBA_NUM_THREADS``, then ``OMP_NUM_THREADS`` (the first number of an
   OpenMP list such as ``"8,2"``);
3. this rank's fair share of the CPUs in its affinity mask: each CPU counts
   ``1 / (ranks on the node whose mask holds it)``, rounded down, at least 1.
   Under an MPI launcher the ranks of a node exchange their masks once (one
   small all-gather over a shared-memory communicator), so an unbound
   ``mpiexec -n 2`` on 2 cores gives 1 thread each, while ranks bound to one
   socket each get the socket's cores. A cgroup CPU quota (containers,
   ``docker --cpus``) caps the CPUs counted.

Applying the number: ``numba`` (the pool size when numba's pool has not started
yet, and ``numba.set_num_threads`` on the calling thread), ``torch``
(``set_num_threads`` and, where still possible, ``set_num_interop_threads``),
BLAS libraries already loaded (through ``threadpoolctl``), and the variables
``NUMBA_NUM_THREADS``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` for libraries loaded later in this process
(``NUMBA_NUM_THREADS`` only while numba is not imported: numba re-reads it at
every compilation and refuses a value that differs from its pool's). What was
exported is recorded in ``HPC_GRAPH_EXPORTED_THREADS`` (``VAR=value,...``); a
child process (the ranks ``hpc-graph demo`` starts, say) ignores a variable
while it still holds the recorded value, and decides its own count.

When the ranks of a node ask for more threads than it has CPUs (an explicit
setting, or more ranks than cores), one warning is logged per node and
``OMP_WAIT_POLICY=PASSIVE`` is set when the OpenMP runtime has not been loaded
yet (the CLI decides before importing torch), so that idle OpenMP threads sleep
instead of spinning on the cores other ranks need.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from typing import Any, Mapping, Sequence

from hpc_graph.comm.env import detect_local_size, detect_rank_size, launcher_name

__all__ = ["ThreadPlan", "ThreadSettingError", "parse_threads", "decide_threads", "configure_threads",
           "current_plan", "affinity_cpus"]

log = logging.getLogger(__name__)

#: environment variables read, in order, when no explicit setting is given
ENV_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")
#: variables set to the decided count for libraries loaded later and for child processes
EXPORTED_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

#: set beside them: a child process ignores the variables while they still equal it (its own
#: decision, e.g. for ranks started by ``hpc-graph demo``, must not inherit the parent's)
EXPORT_MARKER = "HPC_GRAPH_EXPORTED_THREADS"

_MPI_LAUNCHERS = frozenset({"openmpi", "mvapich", "pals", "hydra", "slurm", "pmix", "jsrun"})


class ThreadSettingError(ValueError):
    """A thread setting that is not a positive integer; the message names the setting."""


@dataclasses.dataclass(frozen=True)
class ThreadPlan:
    """The threads this rank uses, and why.

    Attributes:
        threads: threads per rank for numba, torch and BLAS.
        source: what decided it: ``"train.threads"``, ``"--threads"``, ``"NUMBA_NUM_THREADS"``,
            ``"OMP_NUM_THREADS"`` or ``"affinity"``.
        reason: one human-readable sentence.
        cpus: CPUs in this rank's affinity mask (after a cgroup quota).
        node_ranks: ranks of this job on this node (this one included).
        node_threads: threads of all those ranks together.
        node_cpus: CPUs in the union of their affinity masks (after a cgroup quota).
    """

    threads: int
    source: str
    reason: str
    cpus: int
    node_ranks: int
    node_threads: int
    node_cpus: int

    @property
    def oversubscribed(self) -> bool:
        """More threads on this node than CPUs to run them."""
        return self.node_threads > self.node_cpus

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "oversubscribed": self.oversubscribed}


def parse_threads(value: Any, name: str) -> int | None:
    """``value`` as a thread count (``None`` when unset or empty), else :class:`ThreadSettingError` naming ``name``.

    Accepts positive integers and strings holding one (an OpenMP list ``"8,2"``
    gives its first number for ``OMP_NUM_THREADS``); rejects 0, negatives,
    booleans, fractions and other text.
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if name == "OMP_NUM_THREADS":
            text = text.split(",")[0].strip()
        if not text:
            return None
        try:
            number = int(text)
        except ValueError:
            raise ThreadSettingError(f"{name}: must be a positive integer, got {value!r}") from None
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ThreadSettingError(f"{name}: must be a positive integer, got {value!r}")
    else:
        number = value
    if number < 1:
        raise ThreadSettingError(f"{name}: must be a positive integer, got {value!r}")
    return number


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by a cgroup (v2 ``cpu.max``, v1 ``cfs_quota/cfs_period``) quota; None without one."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max" and float(period) > 0:
            return float(quota) / float(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as fh:
            quota = float(fh.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as fh:
            period = float(fh.read())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def affinity_cpus() -> frozenset[int]:
    """The CPU ids this process may run on (all CPUs where the OS cannot say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def _capped(count: float) -> float:
    limit = _cgroup_cpu_limit()
    return count if limit is None else min(count, max(1.0, math.ceil(limit)))


def _requested(explicit: Any, explicit_name: str, env: Mapping[str, str]) -> tuple[int | None, str]:
    """The explicit or environment setting that decides, ``(None, "affinity")`` when none is set."""
    value = parse_threads(explicit, explicit_name)
    if value is not None:
        return value, explicit_name
    exported = _exported(env)
    for var in ENV_VARS:
        if var in exported and env.get(var) == exported[var]:
            continue  # hpc_graph set it in a parent process: not the user's setting
        value = parse_threads(env.get(var), var)
        if value is not None:
            return value, var
    return None, "affinity"


def _fair_share(masks: Sequence[frozenset[int]], index: int) -> float:
    """Rank ``index``'s share of its CPUs: each CPU split evenly among the ranks whose mask holds it."""
    count: dict[int, int] = {}
    for mask in masks:
        for cpu in mask:
            count[cpu] = count.get(cpu, 0) + 1
    return sum(1.0 / count[cpu] for cpu in masks[index])


def _auto_threads(masks: Sequence[frozenset[int]], index: int) -> int:
    share = _fair_share(masks, index) * _capped(len(masks[index])) / max(len(masks[index]), 1)
    return max(1, int(share + 1e-9))


def decide_threads(explicit: Any = None, *, explicit_name: str = "train.threads",
                   env: Mapping[str, str] | None = None,
                   node: Sequence[tuple[frozenset[int], int | None]] | None = None,
                   index: int = 0, comm: Any = None, world: bool = False) -> ThreadPlan:
    """Decide this rank's threads (nothing is applied; see :func:`configure_threads`).

    Args:
        explicit: ``train.threads`` / ``--threads`` value, or None.
        explicit_name: how to name ``explicit`` in messages.
        env: environment to read (default ``os.environ``).
        node: ``(affinity mask, requested threads or None)`` of every rank on this
            node, this one at ``index`` (its own request is replaced by what
            ``explicit`` and ``env`` say). Default: gathered from the ranks of
            ``comm`` on this host (collective over ``comm`` when it has several
            ranks); with ``world=True`` and no ``comm``, from the node's ranks of
            ``MPI_COMM_WORLD`` under an MPI launcher (collective: every rank of
            the job must call it); otherwise this process, counted as many times
            as the launcher says ranks share the node.
        index: this rank's position in ``node``.
    Raises:
        ThreadSettingError: a setting that is not a positive integer (named); under a
            gather, on every rank when any rank has one.
    """
    env = os.environ if env is None else env
    try:
        requested, source = _requested(explicit, explicit_name, env)
        problem = None
    except ThreadSettingError as exc:  # still join the gather below, so that no rank waits for this one
        requested, source, problem = None, "affinity", str(exc)
    if node is None:
        gathered, index = _gather_node(requested, problem, env, comm, world)
        failed = [(r, p) for r, (_, _, p) in enumerate(gathered) if p is not None]
        if failed:
            if problem is not None:
                raise ThreadSettingError(problem)
            rank, text = failed[0]
            raise ThreadSettingError(f"node-local rank {rank}: {text}")
        node = [(m, r) for m, r, _ in gathered]
    elif problem is not None:
        raise ThreadSettingError(problem)
    masks = [m for m, _ in node]
    node = [(m, requested if i == index else r) for i, (m, r) in enumerate(node)]  # this rank's own setting
    per_rank = [r if r is not None else _auto_threads(masks, i) for i, (_, r) in enumerate(node)]
    threads = per_rank[index]
    cpus = int(_capped(len(masks[index])))
    node_cpus = int(_capped(len(frozenset().union(*masks))))
    sharing = sum(1 for m in masks if m & masks[index])
    if source == "affinity":
        reason = (f"{cpus} CPU(s) in this rank's affinity mask, shared with {sharing - 1} other rank(s) "
                  f"on this node" if sharing > 1 else f"{cpus} CPU(s) in this rank's affinity mask")
    else:
        reason = f"set by {source}"
    return ThreadPlan(threads=threads, source=source, reason=reason, cpus=cpus, node_ranks=len(node),
                      node_threads=sum(per_rank), node_cpus=node_cpus)


_Entry = tuple[frozenset[int], "int | None", "str | None"]


def _gather_node(requested: int | None, problem: str | None, env: Mapping[str, str], comm: Any,
                 world: bool) -> tuple[list[_Entry], int]:
    """Every node-local rank's ``(mask, requested, problem)`` and this rank's index in the list."""
    mine = (affinity_cpus(), requested, problem)
    if comm is not None and int(comm.size) > 1:
        import socket

        host = socket.gethostname()
        everyone = comm.allgather_object((host, sorted(mine[0]), requested, problem))
        node = [(r, (frozenset(m), req, p)) for r, (h, m, req, p) in enumerate(everyone) if h == host]
        return [e for _, e in node], [r for r, _ in node].index(int(comm.rank))
    if comm is None and world:
        launcher = launcher_name(env)
        _, size = detect_rank_size(env)
        if size > 1 and launcher in _MPI_LAUNCHERS and env is os.environ:
            try:
                from mpi4py import MPI
            except ImportError:  # no MPI bindings: estimate from the launcher's local size below
                pass
            else:
                node_comm = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
                try:
                    everyone = node_comm.allgather((sorted(mine[0]), requested, problem))
                    return [(frozenset(m), r, p) for m, r, p in everyone], node_comm.Get_rank()
                finally:
                    node_comm.Free()
    try:
        local = detect_local_size(env) or 1
    except ValueError:
        local = 1
    return [mine] * max(local, 1), 0


# -- applying a plan ------------------------------------------------------------------------------
_plan: ThreadPlan | None = None
_warned_pool = False


def current_plan() -> ThreadPlan | None:
    """The plan applied by the last :func:`configure_threads` in this process (None before)."""
    return _plan


def configure_threads(explicit: Any = None, *, explicit_name: str = "train.threads", comm: Any = None,
                      world: bool = False) -> ThreadPlan:
    """Decide (:func:`decide_threads`) and apply this rank's threads; log the decision once.

    Call it at start-up, before compute kernels run. ``comm`` and ``world`` say
    which ranks take part in deciding (see :func:`decide_threads`; collective
    over them). Calling it again re-applies the same plan to the libraries
    loaded since (no collective), unless ``explicit`` asks for a different
    count, which is then decided anew.

    Raises:
        ThreadSettingError: a setting that is not a positive integer (named).
    """
    global _plan
    value = parse_threads(explicit, explicit_name)
    if _plan is not None and (value is None or value == _plan.threads):
        _apply(_plan)
        return _plan
    plan = decide_threads(value, explicit_name=explicit_name, comm=comm, world=world)
    first = _plan is None
    _plan = plan
    _apply(plan)
    log.info("threads: %d per rank (%s)%s", plan.threads, plan.reason, "" if first else "; changed")
    if plan.oversubscribed and _is_node_leader():
        log.warning("threads: the %d rank(s) on this node run %d threads on %d CPU(s) (oversubscribed); "
                    "idle threads are made to sleep where the OpenMP runtime is not loaded yet "
                    "(OMP_WAIT_POLICY=PASSIVE). Use fewer ranks per node or fewer threads "
                    "(train.threads / --threads) for speed", plan.node_ranks, plan.node_threads, plan.node_cpus)
    return plan


def _is_node_leader() -> bool:
    from hpc_graph.comm.env import detect_local_rank

    try:
        return detect_local_rank() == 0
    except ValueError:
        return True


def _exported(env: Mapping[str, str]) -> dict[str, str]:
    """``{variable: value}`` recorded in ``HPC_GRAPH_EXPORTED_THREADS`` (empty when absent or unreadable)."""
    out = {}
    for item in env.get(EXPORT_MARKER, "").split(","):
        var, sep, value = item.partition("=")
        if sep and var.strip():
            out[var.strip()] = value.strip()
    return out


def _apply(plan: ThreadPlan) -> None:
    n = plan.threads
    record = {k: v for k, v in _exported(os.environ).items() if os.environ.get(k) == v}  # still ours
    for var in EXPORTED_VARS:
        if var == "NUMBA_NUM_THREADS" and "numba" in sys.modules:
            continue  # numba compares it with its pool at every compilation: leave it as numba read it
        os.environ[var] = str(n)
        record[var] = str(n)
    os.environ[EXPORT_MARKER] = ",".join(f"{k}={v}" for k, v in sorted(record.items()))
    if plan.oversubscribed and "torch" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
        # read once when libgomp loads (torch loads it): only effective before that
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if "numba" in sys.modules:  # otherwise it reads NUMBA_NUM_THREADS (just set) when imported
        _apply_numba(n)
    if "torch" in sys.modules:
        _apply_torch(n)
    _apply_blas(n)


def _apply_numba(n: int) -> None:
    """Size numba's pool to ``n`` if it has not started, and use ``n`` threads on this thread."""
    global _warned_pool
    import numba
    from numba.np.ufunc import parallel

    pool = int(getattr(parallel, "NUM_THREADS", numba.config.NUMBA_NUM_THREADS))
    if not getattr(parallel, "_is_initialized", True) and n <= pool:
        # the pool starts on the first parallel call with NUM_THREADS workers: start exactly n
        parallel.NUM_THREADS = n
        pool = n
    if n > pool and not _warned_pool:
        _warned_pool = True
        log.warning("threads: numba's pool holds %d thread(s) (NUMBA_NUM_THREADS when numba was imported); "
                    "using %d instead of %d. Set the thread count before importing numba", pool, pool, n)
    numba.set_num_threads(min(n, pool))


def _apply_torch(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # only possible before torch's first inter-op work; harmless otherwise
        pass


def _apply_blas(n: int) -> None:
    """Limit BLAS libraries already loaded (NumPy's OpenBLAS, MKL) to ``n`` threads."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    try:
        threadpool_limits(limits=n, user_api="blas")
    except Exception as exc:  # an exotic BLAS must not stop training
        log.debug("threads: threadpoolctl could not limit BLAS threads (%s)", exc)
