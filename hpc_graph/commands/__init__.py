"""Sub-commands of the ``hpc-graph`` CLI: one module each, ``add_parser`` + ``run``."""
