"""Converters from other graph formats to the hpc_graph dataset file (format v1).

* :func:`convert_npz` -- NumPy ``.npz`` archives (the schema of ``cora.npz``).
* :func:`convert_edgelist` -- SNAP-style edge-list text, streamed in blocks.
* :func:`convert_ogb` -- OGB node-property dataset folders, without the ``ogb`` package.
* :func:`convert_ogb_mag` -- OGB-MAG-style heterogeneous folders, to a graph with typed edges.
* :func:`from_pyg` / :func:`to_pyg` -- a PyTorch Geometric ``Data`` object to :class:`~data_io.dataset.GraphData`
  and back.
* :func:`from_dgl` / :func:`to_dgl` -- the same for a homogeneous DGL graph (``dgl.DGLGraph``).

Every converter writes through :class:`~data_io.dataset.DatasetWriter` (atomic:
nothing is left at the output path on an error) and reports bad input as
:class:`~data_io.errors.DataError`/:class:`~data_io.errors.FormatError` naming
the file and the field or line.
"""
from data_io.converters.dgl import from_dgl, to_dgl
from data_io.converters.edgelist import convert_edgelist, read_edgelist
from data_io.converters.npz import convert_npz, read_npz
from data_io.converters.ogb import convert_ogb
from data_io.converters.ogb_mag import convert_ogb_mag
from data_io.converters.pyg import from_pyg, to_pyg

__all__ = ["convert_npz", "read_npz", "convert_edgelist", "read_edgelist", "convert_ogb", "convert_ogb_mag", "from_pyg",
           "to_pyg", "from_dgl", "to_dgl"]
