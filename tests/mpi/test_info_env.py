"""``hpc-graph info --env`` under mpiexec: every rank reports what it detected."""
import json

import pytest
from _run import run_mpi


@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_info_env_reports_every_rank(backend):
    proc = run_mpi(["-m", "hpc_graph.cli", "-q", "info", "--env", "--json", "--backend", backend], 2,
                   timeout=120, env={"OMP_NUM_THREADS": None, "NUMBA_NUM_THREADS": None,
                                     "HPC_GRAPH_EXPORTED_THREADS": None})
    ranks = json.loads(proc.stdout)  # only rank 0 prints
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["size"] for r in ranks} == {2}
    assert {r["local_rank"] for r in ranks} == {0, 1}
    assert len({r["pid"] for r in ranks}) == 2
    for r in ranks:  # no thread variables set: unbound ranks split the CPUs, and say so
        decided = r["threads"]["decided"]
        assert decided["source"] == "affinity" and decided["node_ranks"] == 2
        assert decided["threads"] == max(1, r["threads"]["cpu_affinity"] // 2)
        assert r["threads"]["torch_num_threads"] == decided["threads"]
    if backend == "torch":
        for r in ranks:
            d = r["torch_distributed_env"]
            assert d["RANK"] == str(r["rank"]) and d["WORLD_SIZE"] == "2"
            assert d["LOCAL_RANK"] == str(r["local_rank"]) and d["MASTER_PORT"]
        assert len({r["torch_distributed_env"]["MASTER_PORT"] for r in ranks}) == 1


def test_info_without_path_or_env_is_an_error():
    from hpc_graph.cli import main

    assert main(["info"]) == 2
