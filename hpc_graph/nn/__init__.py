"""hpc_graph.nn: layers and models. A layer asks its ``GraphContext`` to aggregate; it never knows the engine.

``GCNConv``, ``SAGEConv``, ``GATConv``, ``DistBatchNorm`` and ``build_model`` (``GNN``).
"""
from hpc_graph.nn.dist_batch_norm import DistBatchNorm
from hpc_graph.nn.gat_conv import GATConv
from hpc_graph.nn.gcn_conv import GCNConv
from hpc_graph.nn.models import GNN, MODELS, build_model
from hpc_graph.nn.sage_conv import SAGEConv

__all__ = ["GCNConv", "SAGEConv", "GATConv", "DistBatchNorm", "GNN", "MODELS", "build_model"]
