"""hpc_graph.engines"""
