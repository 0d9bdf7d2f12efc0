#!/usr/bin/env bash
# hpc_graph on one machine: N MPI ranks with mpiexec (MPICH from `pip install hpc_graph[mpich]` works).
#
# Usage:    jobscripts/local.sh NRANKS CONFIG.yaml [RUN_DIR] [extra hpc-graph train arguments...]
# Threads per rank: each rank takes its share of the cores (cores / NRANKS, at least 1) by itself;
# override with OMP_NUM_THREADS / NUMBA_NUM_THREADS or --threads N among the extra arguments.
# Ctrl-C (SIGINT) or SIGTERM is forwarded to the ranks: they checkpoint and exit with status 75.
set -euo pipefail

NRANKS=${1:?usage: local.sh NRANKS CONFIG.yaml [RUN_DIR] [args...]}
CONFIG=${2:?usage: local.sh NRANKS CONFIG.yaml [RUN_DIR] [args...]}
RUN_DIR=${3:-runs/local}
shift $(($# < 3 ? $# : 3))

RESUME=(--resume-if-possible)  # continue from RUN_DIR's newest checkpoint, or start afresh when it has none

hpc-graph warmup >&2  # numba's CPU kernels compiled once, in parallel, before the ranks start (seconds when cached)
exec mpiexec -n "$NRANKS" hpc-graph train --config "$CONFIG" --run-dir "$RUN_DIR" "${RESUME[@]}" "$@"
