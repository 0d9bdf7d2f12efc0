"""hpc_graph.nn: layers and models. A layer asks its ``GraphContext`` to aggregate; it never knows the engine.

Layers: ``GCNConv``, ``SAGEConv``, ``GATConv``, ``RGCNConv``, ``DistBatchNorm``. Models: ``GNN`` (GCN / SAGE /
GAT stacks), ``GCNII``, ``JKNet``, ``APPNP``, ``SGC``, ``DAGNN``, ``MLPNet``, ``RGCN``, ``RevGCN``, ``RevGAT``, and
the graph transformers ``GT`` and ``Graphormer``; ``build_model`` builds any of them by name. For layers and models
of one's own: ``dropout`` (the mask keyed on the rows' dataset ids, so every engine and rank count drops what one
process drops), ``ModelSpec`` / ``register_model`` (a model by name, for configs and ``hpc-graph plan``), ``optim``
(the optimisers and schedules the trainer uses: ``optim.Adam``, ``optim.SGD``, ...).
"""
from hpc_graph.nn import optim
from hpc_graph.nn._dropout import dropout
from hpc_graph.nn.appnp import APPNP
from hpc_graph.nn.dagnn import DAGNN
from hpc_graph.nn.dist_batch_norm import DistBatchNorm
from hpc_graph.nn.gat_conv import GATConv
from hpc_graph.nn.gcn2 import GCNII
from hpc_graph.nn.gcn_conv import GCNConv
from hpc_graph.nn.graphormer import Graphormer
from hpc_graph.nn.gt import GT
from hpc_graph.nn.jknet import JKNet
from hpc_graph.nn.mlp import MLPNet
from hpc_graph.nn.models import GNN, MODELS, ModelSpec, build_model, message_passing_layers, register_model
from hpc_graph.nn.revgnn import RevGAT, RevGCN
from hpc_graph.nn.rgcn import RGCN, RGCNConv
from hpc_graph.nn.sage_conv import SAGEConv
from hpc_graph.nn.sgc import SGC

__all__ = ["GCNConv", "SAGEConv", "GATConv", "RGCNConv", "DistBatchNorm", "GNN", "GCNII", "JKNet", "APPNP", "SGC",
           "DAGNN", "MLPNet", "RGCN", "RevGCN", "RevGAT", "GT", "Graphormer", "MODELS", "ModelSpec", "build_model",
           "dropout", "message_passing_layers", "optim", "register_model"]
