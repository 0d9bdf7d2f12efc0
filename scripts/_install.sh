# Sourced by quickstart.sh and test.sh: installs hpc_graph and its dependencies.
# Usage: install_hpc_graph EXTRAS   (e.g. "mpich" or "dev")
install_hpc_graph() {
  # A CPU build of torch first: a bare `pip install torch` pulls a multi-GB CUDA wheel.
  if ! python3 -c "import torch" 2>/dev/null; then
    python3 -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || python3 -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
  python3 -m pip install -q -e ".[$1]"
}
