"""The stall watchdog of every communicator (``Communicator.set_timeout``): a blocking call that makes no
progress for the timeout aborts the job with the status the owner chose, naming the rank and the operation;
calls that finish in time, a timeout of 0 and a one-rank job never do. (A real stopped rank under mpiexec:
tests/mpi/test_reliability.py.)"""
from __future__ import annotations

import logging
import threading
import time

import pytest

from hpc_graph.comm.communicator import Communicator


class _Stalling(Communicator):
    """A communicator of ``size`` ranks whose ``barrier`` waits until released; ``abort`` records its status."""

    backend = "test"

    def __init__(self, size: int = 2):
        super().__init__(rank=1, size=size, local_rank=1, local_size=size)
        self.release, self.aborted = threading.Event(), threading.Event()
        self.status: int | None = None

    def barrier(self) -> None:
        with self._timed("barrier"):
            self.release.wait(30)

    def abort(self, code: int = 1):
        self.status = code
        self.aborted.set()
        self.release.set()  # a real abort never returns; here the stalled call ends
        threading.Event().wait()  # the watchdog thread stays here, as a process would be gone

    def _unused(self, *a, **k):
        raise NotImplementedError

    _device_capable = _isend = _irecv = _waitall = _allreduce_flat = _bcast_flat = _unused
    _alltoall_int64 = _alltoallv_bytes = allgather_object = _unused


def test_a_call_without_progress_aborts_with_the_chosen_status_naming_rank_and_operation(caplog):
    comm = _Stalling()
    comm.set_timeout(0.3, lambda: 75)
    t0 = time.monotonic()
    with caplog.at_level(logging.CRITICAL, logger="hpc_graph.comm.communicator"):
        comm.barrier()
    assert comm.aborted.is_set() and comm.status == 75
    assert 0.3 <= time.monotonic() - t0 < 5
    assert "rank 1: barrier made no progress for" in caplog.text and "comm.timeout 0.3 s" in caplog.text


def test_a_polled_wait_is_watched_like_a_blocking_call(caplog):
    comm = _Stalling()
    comm.set_timeout(0.3, lambda: 3)
    polls = 0
    with caplog.at_level(logging.CRITICAL, logger="hpc_graph.comm.communicator"), comm.watched("exchange"):
        while not comm.aborted.is_set() and polls < 3000:  # a peer that never sends; at most 30 s
            polls += 1
            time.sleep(0.01)
    assert comm.aborted.is_set() and comm.status == 3
    assert "rank 1: exchange made no progress for" in caplog.text
    assert comm._blocked is None and comm.comm_seconds == 0.0  # not timed: the loop may compute


def test_a_polled_wait_that_ends_in_time_never_aborts():
    comm = _Stalling()
    comm.set_timeout(0.3)
    for _ in range(10):  # ten short polled waits, 1 s in all: each well under the timeout
        with comm.watched("exchange"):
            time.sleep(0.1)
        time.sleep(0.01)
    assert not comm.aborted.is_set() and comm._blocked is None


@pytest.mark.parametrize("timeout,size", [(0.0, 2), (0.3, 1)])
def test_no_watchdog_when_off_or_alone(timeout, size):
    comm = _Stalling(size)
    comm.set_timeout(timeout)
    threading.Timer(1.0, comm.release.set).start()
    comm.barrier()
    assert not comm.aborted.is_set() and comm._watchdog is None


def test_calls_that_finish_in_time_are_left_alone():
    comm = _Stalling()
    comm.set_timeout(0.5)
    for _ in range(4):  # 4 x 0.2 s: longer than the timeout together, each call well inside it
        threading.Timer(0.2, comm.release.set).start()
        comm.barrier()
        comm.release.clear()
    time.sleep(0.6)  # idle between calls: nothing is waiting
    assert not comm.aborted.is_set()
