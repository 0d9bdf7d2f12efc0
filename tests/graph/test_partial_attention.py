"""Graph-transformer attention on the partitioned engines (one rank here; the multi-rank equivalence with
``single`` is tests/mpi/test_engines.py): what they refuse, with a message saying what to change."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data_io.dataset import GraphData, write_dataset
from data_io.partitioner import partition_dataset
from hpc_graph.comm import get_communicator
from hpc_graph.engines import create_engine


def _data(tmp_path, self_loop: bool):
    src = np.array([1, 2, 0, 2, 0, 1] + ([3] if self_loop else []))
    dst = np.array([0, 0, 1, 1, 2, 2] + ([3] if self_loop else []))
    o = np.lexsort((src, dst))
    indptr = np.zeros(5, np.int64)
    np.cumsum(np.bincount(dst, minlength=4), out=indptr[1:])
    path = tmp_path / f"g{int(self_loop)}.h5"
    write_dataset(path, GraphData(indptr=indptr, indices=src[o], feat=np.ones((4, 3), np.float32),
                                  label=np.array([0, 1, 0, 1]), train_mask=np.ones(4, bool), num_classes=2))
    partition_dataset(path, tmp_path / f"p{int(self_loop)}", 1, "random", 0)
    return tmp_path / f"p{int(self_loop)}"


@pytest.mark.parametrize("engine", ["dp", "sar"])
def test_partitioned_engines_refuse_what_needs_the_whole_sequence(tmp_path, engine):
    eng = create_engine(engine, str(_data(tmp_path, False)), get_communicator("local"), "cpu", torch.float64)
    q = torch.randn(4, 2, 3, dtype=torch.float64)
    out = eng.graph.attention(q, q, q, mode="sparse")
    assert out.shape == (4, 2, 3)
    with pytest.raises(ValueError, match="engine.name: single or seqpar"):
        eng.graph.attention(q, q, q, mode="dense")
    with pytest.raises(ValueError, match="global_token: false"):
        eng.graph.attention(q, q, q, global_token=True)
    with pytest.raises(ValueError, match="owns 4 nodes"):
        eng.graph.attention(q[:3], q[:3], q[:3])


@pytest.mark.parametrize("engine", ["dp", "sar"])
def test_self_loop_edges_are_refused(tmp_path, engine):
    eng = create_engine(engine, str(_data(tmp_path, True)), get_communicator("local"), "cpu", torch.float64)
    q = torch.randn(4, 2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="--remove-self-loops"):
        eng.graph.attention(q, q, q)
