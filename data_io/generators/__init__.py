"""Synthetic graph generators: Graph500 Kronecker (R-MAT), contextual SBM, text-attributed graphs
(:mod:`data_io.generators.tag`), and the graph-level benchmarks REG3-CC and PATH-SPD (many small graphs,
:mod:`data_io.generators.graph_tasks`).

``generate_*`` return a :class:`data_io.dataset.GraphData` in memory;
``write_*`` write a dataset file atomically with features in row blocks.
Equal seeds give identical graphs. Bad arguments raise
:class:`GeneratorParamError` (a :class:`data_io.errors.DataError`) naming the parameter.
"""
from data_io.generators._common import GeneratorParamError
from data_io.generators.csbm import generate_csbm, write_csbm
from data_io.generators.graph_tasks import generate_pathspd, generate_reg3cc, write_graph_task
from data_io.generators.rmat import generate_rmat, write_rmat
from data_io.generators.tag import generate_tag, write_tag

__all__ = ["GeneratorParamError", "generate_rmat", "write_rmat", "generate_csbm", "write_csbm", "generate_tag",
           "write_tag", "generate_reg3cc", "generate_pathspd", "write_graph_task"]
