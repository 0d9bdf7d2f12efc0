#!/usr/bin/env python
"""Compile hpc_graph's numba CUDA kernels to PTX/SASS for a GPU we don't have, and report resource use.

No GPU is needed: ``numba.cuda.compile_ptx(kernel.py_func, signature, cc=...)`` runs NVVM only, then
``ptxas -v`` assembles for the target and prints registers / stack / spills, and ``nvdisasm`` (optional)
gives the SASS, where local-memory traffic shows as LDL/STL.

Usage: numba-cuda, NVVM and ptxas come from pip wheels, in a virtual environment of their own (the project's
environment stays CPU-only; numba-cuda 0.30.4 works with numba 0.68):

    python3 -m venv --system-site-packages /tmp/ptx/venv
    /tmp/ptx/venv/bin/pip install "numba-cuda[cu12]==0.30.4" nvidia-cuda-nvcc-cu12 nvidia-cuda-nvdisasm
    PYTHONPATH=$PWD /tmp/ptx/venv/bin/python benchmarks/gpu/ptx_report.py [MODULE ...] \
        [--cc 9.0] [--features 128] [--heads 4] [--dtype float32] [--indices int32] [--out DIR]

MODULE: spmm, gat_attention, sddmm (default: all three). ``--features`` may be a comma list (e.g. 64,128,256);
``--heads`` splits F = heads * D for D. Each kernel's .ptx, .cubin and .sass land in --out.

The argument types mirror what hpc_graph/ops passes: indptr int64[:], indices int32[:] (loaders keep int32
column ids when they fit; --indices int64 for the other case), C-contiguous float arrays (torch tensors via
__cuda_array_interface__), Python int -> int64, Python float -> float64, Python bool -> boolean.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys

import numpy as np
from numba import cuda, typeof, types

HERE = os.path.dirname(os.path.abspath(__file__))


def _tool(name):
    hits = sorted(glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "nvidia", "**", "bin", name),
                            recursive=True))
    return hits[0] if hits else None


PTXAS = os.environ.get("PTXAS") or _tool("ptxas")
NVDISASM = os.environ.get("NVDISASM") or _tool("nvdisasm")

I64 = types.int64
F64 = types.float64


def arr(dtype, ndim):
    """The numba type of a C-contiguous, mutable, aligned array (what typeof gives a contiguous device array)."""
    return typeof(np.empty((1,) * ndim, dtype=dtype))


# ----------------------------------------------------------------------------------------------------- specs
def spmm_specs(dt, idx, features, heads):
    from numba_kernels.cuda import spmm
    out = []
    ch = spmm._chunked_kernels(dt, features)
    # args = (eids, weight, col_scale, x, out, mean, rs, sx, ss, bias); x, out, sx flat [rows, F]
    args = types.Tuple((arr(np.int64, 1), arr(dt, 2), arr(dt, 1), arr(dt, 2), arr(dt, 2), types.boolean,
                        arr(dt, 1), arr(dt, 2), arr(dt, 1), arr(dt, 1)))
    part = arr(dt, 3)
    if ch is not None:
        chunks, fixup, G = ch
        tag = f"F{features}_G{G}_C{(features + G - 1) // G}"
        out.append((f"spmm.chunks[{tag}]", chunks,
                    (arr(np.int64, 1), arr(idx, 1), I64, I64, I64, args, part, part, arr(np.int64, 1))))
        out.append((f"spmm.fixup[{tag}]", fixup, (arr(np.int64, 1), I64, I64, I64, args, part, part, arr(np.int64, 1))))
    ks = spmm._kernels(dt)
    # sum_kernel(indptr, indices, eids, weight, col_scale, x, out, mean, rs, sx, ss, bias): x/out/sx [rows, H, D]
    out.append(("spmm.sum_kernel(block/row)", ks[0],
                (arr(np.int64, 1), arr(idx, 1), arr(np.int64, 1), arr(dt, 2), arr(dt, 1), arr(dt, 3), arr(dt, 3),
                 types.boolean, arr(dt, 1), arr(dt, 3), arr(dt, 1), arr(dt, 1))))
    out.append(("spmm.max_kernel", ks[1],
                (arr(np.int64, 1), arr(idx, 1), arr(np.int64, 1), arr(dt, 2), arr(dt, 3), arr(dt, 3),
                 arr(np.int64, 3))))
    return out


def gat_specs(dt, idx, features, heads):
    from numba_kernels.cuda import gat_attention as g
    out = []
    ks = g._chunked_kernels(dt, features)
    f2, i64v = arr(dt, 2), arr(np.int64, 1)
    # z(flat), s_src, s_dst, src_gid, dst_gid, slope, p, seed
    common = (f2, f2, f2, i64v, i64v, types.float32 if np.dtype(dt) == np.float32 else F64, F64, I64)
    part = arr(dt, 3)
    if ks is not None:
        C = (features + 31) // 32
        tag = f"H{heads}_D{features // heads}_C{C}"
        fwd = types.Tuple(common + (f2, f2, f2, f2, f2))              # m0, l0, m, l, acc(flat)
        dst = types.Tuple(common + (f2, f2, f2, f2, f2))              # m, l, grad_out(flat), rowbuf, rowtt
        src = types.Tuple(common + (f2, f2, f2, f2, f2, f2, f2))      # m, l, grad_out, delta, grad_z, rowbuf, rowtt
        for name, pair, a in (("fwd", ks[0], fwd), ("bwd_dst", ks[1], dst), ("bwd_src", ks[2], src)):
            out.append((f"gat.{name}.chunks[{tag}]", pair[0],
                        (i64v, arr(idx, 1), I64, I64, I64, a, part, part, i64v)))
            out.append((f"gat.{name}.fixup[{tag}]", pair[1], (i64v, I64, I64, I64, a, part, part, i64v)))
        out.append(("gat._head_reduce", g._head_reduce, (i64v, f2, f2, f2, f2, I64)))
    f3 = arr(dt, 3)
    # the thread-per-(row, head) fallbacks (F > 256)
    out.append(("gat._accumulate(fallback)", g._accumulate,
                (i64v, arr(idx, 1), f3, f2, f2, i64v, i64v, F64, F64, I64, f2, f2, f3)))
    out.append(("gat._backward_dst(fallback)", g._backward_dst,
                (i64v, arr(idx, 1), f3, f2, f2, i64v, i64v, F64, F64, I64, f2, f2, f3, f2, f2)))
    out.append(("gat._backward_src(fallback)", g._backward_src,
                (i64v, arr(idx, 1), f3, f2, f2, i64v, i64v, F64, F64, I64, f2, f2, f3, f2, f3, f2)))
    return out


def sddmm_specs(dt, idx, features, heads):
    from numba_kernels.cuda import sddmm
    return [("sddmm.kernel(block/row)", sddmm._kernel(dt),
             (arr(np.int64, 1), arr(idx, 1), arr(dt, 3), arr(dt, 3), arr(dt, 2)))]


SPECS = {"spmm": spmm_specs, "gat_attention": gat_specs, "sddmm": sddmm_specs}


# ----------------------------------------------------------------------------------------------------- work
def _fname(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def analyse(name, dispatcher, sig, cc, outdir, lineinfo=False):
    ptx, _ = cuda.compile_ptx(dispatcher.py_func, sig, cc=cc, lineinfo=lineinfo)
    base = os.path.join(outdir, _fname(name))
    with open(base + ".ptx", "w") as fh:
        fh.write(ptx)
    row = {"kernel": name,
           "ptx_ld_local": len(re.findall(r"\bld\.local", ptx)),
           "ptx_st_local": len(re.findall(r"\bst\.local", ptx)),
           "ptx_local_decl": len(re.findall(r"\.local\s+\.align", ptx)),
           "ptx_depot": ";".join(re.findall(r"__local_depot\w*\[(\d+)\]", ptx)) or "-",
           "ptx_lines": ptx.count("\n")}
    gpu = f"sm_{cc[0]}{cc[1]}"
    res = subprocess.run([PTXAS, "-v", "--gpu-name", gpu, "-O3", base + ".ptx", "-o", base + ".cubin"],
                         capture_output=True, text=True)
    txt = res.stdout + res.stderr
    with open(base + ".ptxas.txt", "w") as fh:
        fh.write(txt)
    if res.returncode != 0:
        raise RuntimeError(f"ptxas failed for {name}:\n{txt}")
    m = re.search(r"Used (\d+) registers", txt)
    row["regs"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", txt)
    row["stack"], row["spill_st"], row["spill_ld"] = (int(x) for x in m.groups()) if m else (None,) * 3
    m = re.search(r"used (\d+) barriers", txt)
    row["barriers"] = int(m.group(1)) if m else None
    if NVDISASM:
        res = subprocess.run([NVDISASM, "-c", base + ".cubin"], capture_output=True, text=True)
        sass = res.stdout
        with open(base + ".sass", "w") as fh:
            fh.write(sass)
        row["sass_LDL"] = len(re.findall(r"\bLDL\b", sass))
        row["sass_STL"] = len(re.findall(r"\bSTL\b", sass))
        row["sass_instr"] = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass, re.M))
        row["sass_f64"] = len(re.findall(r"\b(?:DFMA|DADD|DMUL|DSETP|F2F\.F64\.F32|F2F\.F32\.F64|MUFU\.RCP64H)\b",
                                         sass))
        row["sass_CALL"] = len(re.findall(r"\bCALL\.", sass))
    if row["regs"] is not None:
        row["occ128"] = occupancy(row["regs"], 128)
    return row


def occupancy(regs, threads, regs_per_sm=65536, max_warps=64, max_blocks=32):
    """Theoretical occupancy (resident warps / max) from registers alone, sm_80/sm_90 rules: registers are
    given per warp in units of 256 (per thread rounded up to a multiple of 8), ``threads`` per block."""
    warps_per_block = (threads + 31) // 32
    per_warp = -(-regs * 32 // 256) * 256
    blocks = min(regs_per_sm // (per_warp * warps_per_block), max_blocks, max_warps // warps_per_block)
    return f"{100 * blocks * warps_per_block / max_warps:.1f}%"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", default=list(SPECS), help=f"any of {list(SPECS)}")
    ap.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 (H100/H200), 8.0 (A100)")
    ap.add_argument("--features", default="128", help="F = H * D, comma list allowed")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--indices", default="int32", help="dtype of the CSR column ids (int32 or int64)")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "results", "ptx"),
                    help="where each kernel's .ptx/.cubin/.sass go (default results/ptx)")
    ap.add_argument("--lineinfo", action="store_true", help="emit .loc line info in the PTX (for reading it)")
    ap.add_argument("--only", default="", help="substring filter on kernel names")
    a = ap.parse_args(argv)
    cc = tuple(int(x) for x in a.cc.split("."))
    dt, idx = np.dtype(a.dtype).type, np.dtype(a.indices).type
    os.makedirs(a.out, exist_ok=True)
    print(f"ptxas: {PTXAS}\nnvdisasm: {NVDISASM}\ntarget sm_{cc[0]}{cc[1]}, dtype {a.dtype}, indices {a.indices}, "
          f"heads {a.heads}\n")
    cols = ["kernel", "regs", "stack", "spill_st", "spill_ld", "ptx_ld_local", "ptx_st_local", "ptx_local_decl",
            "sass_LDL", "sass_STL", "sass_instr", "sass_f64", "sass_CALL", "occ128"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    seen = set()
    for mod in a.modules:
        for F in (int(x) for x in a.features.split(",")):
            for name, disp, sig in SPECS[mod](dt, idx, F, a.heads):
                if name in seen or (a.only and a.only not in name):
                    continue
                seen.add(name)
                try:
                    row = analyse(name, disp, sig, cc, a.out, a.lineinfo)
                except Exception as exc:  # keep going: report the failure in the table
                    print(f"| {name} | FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]} |")
                    continue
                print("| " + " | ".join(str(row.get(c, "-")) for c in cols) + " |", flush=True)


if __name__ == "__main__":
    main()
