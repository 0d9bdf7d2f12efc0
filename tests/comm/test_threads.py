"""Threads per rank (hpc_graph.comm.threads): precedence, fair share of CPUs, bad values, applying."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpc_graph.comm.threads import (EXPORT_MARKER, ThreadSettingError, decide_threads, parse_threads)

REPO = Path(__file__).resolve().parents[2]
FOUR = frozenset(range(4))


def _node(*masks, requested=None):
    requested = requested or [None] * len(masks)
    return [(frozenset(m), r) for m, r in zip(masks, requested)]


def _naive_share(masks, index):
    """Reference: each CPU of rank ``index`` is split evenly among the ranks whose mask holds it."""
    total = 0.0
    for cpu in masks[index]:
        total += 1.0 / sum(1 for m in masks if cpu in m)
    return max(1, int(total + 1e-9))


@pytest.fixture(autouse=True)
def _no_cgroup_quota(monkeypatch):
    monkeypatch.setattr("hpc_graph.comm.threads._cgroup_cpu_limit", lambda: None)


# -- precedence ---------------------------------------------------------------------------------
def test_explicit_beats_environment():
    env = {"NUMBA_NUM_THREADS": "3", "OMP_NUM_THREADS": "2"}
    plan = decide_threads(5, env=env, node=_node(FOUR))
    assert (plan.threads, plan.source) == (5, "train.threads")
    plan = decide_threads("6", explicit_name="--threads", env=env, node=_node(FOUR))
    assert (plan.threads, plan.source) == (6, "--threads")


def test_numba_variable_beats_omp_variable():
    plan = decide_threads(None, env={"NUMBA_NUM_THREADS": "3", "OMP_NUM_THREADS": "2"}, node=_node(FOUR))
    assert (plan.threads, plan.source) == (3, "NUMBA_NUM_THREADS")
    plan = decide_threads(None, env={"OMP_NUM_THREADS": "2,1"}, node=_node(FOUR))  # OpenMP list: first level
    assert (plan.threads, plan.source) == (2, "OMP_NUM_THREADS")


def test_without_settings_the_affinity_mask_decides():
    plan = decide_threads(None, env={}, node=_node(FOUR))
    assert (plan.threads, plan.source, plan.cpus) == (4, "affinity", 4)
    assert not plan.oversubscribed


def test_variables_exported_by_a_parent_process_are_not_a_user_setting():
    env = {"NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "1", EXPORT_MARKER: "NUMBA_NUM_THREADS=2,OMP_NUM_THREADS=1"}
    plan = decide_threads(None, env=env, node=_node(FOUR, FOUR))
    assert (plan.threads, plan.source) == (2, "affinity")
    env["NUMBA_NUM_THREADS"] = "3"  # changed since: the user's
    assert decide_threads(None, env=env, node=_node(FOUR, FOUR)).source == "NUMBA_NUM_THREADS"
    env[EXPORT_MARKER] = "NUMBA_NUM_THREADS=3"  # only NUMBA recorded: OMP_NUM_THREADS=1 is the user's
    plan = decide_threads(None, env=env, node=_node(FOUR, FOUR))
    assert (plan.threads, plan.source) == (1, "OMP_NUM_THREADS")


# -- fair share -----------------------------------------------------------------------------------
def test_unbound_ranks_split_the_cpus():
    node = _node(FOUR, FOUR, FOUR, FOUR)
    plans = [decide_threads(None, env={}, node=node, index=i) for i in range(4)]
    assert [p.threads for p in plans] == [1, 1, 1, 1]
    assert plans[0].node_threads == 4 and not plans[0].oversubscribed


def test_ranks_bound_to_disjoint_cpus_keep_them():
    node = _node({0, 1}, {2, 3})
    assert [decide_threads(None, env={}, node=node, index=i).threads for i in range(2)] == [2, 2]


def test_more_ranks_than_cpus_is_oversubscribed_with_one_thread_each():
    node = _node({0, 1}, {0, 1}, {0, 1})
    plan = decide_threads(None, env={}, node=node, index=1)
    assert plan.threads == 1 and plan.node_threads == 3 and plan.node_cpus == 2 and plan.oversubscribed


def test_explicit_threads_of_other_ranks_count_towards_oversubscription():
    node = _node({0, 1}, {0, 1}, requested=[2, 2])
    plan = decide_threads(2, env={}, node=node)
    assert plan.oversubscribed and plan.node_threads == 4


@pytest.mark.parametrize("seed", range(20))
def test_fair_share_matches_a_naive_reference_on_random_masks(seed):
    rng = np.random.default_rng(seed)
    ncpu, nranks = int(rng.integers(1, 17)), int(rng.integers(1, 9))
    masks = [frozenset(np.flatnonzero(rng.random(ncpu) < 0.6).tolist() or [int(rng.integers(ncpu))])
             for _ in range(nranks)]
    for i in range(nranks):
        plan = decide_threads(None, env={}, node=_node(*masks), index=i)
        assert plan.threads == _naive_share(masks, i)
    # never more threads than CPUs unless there are more ranks than CPUs
    union = len(frozenset().union(*masks))
    assert plan.node_threads <= max(union, nranks)


def test_cgroup_quota_caps_the_cpus(monkeypatch):
    monkeypatch.setattr("hpc_graph.comm.threads._cgroup_cpu_limit", lambda: 2.5)
    plan = decide_threads(None, env={}, node=_node(range(8)))
    assert plan.threads == 3 and plan.cpus == 3


# -- bad values -----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -2, 1.5, True, "abc", "0", "-1", "2.5"])
def test_bad_explicit_value_is_rejected_naming_the_setting(value):
    with pytest.raises(ThreadSettingError, match=r"^train\.threads: must be a positive integer"):
        decide_threads(value, env={}, node=_node(FOUR))


@pytest.mark.parametrize("var", ["NUMBA_NUM_THREADS", "OMP_NUM_THREADS"])
@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5"])
def test_bad_environment_value_is_rejected_naming_the_variable(var, value):
    with pytest.raises(ThreadSettingError, match=rf"^{var}: must be a positive integer"):
        decide_threads(None, env={var: value}, node=_node(FOUR))


def test_empty_values_count_as_unset():
    assert parse_threads("", "OMP_NUM_THREADS") is None and parse_threads(None, "x") is None
    assert decide_threads(None, env={"NUMBA_NUM_THREADS": " ", "OMP_NUM_THREADS": ""},
                          node=_node(FOUR)).source == "affinity"


class _FakeComm:
    """Two ranks on one host; allgather_object answers with the other rank's entry too."""

    def __init__(self, rank, other):
        self.rank, self.size, self.other = rank, 2, other

    def allgather_object(self, obj):
        return [obj, self.other] if self.rank == 0 else [self.other, obj]


