"""The Communicator interface in one process: LocalCommunicator, factory fallback, chunk plan, abort hook.

Multi-rank behaviour is tested under mpiexec in tests/mpi/test_comm.py.
"""
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from hpc_graph.comm import Communicator, get_communicator, install_abort_handler
from hpc_graph.comm.communicator import _chunk_ranges
from hpc_graph.comm.local import LocalCommunicator

_LAUNCHER_PREFIXES = ("PMI", "OMPI_", "SLURM_", "MV2_", "PALS_", "PMIX_", "JSM_", "MPI_LOCAL", "HYDRA")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(extra)
    return env


@pytest.fixture
def comm():
    return LocalCommunicator()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_collectives_are_identities_in_place(comm, dtype):
    gen = torch.Generator().manual_seed(0)
    t = (torch.randn(6, 5, generator=gen) * 100).to(dtype)
    ref = t.clone()
    ops = ["sum", "max", "min", "prod"] + (["mean"] if dtype.is_floating_point else [])
    for op in ops:
        assert comm.allreduce_(t, op) is t
        assert torch.equal(t, ref), op
    assert comm.bcast(t, root=0) is t and torch.equal(t, ref)
    parts = [t.clone(), t[:, 1].clone()]
    comm.allreduce_bucketed_(parts, bucket_bytes=8)
    assert torch.equal(parts[0], ref) and torch.equal(parts[1], ref[:, 1])
    assert comm.bytes_sent == 0 and comm.comm_seconds == 0.0


def test_alltoallv_returns_a_copy_with_counts(comm):
    send = torch.randn(7, 3)
    recv, counts = comm.alltoallv(send, [7])
    assert torch.equal(recv, send) and recv.data_ptr() != send.data_ptr()
    assert counts.dtype == np.int64 and counts.tolist() == [7]
    recv, counts = comm.alltoallv(torch.empty(0, 2, dtype=torch.int64), np.array([0]))
    assert recv.shape == (0, 2) and recv.dtype == torch.int64 and counts.tolist() == [0]


@pytest.mark.parametrize("counts, message", [([3, 4], "entries"), ([-1], "non-negative"), ([6], "sum")])
def test_alltoallv_rejects_bad_counts(comm, counts, message):
    with pytest.raises(ValueError, match=message):
        comm.alltoallv(torch.zeros(7, 2), counts)


def test_exchange_with_self_copies(comm):
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    got = comm.exchange({0: t.t()}, {0: ((4, 3), torch.float64)})
    assert torch.equal(got[0], t.t()) and got[0].data_ptr() != t.data_ptr()
    req = comm.exchange_start({0: t}, {0: ((12,), torch.float64)})
    first = req.wait()
    assert req.done and req.wait() is first
    assert torch.equal(first[0], t.reshape(-1))
    assert comm.exchange({}, {}) == {}
    assert comm.bytes_sent == 0


@pytest.mark.parametrize("sends, specs, message", [
    ({1: torch.zeros(2)}, {}, "out of range"),
    ({}, {-1: ((2,), torch.float32)}, "out of range"),
    ({0: torch.zeros(2)}, {}, "both sends and recv_specs"),
    ({0: torch.zeros(2)}, {0: ((3,), torch.float32)}, "does not match"),
    ({0: torch.zeros(2)}, {0: ((2,), torch.float64)}, "does not match"),
    ({0: torch.zeros(2)}, {0: ((2,), "float32")}, "torch.dtype"),
    ({0: torch.zeros(2)}, {0: 5}, "shape, dtype"),
    ({True: torch.zeros(2)}, {}, "integer"),
])
def test_exchange_rejects_bad_arguments(comm, sends, specs, message):
    with pytest.raises(ValueError, match=message):
        comm.exchange(sends, specs)


def test_argument_checks(comm):
    with pytest.raises(ValueError, match="op"):
        comm.allreduce_(torch.zeros(2), "avg")
    with pytest.raises(ValueError, match="floating"):
        comm.allreduce_(torch.zeros(2, dtype=torch.int64), "mean")
    with pytest.raises(ValueError, match="root"):
        comm.bcast(torch.zeros(2), root=1)
    with pytest.raises(ValueError, match="bucket_bytes"):
        comm.allreduce_bucketed_([torch.zeros(2)], bucket_bytes=0)
    with pytest.raises(ValueError, match="max_message_bytes"):
        LocalCommunicator(max_message_bytes=0)


