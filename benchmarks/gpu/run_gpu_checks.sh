#!/usr/bin/env bash
# GPU checks and benchmarks in one run, on a machine with an NVIDIA GPU (issue: the GPU path).
#
#   bash benchmarks/gpu/run_gpu_checks.sh [STEP...]      # default: every step, in this order
#
# Steps: tests (kernels and train side by side), env (GPU, packages, `hpc-graph info --env` on 2 ranks), kernels (tests/gpu: every CUDA twin and op
# against the CPU, the non-default-stream test), train (tests/gpu: every engine with train.device=cuda,
# 2 ranks sharing the GPU), bench20 (`hpc-graph bench kernels --device cuda` at R-MAT scale 20), bench22
# (SpMM at scale 22 and attention vs SDPA), layers18 (SAGE/GAT layers at scale 18), epochs (training
# epochs vs PyG on the GPU, benchmarks/bench_gpu.py). Logs and JSON go to $OUT (default results/gpu).
# Wheels in .whl/ (mpich for mpiexec, mpi4py, pymetis) are installed first when present.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# MPI: a machine whose mpi4py is built against its own Open MPI (and whose h5py may load Open MPI too) runs
# the ranks with that Open MPI's mpirun; elsewhere MPICH's wheel provides mpiexec and mpi4py is pointed at it.
if command -v mpirun >/dev/null 2>&1 && mpirun --version 2>&1 | grep -q "Open MPI"; then
  export HPC_GRAPH_MPIEXEC="mpirun --allow-run-as-root --oversubscribe"
  skip_wheels="mpich-* mpi4py-*"
fi
wheels=()
for w in .whl/*.whl; do
  [ -e "$w" ] || continue
  keep=1
  for pat in ${skip_wheels:-}; do case $(basename "$w") in $pat) keep=0 ;; esac; done
  [ $keep = 1 ] && wheels+=("$w")
done
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
    && export PYTHONPATH="/tmp/site:$PYTHONPATH" PATH="/tmp/site/bin:$PATH"
  libmpi=$(find /tmp/site -name 'libmpi.so.12' 2>/dev/null | head -1)
  if [ -z "${HPC_GRAPH_MPIEXEC:-}" ] && [ -n "$libmpi" ]; then
    export MPI4PY_MPIABI=mpich MPI4PY_LIBMPI="$libmpi" LD_LIBRARY_PATH="$(dirname "$libmpi")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
MPIEXEC=${HPC_GRAPH_MPIEXEC:-mpiexec}
DEADLINE=${DEADLINE:-100000}  # seconds: steps that would end later get the time left, none under 30 s
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(env kernels train bench20 bench22 layers18 epochs)
status=0
step() {  # step NAME TIMEOUT CMD...: run with a limit, log to $OUT/NAME.log, report the outcome
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  if (( SECONDS + limit > DEADLINE )); then limit=$((DEADLINE - SECONDS)); fi
  if (( limit < 30 )); then echo "== $name: skipped (deadline)"; status=1; return; fi
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
  [ $rc -eq 0 ] || status=1
}
for s in "${STEPS[@]}"; do
  case $s in
    env) step env 60 bash -c "nvidia-smi -L; python3 -c 'import torch, numba, numpy, sys, mpi4py, h5py; print(sys.version.split()[0], torch.__version__, numba.__version__, numpy.__version__, mpi4py.__file__, h5py.get_config().mpi); from numba import cuda; cuda.detect()'; echo PYTHONPATH=\$PYTHONPATH MPIEXEC='$MPIEXEC' MPI4PY_LIBMPI=\${MPI4PY_LIBMPI:-}; $MPIEXEC -n 2 python3 -m hpc_graph.cli info --env" ;;
    tests) step tests 200 bash -c "python3 -m pytest -q -n 8 -p no:cacheprovider -rf tests/gpu/test_ops_gpu.py \
             tests/gpu/test_kernels_gpu.py > $OUT/kernels.log 2>&1 & p=\$!; python3 -m pytest -q -n 8 -p no:cacheprovider \
             -rf tests/gpu/test_train_gpu.py > $OUT/train.log 2>&1; r=\$?; wait \$p; k=\$?; tail -n 40 $OUT/kernels.log; \
             tail -n 40 $OUT/train.log; exit \$((r | k))" ;;
    kernels) step kernels 150 python3 -m pytest -q -n 12 -p no:cacheprovider -rf tests/gpu/test_ops_gpu.py tests/gpu/test_kernels_gpu.py ;;
    train) step train 300 python3 -m pytest -q -n 12 -p no:cacheprovider -rf tests/gpu/test_train_gpu.py ;;
    bench20) step bench20 120 python3 -m hpc_graph.cli bench kernels --device cuda --scale 20 --repeat 5 \
               --ops memcpy spmm sddmm sage gat --json "$OUT/kernels20.jsonl" --force ;;
    bench22) step bench22 200 python3 -m hpc_graph.cli bench kernels --device cuda --scale 22 --repeat 5 \
               --ops memcpy spmm attention --seq-lens 65536 131072 262144 1048576 --json "$OUT/kernels22.jsonl" --force ;;
    layers18) step layers18 120 python3 -m hpc_graph.cli bench kernels --device cuda --scale 18 --repeat 5 \
               --ops sage gat --json "$OUT/kernels18.jsonl" --force ;;
    epochs) step epochs 300 python3 benchmarks/bench_gpu.py --scales 18 20 --epochs 6 --workdir /tmp/bench_gpu \
               --out "$OUT/epochs.jsonl" ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
exit $status
