"""hpc_graph.graph: DistGraph, partition book and the GraphContext interface layers use."""
