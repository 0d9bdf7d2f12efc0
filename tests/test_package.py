"""Importing ``hpc_graph`` changes nothing in the process; ``hpc_graph.init()`` makes the process-wide settings
before any tensor exists."""
import os
import subprocess
import sys
import time

import pytest

_PROBE = ("import os, sys, hpc_graph\n"
          "before = dict(os.environ)\n"
          "import hpc_graph.nn, hpc_graph.engines\n"
          "assert dict(os.environ) == before and 'mpi4py' not in sys.modules\n"
          "comm = hpc_graph.init()\n"
          "import torch\n"
          "from hpc_graph.ops._kernel_args import torch_huge_pages\n"
          "print(before.get('THP_MEM_ALLOC_ENABLE'), os.environ.get('THP_MEM_ALLOC_ENABLE'), torch_huge_pages(), "
          "comm.rank, comm.size)\n")
_CASES = [(None, "None 1 True 0 1"), ("0", "0 0 False 0 1"), ("1", "1 1 True 0 1")]
# a whole CLI run (generate, train with Adam and a schedule, evaluate, checkpoint), then the LM's AdamW: nothing
# imports torch._dynamo (torch.optim would, ~2 s on every rank: hpc_graph.nn.optim)
_TRAIN_PROBE = ("import sys, torch\n"
                "from hpc_graph.cli import main\n"
                "main(['generate', 'csbm', '-o', 'g.h5', '--num-nodes', '300'])\n"
                "open('c.yaml', 'w').write('data: {path: g.h5}\\nmodel: {name: sage, hidden: 8}\\n'\n"
                "    'train: {epochs: 2, progress: false, run_dir: run}\\noptim: {schedule: cosine}\\n')\n"
                "try:\n"
                "    main(['train', '--config', 'c.yaml'])\n"
                "except SystemExit as exc:\n"
                "    assert not exc.code, exc.code\n"
                "from hpc_graph.nn.optim import AdamW\n"
                "p = torch.zeros(3, requires_grad=True); p.grad = torch.ones(3); AdamW([p]).step()\n"
                "print('dynamo', 'torch._dynamo' in sys.modules)\n")


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """``{preset: CompletedProcess}``: :data:`_PROBE` in a fresh interpreter per preset, and ``"train"``:
    :data:`_TRAIN_PROBE` in a fresh interpreter (in a temporary directory), all started at once (independent
    processes that spend their time importing torch: they overlap on the test box's cores)."""
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = {}
    try:
        for preset, _ in _CASES:
            env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
            if preset is not None:
                env["THP_MEM_ALLOC_ENABLE"] = preset
            procs[preset] = subprocess.Popen([sys.executable, "-c", _PROBE], env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True, cwd=cwd)
        procs["train"] = subprocess.Popen([sys.executable, "-c", _TRAIN_PROBE], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=tmp_path_factory.mktemp("train"))
        done, deadline = {}, time.monotonic() + 120
        for preset, proc in procs.items():
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done[preset] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.mark.parametrize("preset, expected", _CASES)
def test_import_changes_nothing_and_init_turns_on_huge_pages_unless_user_chose(probes, preset, expected):
    out = probes[preset]
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected


def test_training_never_imports_dynamo(probes):
    out = probes["train"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "dynamo False", out.stdout[-2000:]


def test_public_names_exist_and_nothing_else_shows():
    import hpc_graph as hg

    assert set(dir(hg)) == set(hg.__all__)
    for name in hg.__all__:
        assert getattr(hg, name) is not None, name
    assert hg.nn.GCNConv and callable(hg.init) and callable(hg.create_engine)
    with pytest.raises(AttributeError, match="no attribute 'os'"):
        hg.os  # noqa: B018


def test_pyg_data_round_trip(tmp_path):
    """A PyG ``Data`` into a dataset file and back: the same edge multiset, features, labels, masks and weights."""
    import numpy as np
    import torch
    from torch_geometric.data import Data

    import hpc_graph as hg

    rng = np.random.default_rng(4)
    n, e = 57, 300
    ei = torch.from_numpy(rng.integers(0, n, (2, e)))
    data = Data(edge_index=ei, x=torch.from_numpy(rng.standard_normal((n, 5)).astype(np.float32)),
                y=torch.from_numpy(rng.integers(0, 4, n)), edge_weight=torch.rand(e),
                train_mask=torch.from_numpy(rng.random(n) < 0.5), val_mask=torch.from_numpy(rng.random(n) < 0.2),
                test_mask=torch.from_numpy(rng.random(n) < 0.3), num_nodes=n)
    hg.write_dataset(tmp_path / "g.h5", hg.from_pyg(data, name="g"))
    with hg.open_dataset(tmp_path / "g.h5") as ds:
        back = hg.to_pyg(ds.load())
    assert back.num_nodes == n
    for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(back[key], data[key]), key

    def edges(d):
        rows = np.concatenate([d.edge_index.numpy().T, d.edge_weight.numpy()[:, None].view(np.int32)], 1)
        return sorted(map(tuple, rows.tolist()))

    assert edges(back) == edges(data)
