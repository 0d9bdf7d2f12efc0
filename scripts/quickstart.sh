#!/usr/bin/env bash
# Install hpc_graph and run the main job on an embedded default: generate a
# graph, partition it into 2, check it, train on 2 MPI ranks with the `sar`
# engine and print the test accuracy. Safe to re-run (outputs in runs/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
install_hpc_graph mpich
hpc-graph demo --workdir runs/demo --force "$@"
