"""Launcher detection from environment variables, without importing MPI.

Every MPI launcher tells its processes their rank and the job size through
environment variables. Reading them lets code that must stay cheap (the CLI's
log prefix, ``info --env``, deciding whether MPI is needed at all) know where
it runs without calling ``MPI_Init``.

Recognised launchers, first match wins:

========== ===================================== ==================================
name       rank / size                           local rank / local size
========== ===================================== ==================================
openmpi    OMPI_COMM_WORLD_RANK / _SIZE          OMPI_COMM_WORLD_LOCAL_RANK / _SIZE
mvapich    MV2_COMM_WORLD_RANK / _SIZE           MV2_COMM_WORLD_LOCAL_RANK / _SIZE
pals       PALS_RANKID + PMI_SIZE (PBS / Cray)   PALS_LOCAL_RANKID / PALS_LOCAL_SIZE
hydra      PMI_RANK / PMI_SIZE (MPICH, Intel)    MPI_LOCALRANKID / MPI_LOCALNRANKS
slurm      SLURM_PROCID / SLURM_STEP_NUM_TASKS   SLURM_LOCALID / (tasks per node)
pmix       PMIX_RANK / (size from SLURM or PMI)  —
jsrun      JSM_NAMESPACE_RANK / _SIZE            JSM_NAMESPACE_LOCAL_RANK / _SIZE
torchrun   RANK / WORLD_SIZE                     LOCAL_RANK / LOCAL_WORLD_SIZE
========== ===================================== ==================================

SLURM variables count only inside a job *step* (``SLURM_STEP_ID`` set, i.e.
under ``srun``): a batch script itself is one process even when
``SLURM_NTASKS`` says 64. Without any launcher the answer is rank 0 of 1.
"""
from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any, Mapping

__all__ = ["detect_rank_size", "detect_local_rank", "detect_local_size", "launcher_name",
           "describe_environment", "local_device", "prepare_process", "select_mpi_library"]

# Variables shown by describe_environment(): exact names and prefixes.
_SHOWN_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_MCA_", "MV2_", "PMI_", "PMIX_RANK", "PMIX_NAMESPACE",
                   "MPI_LOCAL", "PALS_", "JSM_NAMESPACE_", "MPICH_", "I_MPI_", "UCX_", "FI_",
                   "OMP_", "MKL_NUM_THREADS", "NUMBA_", "CUDA_", "NCCL_", "CCL_", "HPC_GRAPH_",
                   "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                   "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
_SHOWN_SLURM = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                "SLURM_STEP_NUM_TASKS", "SLURM_NNODES", "SLURM_NODEID", "SLURM_CPUS_PER_TASK",
                "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_NODELIST")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "_KEY")


def _int(env: Mapping[str, str], name: str) -> int | None:
    """``int(env[name])``, ``None`` when unset or empty; ``ValueError`` naming it when malformed."""
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = _int(env, name)
        if value is not None:
            return value
    return None


def _in_slurm_step(env: Mapping[str, str]) -> bool:
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return step is not None and step.strip() not in ("", "batch", "extern", "interactive")


