"""Multi-rank tests of hpc_graph.comm under real mpiexec (oversubscribed, always with a timeout).

The scripts compare every operation with a NumPy reference built from
per-rank data seeded by rank; see tests/mpi/scripts/comm_ops.py.

Starting a rank costs seconds (an interpreter importing torch), so each rank count runs one job
(a module fixture) and several tests read it: the 2-rank job checks both backends, runs the
modelled-link checks on each, then fails rank 1 in a thread; the 4-rank job checks the MPI backend,
then fails rank 2. The abort is timed from the moment the failing rank raises.
"""
import re
import time

import pytest
from _run import SCRIPTS, run_mpi

ABORT_LIMIT_S = 30  # a rank's uncaught exception must end the whole job within this


def _job(nprocs, *args):
    proc = run_mpi([SCRIPTS / "comm_ops.py", *args], nprocs, timeout=180, check=False)
    proc.ended = time.time()
    return proc


@pytest.fixture(scope="module")
def job2():
    """2 ranks: mpi and torch backends, link_model.py after each, then rank 1 fails in a thread."""
    return _job(2, "--backend", "mpi,torch", "--tiny-limit", "24", "--link-model", "--fail-rank", "1",
                "--in-thread")


@pytest.fixture(scope="module")
def job4():
    """4 ranks: mpi backend, then rank 2 fails."""
    return _job(4, "--backend", "mpi", "--tiny-limit", "40", "--fail-rank", "2")


def _all_ok(proc, nprocs, backends, what="OK"):
    for backend in backends:
        for rank in range(nprocs):
            assert f"{what} {backend} rank {rank}" in proc.stdout, (
                f"no '{what} {backend} rank {rank}' line: its checks failed or never ran\n"
                + proc.stdout + proc.stderr)


def _aborted_quickly(proc, nprocs, rank, message):
    """The deliberate failure of ``rank`` (after every check passed) ended the job quickly, naming the rank."""
    _all_ok(proc, nprocs, ["mpi"])  # the job reached the deliberate failure, not an earlier one
    assert proc.returncode != 0, proc.stdout
    assert message in proc.stderr, proc.stderr
    assert "was not aborted" not in proc.stdout
    failed = re.findall(rf"^FAILING rank {rank} at ([0-9.]+)$", proc.stdout, re.M)
    assert len(failed) == 1, proc.stdout
    took = proc.ended - float(failed[0])
    assert took < ABORT_LIMIT_S, f"abort took {took:.1f} s after rank {rank} raised"


def test_mpi_and_torch_backends_on_2_ranks(job2):
    """Both backends in one job: torch.distributed bootstraps from MPI here."""
    _all_ok(job2, 2, ["mpi", "torch"])


def test_mpi_backend_on_4_ranks(job4):
    _all_ok(job4, 4, ["mpi"])


def test_exception_on_one_rank_aborts_the_job(job4):
    _aborted_quickly(job4, 4, 2, "rank 2: ValueError: deliberate failure on rank 2")


def test_exception_in_a_thread_aborts_the_job(job2):
    _aborted_quickly(job2, 2, 1, "rank 1 (thread 'worker'): ValueError: deliberate failure on rank 1")


@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_modelled_link_charges_exchanges_and_allreduce(job2, backend):
    _all_ok(job2, 2, [backend], what="OK link")
