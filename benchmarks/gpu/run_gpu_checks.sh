#!/usr/bin/env bash
# GPU checks and benchmarks in one run, on a machine with an NVIDIA GPU (issue: the GPU path).
#
#   bash benchmarks/gpu/run_gpu_checks.sh [STEP...]      # default: every step, in this order
#
# Steps: pregen (the epochs step's graphs, generated in the background), tests (kernels, then train), env (GPU, packages, `hpc-graph info --env` on 2 ranks), kernels (tests/gpu: every CUDA twin and op
# against the CPU, the non-default-stream test), train (tests/gpu: every engine with train.device=cuda,
# 2 ranks sharing the GPU), bench20 (`hpc-graph bench kernels --device cuda` at R-MAT scale 20), bench22
# (SpMM at scale 22 and attention vs SDPA), layers18 (SAGE/GAT layers at scale 18), epochs (training
# epochs vs PyG on the GPU, benchmarks/bench_gpu.py). Logs and JSON go to $OUT (default results/gpu).
# Wheels in .whl/ (numpy < 2.5, pymetis; mpich and mpi4py for mpiexec) are installed first when present.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# tests/gpu/conftest.py appends each failure here as it happens (a step cut by its limit prints no summary)
export HPC_GRAPH_FAILURE_LOG="$OUT/failures.log"
# Wheels: everything but MPI goes to /tmp/site (e.g. NumPy < 2.5 for numba-cuda, pymetis); the MPICH and
# mpi4py wheels to /tmp/site-mpi, used only if they are the launch that works (probe below).
rest=()
for w in .whl/*.whl; do
  [ -e "$w" ] || continue
  case $(basename "$w") in mpich-*|mpi4py-*) ;; *) rest+=("$w") ;; esac
done
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
if [ ${#rest[@]} -gt 0 ] && pipi /tmp/site "${rest[@]}"; then export PYTHONPATH="/tmp/site:$PYTHONPATH"; fi
# MPI: the first launch under which 2 ranks see a world of 2 (with h5py and hpc_graph imported) is kept:
# (1) the carried MPICH wheel's mpiexec with the carried mpi4py pointed at MPICH's library (as on CI);
# (2) the machine's own Open MPI mpirun with the machine's mpi4py; (3) the machine's plain mpiexec.
probe='import h5py, hpc_graph.comm.env; from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.Get_size() == 2, c.Get_size()'
mpi_ok() { timeout 60 $1 -n 2 python3 -c "$probe" >"$OUT/mpi_probe.log" 2>&1; }
chosen=""
# (pip --target drops a wheel's data/lib, where MPICH's libmpi lives: the MPICH wheel is unzipped instead)
mpich=$(ls .whl/mpich-*.whl 2>/dev/null | head -1); m4py=$(ls .whl/mpi4py-*.whl 2>/dev/null | head -1)
if [ -n "$mpich" ] && [ -n "$m4py" ] && pipi /tmp/site-mpi "$m4py" && rm -rf /tmp/mpich \
   && python3 -m zipfile -e "$mpich" /tmp/mpich; then
  mdata=$(ls -d /tmp/mpich/mpich-*.data/data | head -1); chmod -R +x "$mdata/bin"
  libmpi=$mdata/lib/libmpi.so.12
  mpich_env() {
    export PYTHONPATH="/tmp/site-mpi:$PYTHONPATH" PATH="$mdata/bin:$PATH" MPI4PY_MPIABI=mpich \
      MPI4PY_LIBMPI="$libmpi" LD_LIBRARY_PATH="$mdata/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      HPC_GRAPH_MPIEXEC="$mdata/bin/mpiexec"
  }
  if [ -f "$libmpi" ] && [ -x "$mdata/bin/mpiexec" ] && ( mpich_env; mpi_ok "$mdata/bin/mpiexec" ); then
    chosen=mpich; mpich_env
  fi
fi
if [ -z "$chosen" ] && command -v mpirun >/dev/null 2>&1 && mpirun --version 2>&1 | grep -q "Open MPI" \
   && mpi_ok "mpirun --allow-run-as-root --oversubscribe"; then
  chosen=openmpi; export HPC_GRAPH_MPIEXEC="mpirun --allow-run-as-root --oversubscribe"
fi
if [ -z "$chosen" ] && command -v mpiexec >/dev/null 2>&1 && mpi_ok mpiexec; then chosen=system; fi
echo "== MPI launch: ${chosen:-none works (multi-rank steps will fail; see mpi_probe.log)} (${HPC_GRAPH_MPIEXEC:-mpiexec})"
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
kernels_step() { step kernels 150 python3 -m pytest -q -n 12 -p no:cacheprovider -rf tests/gpu/test_ops_gpu.py \
                   tests/gpu/test_kernels_gpu.py; }
# ranks of 2 threads: 8 workers each starting 2-rank runs would otherwise put 8 threads per rank on 16 cores
train_step() { OMP_NUM_THREADS=2 step train 300 python3 -m pytest -q -n 8 -p no:cacheprovider -rf --timeout 280 \
                 tests/gpu/test_train_gpu.py; }
for s in "${STEPS[@]}"; do
  case $s in
    env) step env 60 bash -c "nvidia-smi -L; python3 -c 'import torch, numba, numpy, sys, mpi4py, h5py; print(sys.version.split()[0], torch.__version__, numba.__version__, numpy.__version__, mpi4py.__file__, h5py.get_config().mpi); from numba import cuda; cuda.detect()'; echo PYTHONPATH=\$PYTHONPATH MPIEXEC='$MPIEXEC' MPI4PY_LIBMPI=\${MPI4PY_LIBMPI:-}; $MPIEXEC -n 2 python3 -m hpc_graph.cli info --env" ;;
    tests) kernels_step; train_step ;;
    kernels) kernels_step ;;
    train) train_step ;;
    bench20) step bench20 120 python3 -m hpc_graph.cli bench kernels --device cuda --scale 20 --repeat 5 \
               --ops memcpy spmm sddmm sage gat --json "$OUT/kernels20.jsonl" --force ;;
    bench22) step bench22 200 python3 -m hpc_graph.cli bench kernels --device cuda --scale 22 --repeat 5 \
               --ops memcpy spmm attention --seq-lens 65536 131072 262144 1048576 --json "$OUT/kernels22.jsonl" --force ;;
    layers18) step layers18 120 python3 -m hpc_graph.cli bench kernels --device cuda --scale 18 --repeat 5 \
               --ops sage gat --json "$OUT/kernels18.jsonl" --force ;;
    pregen) mkdir -p /tmp/bench_gpu  # the epochs step's R-MAT graphs, generated on the CPU in the background
            setsid nohup bash -c 'for s in 18 20; do [ -f /tmp/bench_gpu/rmat$s.h5 ] || { python3 -m hpc_graph.cli \
              generate rmat --scale $s --edge-factor 16 --feat-dim 128 --num-classes 16 -o /tmp/bench_gpu/tmp$s.h5 \
              && mv /tmp/bench_gpu/tmp$s.h5 /tmp/bench_gpu/rmat$s.h5; }; done' >"$OUT/pregen.log" 2>&1 &
            echo "== pregen: started in the background" ;;
    epochs) while pgrep -f "generate rmat" >/dev/null && (( SECONDS < DEADLINE - 60 )); do sleep 2; done
            step epochs 300 python3 benchmarks/bench_gpu.py --scales 18 20 --epochs 6 --workdir /tmp/bench_gpu \
               --out "$OUT/epochs.jsonl" ;;
    *) echo "unknown step $s"; status=1 ;;
  esac
done
exit $status
