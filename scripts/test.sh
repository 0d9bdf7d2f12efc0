#!/usr/bin/env bash
# Install hpc_graph with its test dependencies and run the whole test suite.
# Used verbatim by .ci/run. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
# A CPU build of torch first: a bare `pip install torch` would pull a multi-GB CUDA wheel.
if ! python3 -c "import torch" 2>/dev/null; then
  python3 -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
    || python3 -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
python3 -m pip install -q -e '.[dev]'
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python3 -m pytest -q tests "$@"