def _slurm_tasks_on_node(env: Mapping[str, str]) -> int | None:
    """Tasks of this step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` ("2(x3),1")."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID")
    if not spec or node is None:
        return None
    counts: list[int] = []
    try:
        for item in spec.split(","):
            if "(x" in item:
                value, reps = item.rstrip(")").split("(x")
                counts.extend([int(value)] * int(reps))
            else:
                counts.append(int(item))
    except ValueError:
        return None
    return counts[node] if 0 <= node < len(counts) else None


def _detect(env: Mapping[str, str]) -> tuple[str, int, int]:
    """``(launcher, rank, size)`` from ``env``; ``("none", 0, 1)`` without a launcher."""
    def pair(rank_var: str, size_vars: tuple[str, ...]) -> tuple[int, int] | None:
        rank = _int(env, rank_var)
        if rank is None:
            return None
        size = _first_int(env, size_vars)
        if size is None:
            return None
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"environment variables {rank_var}={rank} and {size_vars[0]}"
                             f"={size} are inconsistent (need 0 <= rank < size)")
        return rank, size

    slurm_size = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    candidates: list[tuple[str, str, tuple[str, ...], bool]] = [
        ("openmpi", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",), True),
        ("mvapich", "MV2_COMM_WORLD_RANK", ("MV2_COMM_WORLD_SIZE",), True),
        ("pals", "PALS_RANKID", ("PMI_SIZE", "PALS_SIZE"), True),
        ("hydra", "PMI_RANK", ("PMI_SIZE",), True),
        ("slurm", "SLURM_PROCID", slurm_size, _in_slurm_step(env)),
        ("pmix", "PMIX_RANK", ("PMIX_SIZE", "PMI_SIZE") + slurm_size, True),
        ("jsrun", "JSM_NAMESPACE_RANK", ("JSM_NAMESPACE_SIZE",), True),
        ("torchrun", "RANK", ("WORLD_SIZE",), True),
    ]
    for name, rank_var, size_vars, applies in candidates:
        if not applies:
            continue
        found = pair(rank_var, size_vars)
        if found is not None:
            return name, found[0], found[1]
    return "none", 0, 1


def detect_rank_size(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(rank, size)`` of this process from launcher variables; ``(0, 1)`` without a launcher.

    ``env`` defaults to ``os.environ``. Raises ``ValueError`` naming the variable
    when a launcher variable is malformed or rank/size are inconsistent.
    """
    _, rank, size = _detect(os.environ if env is None else env)
    return rank, size


def launcher_name(env: Mapping[str, str] | None = None) -> str:
    """Which launcher started this process: one of ``openmpi``, ``mvapich``, ``pals``,
    ``hydra``, ``slurm``, ``pmix``, ``jsrun``, ``torchrun``, or ``none``."""
    return _detect(os.environ if env is None else env)[0]


_LOCAL_RANK_VARS = {
    "openmpi": ("OMPI_COMM_WORLD_LOCAL_RANK",),
    "mvapich": ("MV2_COMM_WORLD_LOCAL_RANK",),
    "pals": ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"),
    "hydra": ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
    "slurm": ("SLURM_LOCALID",),
    "pmix": ("PMIX_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
    "jsrun": ("JSM_NAMESPACE_LOCAL_RANK",),
    "torchrun": ("LOCAL_RANK",),
}
_LOCAL_SIZE_VARS = {
    "openmpi": ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    "mvapich": ("MV2_COMM_WORLD_LOCAL_SIZE",),
    "pals": ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
    "hydra": ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
    "slurm": (),
    "pmix": ("PMIX_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "jsrun": ("JSM_NAMESPACE_LOCAL_SIZE",),
    "torchrun": ("LOCAL_WORLD_SIZE",),
}
_ANY_LOCAL_RANK = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                   "SLURM_LOCALID", "PALS_LOCAL_RANKID", "PMI_LOCAL_RANK",
                   "JSM_NAMESPACE_LOCAL_RANK", "LOCAL_RANK")


def detect_local_rank(env: Mapping[str, str] | None = None) -> int:
    """Rank of this process among the processes of its node (0 without a launcher).

    Prefers the detected launcher's own variable, then any known local-rank variable.
    """
    env = os.environ if env is None else env
    launcher = _detect(env)[0]
    if launcher == "none":
        return 0
    value = _first_int(env, _LOCAL_RANK_VARS.get(launcher, ()) + _ANY_LOCAL_RANK)
    return 0 if value is None else value


def detect_local_size(env: Mapping[str, str] | None = None) -> int | None:
    """Processes of this job on this node, ``None`` when the launcher does not say (1 without one)."""
    env = os.environ if env is None else env
    launcher = _detect(env)[0]
    if launcher == "none":
        return 1
    if launcher == "slurm":
        return _slurm_tasks_on_node(env)
    return _first_int(env, _LOCAL_SIZE_VARS.get(launcher, ()))


def local_device(local_rank: int | None = None):
    """The torch device this process should use: ``cuda:(local_rank % visible GPUs)`` or ``cpu``.

    Each rank on a node takes a different GPU when there are enough; torch is
    imported here, not at module import.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        lr = detect_local_rank() if local_rank is None else int(local_rank)
        return torch.device("cuda", lr % torch.cuda.device_count())
    return torch.device("cpu")


def _shown_variables(env: Mapping[str, str]) -> dict[str, str]:
    shown = {}
    for key in sorted(env):
        if any(word in key.upper() for word in _SECRET_WORDS):
            continue
        if key.startswith(_SHOWN_PREFIXES) or key in _SHOWN_SLURM:
            shown[key] = env[key]
    return shown


def _cpu_affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cuda_info() -> dict[str, Any]:
    info: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import torch

        available = torch.cuda.is_available()
        info["torch_cuda_available"] = available
        info["device_count"] = torch.cuda.device_count() if available else 0
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
    except Exception as exc:  # a broken driver must not break `info --env`
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def describe_environment(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything about where this process runs, as a JSON-serialisable dict.

    Keys: ``rank``, ``size``, ``local_rank``, ``local_size``, ``launcher``,
    ``hostname``, ``pid``, ``python``, ``platform``, ``threads`` (cpu count,
    affinity, OMP/torch thread settings), ``cuda`` (visible devices),
    ``packages`` (versions of torch, mpi4py, numba, h5py), ``mpiexec`` (path
    or ``None``) and ``env`` (the launcher, threading, CUDA and hpc_graph
    variables that matter). MPI is not imported.
    """
    import shutil

    env = os.environ if env is None else env
    launcher, rank, size = _detect(env)
    threads: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": _cpu_affinity(),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS"),
        "NUMBA_NUM_THREADS": env.get("NUMBA_NUM_THREADS"),
    }
    try:
        import torch

        threads["torch_num_threads"] = torch.get_num_threads()
    except Exception:  # torch missing or broken: report without it
        threads["torch_num_threads"] = None
    return {
        "rank": rank,
        "size": size,
        "local_rank": detect_local_rank(env),
        "local_size": detect_local_size(env),
        "launcher": launcher,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "threads": threads,
        "cuda": _cuda_info(),
        "packages": {name: _package_version(name)
                     for name in ("torch", "mpi4py", "numba", "h5py", "numpy")},
        "mpiexec": shutil.which("mpiexec"),
        "env": _shown_variables(env),
    }


