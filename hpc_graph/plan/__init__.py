"""Planning: what a job will cost before it runs.

* :mod:`hpc_graph.plan.profile`: a short profile of this machine and launch (alpha-beta fits of the
  collective operations, GEMM / SpMM rates).
* :mod:`hpc_graph.engines.apt.dry_run`: the ``apt`` engine's dry run (sample once, count every strategy's
  bytes, rows and edges) and cost model (predicted epoch time and memory per strategy).
"""
