"""Multi-rank tests of hpc_graph.comm under real mpiexec (oversubscribed, always with a timeout).

The scripts compare every operation with a NumPy reference built from
per-rank data seeded by rank; see tests/mpi/scripts/comm_ops.py.
"""
import pytest
from _run import SCRIPTS, run_mpi


def _all_ok(proc, nprocs, backends):
    for backend in backends:
        for rank in range(nprocs):
            assert f"OK {backend} rank {rank}" in proc.stdout, proc.stdout + proc.stderr


def test_mpi_and_torch_backends_on_2_ranks():
    """Both backends in one job (saves a launch): torch.distributed bootstraps from MPI here."""
    proc = run_mpi([SCRIPTS / "comm_ops.py", "--backend", "mpi,torch", "--tiny-limit", "24"], 2, timeout=120)
    _all_ok(proc, 2, ["mpi", "torch"])


def test_mpi_backend_on_4_ranks():
    proc = run_mpi([SCRIPTS / "comm_ops.py", "--backend", "mpi", "--tiny-limit", "40"], 4, timeout=120)
    _all_ok(proc, 4, ["mpi"])


def test_exception_on_one_rank_aborts_the_job():
    proc = run_mpi([SCRIPTS / "comm_abort.py", "--fail-rank", "2"], 4, timeout=60, check=False)
    assert proc.returncode != 0, proc.stdout
    assert proc.elapsed < 30, f"abort took {proc.elapsed:.1f} s"
    assert "rank 2: ValueError: deliberate failure on rank 2" in proc.stderr, proc.stderr
    assert "was not aborted" not in proc.stdout


def test_exception_in_a_thread_aborts_the_job():
    proc = run_mpi([SCRIPTS / "comm_abort.py", "--fail-rank", "1", "--in-thread"], 2, timeout=60, check=False)
    assert proc.returncode != 0, proc.stdout
    assert proc.elapsed < 30, f"abort took {proc.elapsed:.1f} s"
    assert "rank 1 (thread 'worker'): ValueError: deliberate failure on rank 1" in proc.stderr, proc.stderr
    assert "was not aborted" not in proc.stdout


@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_modelled_link_charges_exchanges_and_allreduce(backend):
    proc = run_mpi([SCRIPTS / "link_model.py", backend], 2, timeout=120)
    assert proc.stdout.count("OK rank") == 2