def prepare_process(environ: dict | None = None) -> None:
    """The process-wide settings of hpc_graph's entry points (the ``hpc-graph`` command, :func:`hpc_graph.init`),
    made once before torch creates a tensor and before mpi4py loads an MPI library; a value the user set is kept:

    * ``THP_MEM_ALLOC_ENABLE=1``: torch puts large CPU tensors on transparent huge pages. torch reads it at its
      first CPU allocation. Without it every fresh 128 MiB activation or gradient takes 32,768 page faults to
      write (64 with 2 MiB pages) and its rows miss the TLB when gathered at random.
    * ``MPI4PY_LIBMPI``: :func:`select_mpi_library` (ranks started by Open MPI's launcher load Open MPI).
    """
    env = os.environ if environ is None else environ
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    select_mpi_library(env)


def select_mpi_library(environ: dict | None = None) -> str | None:
    """Make mpi4py load Open MPI's library when Open MPI's launcher started this process.

    The mpi4py wheel carries one extension per MPI ABI and, unless told otherwise, loads the first
    ``libmpi`` it finds beside Python: with the ``mpich`` wheel installed that is MPICH's, and ranks
    started by ``mpiexec.openmpi`` would then each come up as a world of one. When Open MPI's launcher
    variables are set (``OMPI_COMM_WORLD_SIZE``), mpi4py has not been imported yet and the user chose
    no library (``MPI4PY_LIBMPI`` / ``MPI4PY_MPIABI``), this sets ``MPI4PY_LIBMPI`` to the system's
    Open MPI library (``libmpi.so.40``). That is what lets PT-Scotch's ParMETIS API (built against
    Open MPI on Debian/Ubuntu) run in our processes (docs/partitioning.md). Returns the library chosen,
    or None when nothing was changed.
    """
    env = os.environ if environ is None else environ
    if "OMPI_COMM_WORLD_SIZE" not in env or "MPI4PY_LIBMPI" in env or "MPI4PY_MPIABI" in env:
        return None
    if "mpi4py.MPI" in sys.modules:
        return None
    import ctypes.util

    found = ctypes.util.find_library("mpi") or "libmpi.so.40"
    env["MPI4PY_LIBMPI"] = found
    return found
