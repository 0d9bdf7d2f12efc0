"""hpc_graph.nn: layers and models. A layer asks its ``GraphContext`` to aggregate; it never knows the engine.

Layers ``GCNConv``, ``SAGEConv``, ``GATConv``, ``DistBatchNorm``; models ``GNN`` (GCN/SAGE/GAT stacks),
``GCNII``, ``JKNet``, ``APPNP``, ``SGC``, ``DAGNN``; ``build_model`` builds any of them by name.
"""
from hpc_graph.nn.appnp import APPNP
from hpc_graph.nn.dagnn import DAGNN
from hpc_graph.nn.dist_batch_norm import DistBatchNorm
from hpc_graph.nn.gat_conv import GATConv
from hpc_graph.nn.gcn2 import GCNII
from hpc_graph.nn.gcn_conv import GCNConv
from hpc_graph.nn.jknet import JKNet
from hpc_graph.nn.models import GNN, MODELS, build_model, message_passing_layers
from hpc_graph.nn.sage_conv import SAGEConv
from hpc_graph.nn.sgc import SGC

__all__ = ["GCNConv", "SAGEConv", "GATConv", "DistBatchNorm", "GNN", "GCNII", "JKNet", "APPNP", "SGC", "DAGNN",
           "MODELS", "build_model", "message_passing_layers"]