def test_objects_barrier_and_counters(comm):
    obj = {"a": [1, 2], "b": "x"}
    assert comm.bcast_object(obj) is obj
    assert comm.allgather_object(obj) == [obj]
    comm.barrier()
    snap = comm.counters()
    assert snap["bytes_sent"] == 0 and set(snap) == {"bytes_sent", "comm_seconds", "bytes_by_op", "calls",
                                                     "modeled_seconds", "modeled_wait_seconds", "modeled_by_op",
                                                     "modeled_wait_by_op"}
    comm.comm_seconds, comm.bytes_sent = 1.0, 5
    comm.reset_counters()
    assert (comm.bytes_sent, comm.comm_seconds) == (0, 0.0)
    assert isinstance(comm, Communicator)
    assert (comm.rank, comm.size, comm.local_rank, comm.local_size, comm.backend) == (0, 1, 0, 1, "local")


def test_chunk_ranges_cover_exactly_within_limit():
    rng = np.random.default_rng(1)
    assert _chunk_ranges(0, 5) == []
    for _ in range(200):
        total, limit = int(rng.integers(0, 500)), int(rng.integers(1, 60))
        ranges = _chunk_ranges(total, limit)
        covered = np.zeros(total, dtype=np.int64)
        for start, stop in ranges:
            assert 0 < stop - start <= limit
            covered[start:stop] += 1
        assert (covered == 1).all()
        assert len(ranges) == -(-total // limit)
    with pytest.raises(ValueError):
        _chunk_ranges(10, 0)


def test_factory_without_launcher_is_local_and_cached():
    code = """
import sys
from hpc_graph.comm import get_communicator
a = get_communicator(); b = get_communicator("mpi"); t = get_communicator("torch")
c = get_communicator("mpi", max_message_bytes=16)
assert a is b and a.size == 1 and a.backend == "local" and t.backend == "local", (a, t)
assert c is not a and c.max_message_bytes == 16
assert "mpi4py.MPI" not in sys.modules
try:
    get_communicator("shmem")
except ValueError as exc:
    assert "shmem" in str(exc)
else:
    raise AssertionError("unknown backend accepted")
import mpi4py.MPI  # already imported: the factory now uses MPI (a singleton job of size 1)
m = get_communicator("mpi", max_message_bytes=16)
assert m.backend == "mpi" and m.size == 1 and m.rank == 0, m
import torch
x = torch.arange(5.0)
assert m.allreduce_(x) is x and torch.equal(x, torch.arange(5.0))
print("FACTORY OK")
m.abort(3)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_clean_env())
    assert "FACTORY OK" in out.stdout, out.stdout + out.stderr
    assert out.returncode == 3, (out.returncode, out.stderr)


def test_torchrun_environment_refuses_mpi_backend(monkeypatch):
    from hpc_graph.comm import factory

    for key in list(os.environ):
        if key.startswith(_LAUNCHER_PREFIXES):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(factory, "_CACHE", {})
    with pytest.raises(ValueError, match="torch"):
        get_communicator("mpi")


class _FakeComm:
    def __init__(self, rank, size):
        self.rank, self.size, self.aborted = rank, size, []

    def abort(self, code=1):
        self.aborted.append(code)


@pytest.fixture
def hooks(monkeypatch):
    calls = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: calls.append(("sys", a[0])))
    monkeypatch.setattr(threading, "excepthook", lambda args: calls.append(("thread", args.exc_type)))
    return calls


def _raise(exc):
    try:
        raise exc
    except Exception as caught:
        return type(caught), caught, caught.__traceback__


def test_abort_handler_logs_rank_and_aborts(hooks, caplog):
    fake = _FakeComm(rank=3, size=4)
    install_abort_handler(fake)
    with caplog.at_level(logging.ERROR):
        sys.excepthook(*_raise(ValueError("boom")))
    assert fake.aborted == [1]
    assert "rank 3: ValueError: boom" in caplog.text
    worker = threading.Thread(target=lambda: 1 / 0, name="prefetch")
    with caplog.at_level(logging.ERROR):
        worker.start()
        worker.join()
    assert fake.aborted == [1, 1]
    assert "rank 3 (thread 'prefetch'): ZeroDivisionError" in caplog.text
    # installing again swaps the communicator but keeps the original previous hooks
    other = _FakeComm(rank=0, size=1)
    install_abort_handler(other)
    sys.excepthook(*_raise(KeyError("k")))
    assert other.aborted == [] and fake.aborted == [1, 1]
    # the fake abort returns (a real one never does), so the original hooks ran once per error
    assert hooks == [("sys", ValueError), ("thread", ZeroDivisionError), ("sys", KeyError)]


def test_abort_handler_single_process_defers_to_previous_hooks(hooks):
    fake = _FakeComm(rank=0, size=1)
    install_abort_handler(fake)
    sys.excepthook(*_raise(RuntimeError("x")))
    worker = threading.Thread(target=lambda: 1 / 0)
    worker.start()
    worker.join()
    assert fake.aborted == []
    assert hooks == [("sys", RuntimeError), ("thread", ZeroDivisionError)]
