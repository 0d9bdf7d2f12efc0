"""hpc_graph.ops"""
