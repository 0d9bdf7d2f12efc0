#!/usr/bin/env bash
# Creates the virtual environments of the mini-batch peer baselines in the
# repository root (never dependencies of hpc_graph; see benchmarks/README_baselines.md):
#
#   .venv-pyg  torch 2.13.0 (CPU build where the index has one), torch_geometric 2.8.1,
#              torch-scatter 2.1.2 + torch-sparse 0.6.18 built from source (NeighborLoader), h5py
#   .venv-dgl  torch 2.2.1 (PyPI's CUDA build, runs on CPU), dgl 2.1.0, torchdata 0.7.1, h5py
#
#   bash benchmarks/setup_baselines.sh            # both
#   bash benchmarks/setup_baselines.sh --pyg      # only .venv-pyg
#   bash benchmarks/setup_baselines.sh --dgl      # only .venv-dgl
#
# Idempotent: every step first checks whether what it installs is already there
# and working, and skips itself if so. PYTHON=... picks the interpreter that creates
# the environments (default python3); MAX_JOBS (default 2) bounds the compile jobs
# of the torch-scatter/torch-sparse builds (~15 min together on 2 cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
export MAX_JOBS="${MAX_JOBS:-2}"

DO_PYG=0
DO_DGL=0
for arg in "$@"; do
    case "$arg" in
        --pyg) DO_PYG=1 ;;
        --dgl) DO_DGL=1 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (expected --pyg and/or --dgl)" >&2; exit 2 ;;
    esac
done
if [[ $DO_PYG -eq 0 && $DO_DGL -eq 0 ]]; then DO_PYG=1; DO_DGL=1; fi

say() { echo "[setup_baselines] $*"; }

# make_venv DIR: creates DIR with $PYTHON unless it already holds a working interpreter
make_venv() {
    local venv="$1"
    if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import sys' 2>/dev/null; then
        say "$venv exists ($("$venv/bin/python" --version 2>&1))"
    else
        say "creating $venv with $PYTHON ($("$PYTHON" --version 2>&1))"
        "$PYTHON" -m venv "$venv"
    fi
}

# check VENV CODE: runs CODE with the venv's python, quietly; true if it exits 0
check() { "$1/bin/python" -c "$2" >/dev/null 2>&1; }

# ---------------------------------------------------------------- PyG
setup_pyg() {
    local venv="$ROOT/.venv-pyg"
    local pip=("$venv/bin/python" -m pip install)
    make_venv "$venv"

    if check "$venv" "
import torch, torch_geometric, h5py, scipy, ninja, wheel, setuptools
assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__
assert torch_geometric.__version__ == '2.8.1', torch_geometric.__version__"; then
        say "pyg: torch 2.13.0 + torch_geometric 2.8.1 + build tools already installed"
    else
        say "pyg: pip install torch==2.13.0 torch_geometric==2.8.1 scipy ninja wheel setuptools h5py"
        "${pip[@]}" torch==2.13.0 torch_geometric==2.8.1 scipy ninja wheel setuptools h5py
    fi

    if check "$venv" "import torch, torch_scatter; torch.ops.torch_scatter.scatter_max"; then
        say "pyg: torch-scatter already installed and loading"
    else
        say "pyg: MAX_JOBS=$MAX_JOBS pip install --no-build-isolation torch-scatter==2.1.2 (builds from source, ~5 min)"
        "${pip[@]}" --no-build-isolation torch-scatter==2.1.2
    fi

    if check "$venv" "import torch, torch_sparse; torch.ops.torch_sparse.neighbor_sample"; then
        say "pyg: torch-sparse already installed and loading"
    else
        say "pyg: MAX_JOBS=$MAX_JOBS pip install --no-build-isolation torch-sparse==0.6.18 (builds from source, ~10 min)"
        "${pip[@]}" --no-build-isolation torch-sparse==0.6.18
    fi

    say "pyg: verifying NeighborLoader"
    "$venv/bin/python" - <<'EOF'
import torch, torch_geometric, torch_scatter, torch_sparse
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
assert WITH_TORCH_SPARSE, "torch_geometric does not see torch_sparse"
data = Data(x=torch.randn(6, 3), edge_index=torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]))
batch = next(iter(NeighborLoader(data, num_neighbors=[2, 2], batch_size=2)))
assert batch.x.shape[0] >= 2
print(f"[setup_baselines] pyg OK: torch {torch.__version__}, torch_geometric {torch_geometric.__version__}, "
      f"torch_scatter {torch_scatter.__version__}, torch_sparse {torch_sparse.__version__}, pyg_lib {WITH_PYG_LIB}")
EOF
}

# ---------------------------------------------------------------- DGL
setup_dgl() {
    local venv="$ROOT/.venv-dgl"
    make_venv "$venv"
    if check "$venv" "
import torch, dgl, torchdata, numpy, h5py, pandas, yaml, pydantic
assert torch.__version__.split('+')[0] == '2.2.1', torch.__version__
assert dgl.__version__ == '2.1.0', dgl.__version__
assert torchdata.__version__.startswith('0.7.1'), torchdata.__version__
dgl.dataloading.NeighborSampler"; then
        say "dgl: torch 2.2.1 + dgl 2.1.0 already installed and loading"
    else
        say "dgl: pip install torch==2.2.1 dgl==2.1.0 torchdata==0.7.1 'numpy<2' 'setuptools<70' pandas pyyaml pydantic h5py (torch 2.2.1 is a CUDA build, several GB)"
        "$venv/bin/python" -m pip install torch==2.2.1 dgl==2.1.0 torchdata==0.7.1 'numpy<2' 'setuptools<70' \
            pandas pyyaml pydantic h5py
    fi

    say "dgl: verifying NeighborSampler"
    "$venv/bin/python" - <<'EOF'
import torch, dgl
g = dgl.graph((torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([1, 2, 3, 4, 5, 0])))
sampler = dgl.dataloading.NeighborSampler([2, 2])
_, _, blocks = sampler.sample_blocks(g, torch.tensor([0, 1]))
assert len(blocks) == 2
print(f"[setup_baselines] dgl OK: torch {torch.__version__}, dgl {dgl.__version__}")
EOF
}

if ! git -C "$ROOT" check-ignore -q .venv-pyg 2>/dev/null; then
    say "warning: .venv-pyg/.venv-dgl are not git-ignored in $ROOT (add '.venv*' to .gitignore)"
fi
[[ $DO_PYG -eq 1 ]] && setup_pyg
[[ $DO_DGL -eq 1 ]] && setup_dgl
say "done"
