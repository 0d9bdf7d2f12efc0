"""Shared pytest fixtures: small random graphs with every awkward feature at once.

``awkward_graph(seed, num_dst, num_src, num_edges)`` (fixture ``awkward_graph``
returns the function) builds a destination-major CSR as NumPy arrays with

* destination rows without in-edges (including the last row),
* isolated nodes (no in- or out-edges) when ``num_src == num_dst``,
* self-loops (square graphs) and duplicate edges,
* one hub row holding about 40% of all edges,
* random edge order within each row.

The function is importable without pytest (``sys.path`` + ``import conftest``)
so that subprocess checks (CUDA simulator) use the same graphs.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


def awkward_edges(seed: int = 0, num_dst: int = 23, num_src: int | None = None,
                  num_edges: int = 120) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` int64 edge lists with the awkward features listed in the module docstring."""
    rng = np.random.default_rng(seed)
    square = num_src is None or num_src == num_dst
    ns = num_dst if num_src is None else num_src
    nd = num_dst
    assert nd >= 6 and ns >= 4, "awkward graphs need at least 6 destinations and 4 sources"
    ids = rng.permutation(nd)
    isolated = set(ids[:2].tolist()) if square else set()  # no in- and no out-edges
    empty = set(ids[2:4].tolist()) | {nd - 1}  # rows without in-edges
    hub = int(ids[4])
    dst_pool = np.array([i for i in range(nd) if i not in isolated | empty | {hub}], dtype=np.int64)
    src_pool = np.array([j for j in range(ns) if j not in isolated], dtype=np.int64)
    n_hub = int(0.4 * num_edges)
    n_rest = max(num_edges - n_hub, 0)
    dst = np.concatenate([np.full(n_hub, hub), rng.choice(dst_pool, n_rest)])
    src = rng.choice(src_pool, dst.shape[0])
    if square:  # self-loops on a few ordinary rows
        loops = rng.choice(dst_pool, min(3, dst_pool.shape[0]), replace=False)
        src = np.concatenate([src, loops])
        dst = np.concatenate([dst, loops])
    dup = rng.choice(dst.shape[0], 5, replace=False)  # duplicate edges
    src = np.concatenate([src, src[dup]])
    dst = np.concatenate([dst, dst[dup]])
    order = rng.permutation(dst.shape[0])
    return src[order].astype(np.int64), dst[order].astype(np.int64)


def awkward_graph(seed: int = 0, num_dst: int = 23, num_src: int | None = None,
                  num_edges: int = 120) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr int64[num_dst+1], indices int64[E])``: a CSR over destinations of :func:`awkward_edges`."""
    src, dst = awkward_edges(seed, num_dst, num_src, num_edges)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return indptr, src[order]


def pytest_configure(config):
    """Decide this process's threads the way every hpc_graph entry point does."""
    from hpc_graph.comm.threads import configure_threads

    configure_threads()


def pytest_collection_modifyitems(session, config, items):
    """Run the multi-rank tests (``tests/mpi/``) last, after the in-process ones.

    Why: numba compiles a kernel the first time a process calls it and caches the machine code on disk
    (``cache=True``); on a fresh clone, as in CI, every cache is cold. Each rank of an ``mpiexec`` run is a
    process of its own, so a kernel first met there is compiled by every rank at once, on the same cores
    (up to four times over). Run after the kernel and operator tests, the ranks find most kernels compiled.
    The order within each group is unchanged."""
    mpi_dir = Path(__file__).resolve().parent / "mpi"
    items[:] = sorted(items, key=lambda item: Path(item.path).resolve().is_relative_to(mpi_dir))


@pytest.fixture(name="awkward_graph")
def _awkward_graph_fixture():
    """The :func:`awkward_graph` builder: ``awkward_graph(seed, num_dst, num_src, num_edges)``."""
    return awkward_graph


@pytest.fixture
def datasets_dir() -> Path:
    """Folder of the real datasets (``HPC_GRAPH_DATASETS``, default ``<repo>/tests/data``, shipped with the tests)."""
    default = Path(__file__).resolve().parent / "data"
    return Path(os.environ.get("HPC_GRAPH_DATASETS", default))
