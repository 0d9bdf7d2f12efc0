"""Bind the ParMETIS API (``ParMETIS_V3_PartKway``) through ctypes, for the distributed partitioner.

Which library: ``HPC_GRAPH_PARMETIS_LIB`` (a path or a soname; ``HPC_GRAPH_PARMETIS_IDX=32|64`` gives
its index width when the name does not) or else PT-Scotch's implementation of the ParMETIS API as
Debian/Ubuntu package it (``libscotchparmetis-dev``: 64-bit indices under
``/usr/lib/<arch>/scotch-int64/``, 32-bit ones as the default ``libptscotchparmetisv3.so``), or a real
``libparmetis.so`` on the loader's path (32-bit indices, as ParMETIS and Debian's non-free
``libparmetis4.0`` build it).

One process cannot hold two MPI libraries. The library found is checked against the MPI library this
process uses (mpi4py's): a PT-Scotch built against Open MPI (as Debian's is) refuses to run in a process
started by MPICH's ``mpiexec`` with an error that says how to launch instead
(``mpiexec.openmpi``, see docs/partitioning.md). The call receives mpi4py's communicator handle
(``MPI_Comm *``), so it runs on exactly the ranks the caller chose.

PT-Scotch's ParMETIS layer honours one balance constraint (it reads the first ``n`` vertex weights
whatever ``ncon`` says), real ParMETIS several: :func:`part_kway` passes what the library supports
and says which (``ParMetisLibrary.multi_constraint``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from data_io.errors import DataError

log = logging.getLogger(__name__)

INSTALL_HINT = ("install PT-Scotch's ParMETIS API (Debian/Ubuntu: apt-get install libscotchparmetis-dev "
                "libptscotch-dev openmpi-bin) or point HPC_GRAPH_PARMETIS_LIB at a libparmetis.so built "
                "against the MPI you launch with; the serial path (hpc-graph partition without "
                "--distributed) needs none of this")


class ParMetisUnavailable(DataError):
    """No usable ParMETIS-API library in this process (missing, or built for another MPI)."""


@dataclass
class ParMetisLibrary:
    """A loaded ParMETIS-API library: ``path``, ``idx`` (numpy index dtype), ``scotch`` (PT-Scotch's
    implementation), ``mpi`` ("openmpi" / "mpich" / "unknown": the MPI it was linked with)."""

    path: str
    idx: Any
    scotch: bool
    mpi: str
    _lib: Any = None

    @property
    def multi_constraint(self) -> bool:
        """Whether more than one balance constraint (``ncon > 1``) is honoured."""
        return not self.scotch


def _resolve(name: str) -> str | None:
    """A soname as ``ctypes.util.find_library`` gives it -> the file the loader would open."""
    if os.path.isabs(name):
        return name if os.path.exists(name) else None
    import subprocess

    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        left, _, right = line.partition("=>")
        if left.strip().split(" ")[0] == name and right.strip():
            return right.strip()
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


def _linked_mpi(path: str) -> str:
    """Which MPI a shared library was linked with, from the ``libmpi`` soname it names ("none" when it
    names none, "unreadable" when the file cannot be read)."""
    try:
        with open(os.path.realpath(path), "rb") as fh:
            data = fh.read()
    except OSError:
        return "unreadable"
    if b"libmpi.so.40" in data:
        return "openmpi"
    if b"libmpi.so.12" in data or b"libmpich" in data:
        return "mpich"
    return "none"


def process_mpi() -> str:
    """The MPI library of this process, as mpi4py loaded it: "openmpi", "mpich" or "unknown"."""
    from mpi4py import MPI

    version = MPI.Get_library_version()
    if "Open MPI" in version:
        return "openmpi"
    if "MPICH" in version or "Intel(R) MPI" in version or "CRAY MPICH" in version:
        return "mpich"
    return "unknown"


def _candidates() -> list[tuple[str, int, list[str]]]:
    """``(library, index bits, libraries to preload)`` in the order they are tried."""
    custom = os.environ.get("HPC_GRAPH_PARMETIS_LIB")
    if custom:
        bits = os.environ.get("HPC_GRAPH_PARMETIS_IDX", "64" if "64" in os.path.basename(os.path.dirname(custom))
                              else "32")
        if bits not in ("32", "64"):
            raise ParMetisUnavailable(f"HPC_GRAPH_PARMETIS_IDX: expected 32 or 64, got {bits!r}")
        return [(custom, int(bits), [])]
    out = []
    for d in sorted(glob.glob("/usr/lib/*/scotch-int64")) + sorted(glob.glob("/usr/lib64/scotch-int64")):
        lib = sorted(glob.glob(os.path.join(d, "libptscotchparmetisv3*.so*")))
        if lib:  # its own libptscotch first, or the loader would bind the default (32-bit) one
            pre = [p for n in ("libscotcherr", "libscotch-", "libptscotcherr", "libptscotch-")
                   for p in sorted(glob.glob(os.path.join(d, n + "*.so")))[:1]]
            out.append((lib[0], 64, pre))
    for name in ("ptscotchparmetisv3", "parmetis"):
        found = ctypes.util.find_library(name)
        path = _resolve(found) if found else None
        if path and all(os.path.realpath(path) != os.path.realpath(c[0]) for c in out):
            out.append((path, 32, []))  # both build with 32-bit indices unless configured otherwise
    return out


_LOADED: dict[str, ParMetisLibrary] = {}


def load_library() -> ParMetisLibrary:
    """Find and load the ParMETIS-API library (cached); raise :class:`ParMetisUnavailable` if none fits."""
    cands = _candidates()
    if not cands:
        raise ParMetisUnavailable(f"no ParMETIS-API library found: {INSTALL_HINT}")
    mine = process_mpi()
    problems = []
    for path, bits, preload in cands:
        if path in _LOADED:
            return _LOADED[path]
        linked = _linked_mpi(path)
        if linked == "unreadable":  # loading a library built for another MPI would kill the process
            problems.append(f"{path}: cannot be read to check which MPI it needs")
            continue
        if linked != "none" and mine != "unknown" and linked != mine:
            problems.append(f"{path} is built against {linked} but this process runs {mine}")
            continue
        try:
            for p in preload:
                ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(path)
            fn = lib.ParMETIS_V3_PartKway
        except (OSError, AttributeError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 15
        scotch = hasattr(lib, "SCOTCH_ParMETIS_V3_PartKway") or "scotch" in os.path.basename(path)
        out = ParMetisLibrary(path, np.int64 if bits == 64 else np.int32, scotch, linked, lib)
        _LOADED[path] = out
        log.info("ParMETIS API from %s (%s, %d-bit indices, MPI %s)", path,
                 "PT-Scotch" if scotch else "ParMETIS", bits, linked)
        return out
    detail = "; ".join(problems)
    if mine == "mpich" and any("openmpi" in p for p in problems):
        raise ParMetisUnavailable(
            f"the ParMETIS API library here ({cands[0][0]}) is built for Open MPI but this launch runs MPICH: "
            f"start it with Open MPI's launcher (mpiexec.openmpi -n R hpc-graph partition --distributed ...; "
            f"docs/partitioning.md) or drop --distributed for the serial path")
    raise ParMetisUnavailable(f"no usable ParMETIS-API library ({detail}): {INSTALL_HINT}")


def part_kway(lib: ParMetisLibrary, comm: Any, vtxdist: np.ndarray, xadj: np.ndarray, adjncy: np.ndarray,
              vwgt: np.ndarray, num_parts: int, *, seed: int = 0, imbalance: float = 1.05,
              adjwgt: np.ndarray | None = None) -> np.ndarray:
    """``ParMETIS_V3_PartKway`` on this rank's slice of a distributed undirected graph (collective).

    Args:
        lib: from :func:`load_library`.
        comm: the mpi4py communicator whose ranks hold the graph (its ``MPI_Comm`` is passed).
        vtxdist: int[R+1], rank r holds vertices ``[vtxdist[r], vtxdist[r+1])`` (every rank >= 1 vertex).
        xadj: int[n+1]; adjncy: int[xadj[-1]] global neighbour ids (symmetric, no self loops).
        vwgt: int[n, ncon] vertex weights (only the first column is used when the library honours
            one constraint).
        num_parts: parts wanted (need not equal the rank count).
        seed: random seed (``options[2]``).
        imbalance: allowed max/mean weight per part and constraint (``ubvec``).
        adjwgt: int[xadj[-1]] edge weights (positive, symmetric), or None for unit weights.
    Returns:
        int64[n] part of each local vertex.
    """
    idx = lib.idx
    vwgt = np.asarray(vwgt)
    if vwgt.ndim == 1:
        vwgt = vwgt[:, None]
    if not lib.multi_constraint:
        vwgt = vwgt[:, :1]
    n, ncon = vwgt.shape
    big = np.iinfo(idx).max
    if int(vtxdist[-1]) > big or len(adjncy) > big:
        raise DataError(f"graph too large for the ParMETIS library's {np.dtype(idx).itemsize * 8}-bit indices "
                        f"({lib.path})")
    keep = []

    def arr(a, dtype=idx):
        a = np.ascontiguousarray(a, dtype=dtype)
        keep.append(a)
        return ctypes.c_void_p(a.ctypes.data)

    part = np.zeros(max(n, 1), dtype=idx)
    edgecut = np.zeros(1, dtype=idx)
    options = np.array([1, 0, int(seed) & 0x7FFFFFFF, 0], dtype=idx)  # [use options, debug level, seed, ...]
    tpwgts = np.full(num_parts * ncon, 1.0 / num_parts, dtype=np.float32)
    ubvec = np.full(ncon, imbalance, dtype=np.float32)
    from mpi4py import MPI

    handle = MPI.Comm(comm)  # keep the object alive while its handle's address is used
    if adjwgt is not None and len(adjwgt) != len(adjncy):
        raise DataError(f"adjwgt: {len(adjwgt)} edge weights for {len(adjncy)} adjacency entries")
    ewgt = None if adjwgt is None else arr(adjwgt if len(adjwgt) else np.ones(1))
    if adjwgt is not None and len(adjwgt) and int(np.max(adjwgt)) > big:
        raise DataError(f"edge weights too large for the ParMETIS library's {np.dtype(idx).itemsize * 8}-bit "
                        f"indices ({lib.path})")
    status = lib._lib.ParMETIS_V3_PartKway(
        arr(vtxdist), arr(xadj), arr(adjncy if len(adjncy) else np.zeros(1)), arr(vwgt.ravel()), ewgt,
        arr([2 if adjwgt is None else 3]), arr([0]), arr([ncon]), arr([num_parts]), arr(tpwgts, np.float32),
        arr(ubvec, np.float32), arr(options), ctypes.c_void_p(edgecut.ctypes.data), ctypes.c_void_p(part.ctypes.data),
        ctypes.c_void_p(MPI._addressof(handle)))
    if status != 1:  # METIS_OK
        raise DataError(f"ParMETIS_V3_PartKway failed (status {status}) with {lib.path} on {int(vtxdist[-1])} "
                        f"vertices, {num_parts} parts")
    return part[:n].astype(np.int64)
