"""A real DGL graph through a dataset file and back (run where dgl is installed, e.g. the peers' environment:
``.venv-dgl/bin/python tests/data_io/dgl_round_trip.py``; CI has no dgl and runs tests/data_io/test_convert_dgl.py,
which checks the same conversions against DGL's graph interface)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import dgl
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data_io.converters.dgl import from_dgl, to_dgl  # noqa: E402
from data_io.dataset import open_dataset, write_dataset  # noqa: E402


def main() -> None:
    rng = np.random.default_rng(0)
    n, e = 50, 300
    g = dgl.graph((torch.from_numpy(rng.integers(0, n, e)), torch.from_numpy(rng.integers(0, n, e))), num_nodes=n)
    g.ndata["feat"] = torch.randn(n, 4)
    g.ndata["label"] = torch.randint(0, 3, (n,))
    for m in ("train_mask", "val_mask", "test_mask"):
        g.ndata[m] = torch.rand(n) < 0.4
    g.edata["weight"] = torch.rand(e)
    g.edata["etype"] = torch.randint(0, 4, (e,))
    with tempfile.TemporaryDirectory() as tmp:
        write_dataset(Path(tmp) / "g.h5", from_dgl(g, name="dgl"))
        with open_dataset(Path(tmp) / "g.h5") as ds:
            back = to_dgl(ds.load())
    u, v = g.edges(order="eid")
    order = np.lexsort((u.numpy(), v.numpy()))  # the file groups the edges by destination, stably
    u2, v2 = back.edges(order="eid")
    assert np.array_equal(u.numpy()[order], u2.numpy()) and np.array_equal(v.numpy()[order], v2.numpy())
    for k in ("weight", "etype"):
        assert np.array_equal(g.edata[k].numpy()[order], back.edata[k].numpy()), k
    for k in g.ndata:
        assert np.array_equal(g.ndata[k].numpy(), back.ndata[k].numpy()), k
    hetero = dgl.heterograph({("a", "r", "b"): (torch.tensor([0]), torch.tensor([0]))})
    try:
        from_dgl(hetero)
    except ValueError as exc:
        assert "dgl.to_homogeneous" in str(exc)
    else:
        raise AssertionError("a heterograph was accepted")
    print(f"dgl {dgl.__version__}: round trip OK")


if __name__ == "__main__":
    main()