def test_a_bad_value_on_another_rank_fails_every_rank():
    import socket

    other = (socket.gethostname(), [0, 1], None, "NUMBA_NUM_THREADS: must be a positive integer, got 'x'")
    with pytest.raises(ThreadSettingError, match="node-local rank 1: NUMBA_NUM_THREADS"):
        decide_threads(None, env={}, comm=_FakeComm(0, other))


def test_gather_over_a_communicator_counts_the_ranks_on_this_host():
    import socket

    mask = sorted(os.sched_getaffinity(0))
    same = (socket.gethostname(), mask, None, None)
    elsewhere = ("another-host", mask, None, None)
    assert decide_threads(None, env={}, comm=_FakeComm(1, same)).node_ranks == 2
    assert decide_threads(None, env={}, comm=_FakeComm(1, elsewhere)).node_ranks == 1


# -- applying, in a fresh interpreter ---------------------------------------------------------------
# Each check needs its own interpreter (numba's pool is sized once per process). The interpreters are
# independent and spend their time importing numba and torch on one core each, so the module starts all
# of them at once (they overlap on the test box's cores) and every test reads its own result.
_APPLY = """
import json, os, sys
import numba, torch                     # both imported before the decision, numba's pool not started
from hpc_graph.comm.threads import configure_threads
plan = configure_threads(None if len(sys.argv) < 2 else sys.argv[1])
import numpy as np
from numba_kernels.cpu import spmm
indptr = np.arange(0, 2001, 2, dtype=np.int64); indices = np.arange(2000, dtype=np.int64) % 1000
x = np.ones((1000, 1, 64), np.float32); out = np.zeros_like(x)
spmm.spmm_sum(indptr, indices, np.empty(0, np.int64), np.empty((0, 1), np.float32),
              np.empty(0, np.float32), x, out, False)
from numba.np.ufunc import parallel
print(json.dumps({"plan": plan.threads, "source": plan.source, "numba": numba.get_num_threads(),
                  "pool": parallel.NUM_THREADS, "torch": torch.get_num_threads(),
                  "cpus": len(os.sched_getaffinity(0))}))
"""

# numba re-reads NUMBA_NUM_THREADS at every compilation; configure must not change it under it
_RECOMPILE = """
import os, numba
from numba import njit, prange
@njit(parallel=True)
def f(x):
    s = 0.0
    for i in prange(x.shape[0]):
        s += x[i]
    return s
import numpy as np
f(np.ones(10))                      # the pool starts with the environment's count
from hpc_graph.comm.threads import configure_threads
configure_threads(1)
@njit
def g(x):
    return x + 1
print(g(1), numba.get_num_threads())  # a new compilation after the change
"""

_THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", EXPORT_MARKER)

# name -> (script, arguments, variables removed from this environment, variables set)
_FRESH = {
    "affinity": (_APPLY, (), _THREAD_VARS, {}),
    "explicit": (_APPLY, ("1",), _THREAD_VARS, {"OMP_NUM_THREADS": "2"}),
    "recompile": (_RECOMPILE, (), ("NUMBA_NUM_THREADS", EXPORT_MARKER), {"NUMBA_NUM_THREADS": "2"}),
}


@pytest.fixture(scope="module")
def fresh():
    """``{name: CompletedProcess}`` of every :data:`_FRESH` script, run at the same time in fresh interpreters."""
    procs = {}
    try:
        for name, (script, args, removed, added) in _FRESH.items():
            env = {k: v for k, v in os.environ.items() if k not in removed}
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
            env.update(added)
            procs[name] = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, env=env)
        done, deadline = {}, time.monotonic() + 180
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _applied(fresh, name):
    proc = fresh[name]
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_configure_applies_the_decision_to_numba_torch_and_the_pool(fresh):
    got = _applied(fresh, "affinity")
    assert got["source"] == "affinity" and got["plan"] == got["cpus"]
    assert got["numba"] == got["torch"] == got["pool"] == got["plan"]


def test_configure_with_an_explicit_count_sizes_the_pool_to_it(fresh):
    got = _applied(fresh, "explicit")
    assert got["source"] == "train.threads"
    assert got["numba"] == got["torch"] == got["pool"] == 1


def test_numba_keeps_compiling_after_the_threads_change_in_a_process_that_started_its_pool(fresh):
    """numba re-reads NUMBA_NUM_THREADS at every compilation; configure must not change it under it."""
    proc = fresh["recompile"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "1"]
