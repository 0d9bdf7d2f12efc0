#!/usr/bin/env bash
# Install hpc_graph with its test dependencies and run the whole test suite.
# This is the README's test command; .ci/run calls it verbatim. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
install_hpc_graph dev
# one thread per process: MPI tests oversubscribe the cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python3 -m pytest -q tests "$@"
