"""Launcher detection from environment variables (no MPI involved)."""
import json
import subprocess
import sys

import pytest

from hpc_graph.comm import env as comm_env
from hpc_graph.comm.env import (describe_environment, detect_local_rank, detect_local_size,
                                detect_rank_size, launcher_name)

# launcher -> (variables it sets for rank 3 of 8, local rank 1 of 4)
LAUNCHERS = {
    "openmpi": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
    "mvapich": {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "8",
                "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "4"},
    "hydra": {"PMI_RANK": "3", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4",
              "PMI_FD": "9"},
    "pals": {"PALS_RANKID": "3", "PMI_RANK": "3", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "1",
             "PALS_LOCAL_SIZE": "4"},
    "slurm": {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8",
              "SLURM_STEP_ID": "0", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
              "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "77"},
    "jsrun": {"JSM_NAMESPACE_RANK": "3", "JSM_NAMESPACE_SIZE": "8", "JSM_NAMESPACE_LOCAL_RANK": "1",
              "JSM_NAMESPACE_LOCAL_SIZE": "4"},
    "torchrun": {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                 "MASTER_ADDR": "n1", "MASTER_PORT": "29500"},
}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_each_launcher_is_recognised(name):
    env = LAUNCHERS[name]
    assert launcher_name(env) == name
    assert detect_rank_size(env) == (3, 8)
    assert detect_local_rank(env) == 1
    assert detect_local_size(env) == 4


def test_no_launcher_is_rank_0_of_1():
    env = {"HOME": "/root", "PATH": "/usr/bin"}
    assert launcher_name(env) == "none"
    assert detect_rank_size(env) == (0, 1)
    assert detect_local_rank(env) == 0 and detect_local_size(env) == 1


def test_slurm_batch_script_is_one_process():
    # sbatch sets SLURM_PROCID/SLURM_NTASKS in the batch script, which is one process, not a step
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "64", "SLURM_JOB_ID": "5", "SLURM_LOCALID": "0"}
    assert detect_rank_size(env) == (0, 1)
    assert launcher_name(env) == "none"
    env["SLURM_STEP_ID"] = "batch"
    assert detect_rank_size(env) == (0, 1)


def test_pmix_takes_size_from_slurm():
    env = {"PMIX_RANK": "5", "SLURM_STEP_ID": "batch", "SLURM_STEP_NUM_TASKS": "6",
           "SLURM_LOCALID": "2"}
    assert launcher_name(env) == "pmix"
    assert detect_rank_size(env) == (5, 6)
    assert detect_local_rank(env) == 2


def test_open_mpi_wins_over_slurm_and_pmi_variables():
    env = dict(LAUNCHERS["slurm"], OMPI_COMM_WORLD_RANK="6", OMPI_COMM_WORLD_SIZE="7",
               OMPI_COMM_WORLD_LOCAL_RANK="0")
    assert launcher_name(env) == "openmpi"
    assert detect_rank_size(env) == (6, 7)
    assert detect_local_rank(env) == 0


def test_slurm_tasks_per_node_forms():
    base = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "7", "SLURM_STEP_ID": "3"}
    for spec, node, expected in [("2(x3),1", 0, 2), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1),
                                 ("5", 0, 5), ("garbage", 0, None), ("2(x3)", 9, None)]:
        env = dict(base, SLURM_STEP_TASKS_PER_NODE=spec, SLURM_NODEID=str(node))
        assert detect_local_size(env) == expected, (spec, node)


@pytest.mark.parametrize("env, word", [
    ({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK"),
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "PMI_RANK"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}, "OMPI_COMM_WORLD_SIZE"),
])
def test_malformed_variables_name_the_variable(env, word):
    with pytest.raises(ValueError, match=word):
        detect_rank_size(env)


def test_reads_os_environ_by_default(monkeypatch):
    for key in list(comm_env.os.environ):
        if key.startswith(("PMI", "OMPI_", "SLURM_", "MV2_", "PALS_", "PMIX_", "JSM_")) or \
                key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MPI_LOCALRANKID"):
            monkeypatch.delenv(key)
    assert detect_rank_size() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "3")
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    assert detect_rank_size() == (1, 3)
    assert launcher_name() == "hydra" and detect_local_rank() == 1


def test_describe_environment_is_complete_and_serialisable():
    env = dict(LAUNCHERS["hydra"], OMP_NUM_THREADS="2", HPC_GRAPH_X="1", GITHUB_TOKEN="secret",
               MY_API_KEY="k", HOME="/root", CUDA_VISIBLE_DEVICES="0,1")
    info = describe_environment(env)
    json.dumps(info)  # must be JSON-serialisable for `info --env`
    assert (info["rank"], info["size"], info["local_rank"], info["local_size"]) == (3, 8, 1, 4)
    assert info["launcher"] == "hydra"
    for key in ("hostname", "pid", "python", "threads", "cuda", "packages", "env", "mpiexec"):
        assert key in info, key
    assert info["threads"]["OMP_NUM_THREADS"] == "2"
    assert info["env"]["PMI_RANK"] == "3" and info["env"]["HPC_GRAPH_X"] == "1"
    assert "GITHUB_TOKEN" not in info["env"] and "MY_API_KEY" not in info["env"]
    assert "HOME" not in info["env"]


def test_env_module_does_not_import_mpi():
    code = ("import sys; import hpc_graph.comm.env as e; e.detect_rank_size(); e.describe_environment(); "
            "import hpc_graph.comm; print('mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
