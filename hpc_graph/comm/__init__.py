"""hpc_graph.comm"""
