#!/usr/bin/env bash
# Install hpc_graph with its test dependencies, check the code with ruff and run the whole test suite.
# This is the README's test command; .ci/run calls it verbatim. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_install.sh
install_hpc_graph dev
# numba compiles every kernel specialisation the suite uses into its on-disk cache, in parallel, before the tests
# (on a fresh clone a third of the suite's time otherwise; a few seconds when the cache is warm); it runs while
# the system packages install and ruff checks the code, and the tests start once it is done (its failure fails)
python3 -m hpc_graph.cli warmup &
warmup=$!
install_parmetis_api
python3 -m ruff check .  # pyflakes and pycodestyle (pyproject.toml [tool.ruff]): a finding fails the command
wait "$warmup"
# no thread variables: every process decides its threads as a user's would (hpc_graph.comm.threads)
python3 -m pytest -q --durations=30 tests "$@"  # the 30 slowest, to keep the suite well inside its budget
