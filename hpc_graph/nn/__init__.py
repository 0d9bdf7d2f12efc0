"""hpc_graph.nn"""
