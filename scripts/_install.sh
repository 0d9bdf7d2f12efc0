# shellcheck shell=bash
# Sourced by quickstart.sh and test.sh: installs hpc_graph and its dependencies.
# Usage: install_hpc_graph EXTRAS   (e.g. "mpich" or "dev")
install_hpc_graph() {
  # A CPU build of torch first: a bare `pip install torch` pulls a multi-GB CUDA wheel.
  if ! python3 -c "import torch" 2>/dev/null; then
    python3 -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || python3 -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
  python3 -m pip install -q -e ".[$1]"
  # An editable install leaves the project's modules uncompiled. Where PYTHONDONTWRITEBYTECODE is set (many
  # container images set it), every process would then compile every project module it imports, about 0.5 s
  # of CPU per process: the test suite starts hundreds of them (ranks, commands). Compiled once here instead.
  python3 -m compileall -q -j 0 hpc_graph data_io numba_kernels examples benchmarks tests >/dev/null
}

# Open MPI and PT-Scotch's ParMETIS API, for `hpc-graph partition --distributed --method metis` and its
# tests (docs/partitioning.md). Installed with apt-get when missing and this is a root shell on
# Debian/Ubuntu (as in CI); elsewhere a note says what to install. Nothing else needs them.
install_parmetis_api() {
  if command -v mpiexec.openmpi >/dev/null 2>&1 && ls /usr/lib/*/scotch-int64/libptscotchparmetisv3*.so* >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends openmpi-bin libscotchparmetis-dev libptscotch-dev >/dev/null
  else
    echo "note: install openmpi-bin libscotchparmetis-dev libptscotch-dev (Debian/Ubuntu) for the" \
         "distributed partitioner's tests (tests/mpi/test_dist_partition.py)" >&2
  fi
}
