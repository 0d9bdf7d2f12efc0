"""hpc_graph.train"""
