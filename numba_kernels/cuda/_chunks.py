"""Edge-balanced work split shared by the CUDA kernels that walk CSR rows (SpMM sum, fused GAT).

The CSR positions ``0..E-1`` are cut into chunks of ``T`` positions. Chunk
``ch`` covers ``[ch T, min(ch T + T, E))`` and *owns* the rows that start in
it (the last chunk also owns the rows starting at ``E``: trailing empty
rows). Its positions before the first owned row's start (``lo .. lead``)
belong to the row that started in an earlier chunk (row ``r0 - 1``): the
chunk's *leading part* of that row. The last owned row may run past the
chunk's end: the chunk's *trailing part*. A kernel computes the rows that
start and end in a chunk in full, stores the leading and trailing parts in
per-chunk scratch rows (``ext[ch]`` = the trailing row or -1), and a second
kernel combines, for every trailing row, its owner's trailing part with the
leading parts of the chunks it covers, in chunk order (deterministic). No
row is ever walked by one group alone for more than ``T`` positions.
"""
from __future__ import annotations

import numpy as np
from numba import cuda


@cuda.jit(device=True, inline=True)
def lower_bound(indptr, n, v):
    """First row ``r`` in ``[0, n]`` with ``indptr[r] >= v`` (``indptr`` non-decreasing, length ``n + 1``)."""
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if indptr[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda.jit(device=True, inline=True)
def chunk_rows(ch, T, indptr, n, E, nchunks):
    """``(lo, hi, r0, r1, lead)`` of chunk ``ch``: its positions ``[lo, hi)``, its owned rows ``[r0, r1)``
    and the end of its leading part ``[lo, lead)`` (empty when ``lead == lo``; the row is ``r0 - 1``)."""
    lo = ch * T
    hi = min(lo + T, E)
    r0 = lower_bound(indptr, n, lo)
    r1 = n if ch == nchunks - 1 else lower_bound(indptr, n, hi)
    lead = hi
    if r0 < n and indptr[r0] < hi:
        lead = indptr[r0]
    return lo, hi, r0, r1, lead


def num_chunks(num_edges: int, T: int) -> int:
    """Chunks of ``T`` positions over ``num_edges`` (at least one, which owns every row of an edgeless CSR)."""
    return max(1, (int(num_edges) + T - 1) // T)


def chunk_kernels(nbtype, G: int, C: int, NA: int, reset, segment, store, merge, skip_empty: bool = False,
                  NT: int = 1):
    """``(chunks, fixup)``: the two kernels of one edge-balanced computation (see the module docstring).

    A group of ``G`` lanes takes a chunk; lane ``t`` owns the features ``t, t + G, ...`` (``C`` slots) and
    keeps ``NA`` accumulators per slot in ``acc`` (a local ``[NA, C]`` array). The computation is given as
    device functions (closure constants, inlined):

    * ``reset(acc)``: the accumulators of an empty segment;
    * ``segment(row, k0, k1, indices, args, heads, slots, tmp, lane, acc)``: fold CSR positions ``[k0, k1)``
      of ``row``; ``slots[0, c]``/``slots[1, c]`` are slot ``c``'s head and feature, 0 past the row's ``F``
      features (so an edge loop can run every slot without a test: those slots compute values nobody
      stores), ``tmp`` a local ``[NT, C]`` array for per-row values (device functions must not allocate
      local arrays themselves: numba's simulator swaps ``cuda`` per call, racing between its threads);
    * ``store(row, degree, D, args, heads, lane, acc)``: finish a whole row (``degree``: its positions);
    * ``merge(acc, part, ch, heads, lane)``: fold chunk ``ch``'s stored part (``part[a, ch, feature]``) in.

    ``heads[c]`` is the head of slot ``c`` (features ``D`` per head), or -1 past the row's ``F`` features.
    Kernel arguments: ``chunks(indptr, indices, F, D, T, args, part_f, part_l, ext)`` and
    ``fixup(indptr, F, D, T, args, part_f, part_l, ext)``; ``args`` is the computation's tuple of arrays and
    scalars; ``part_f``/``part_l`` ``[NA, nchunks, F]`` scratch (leading and trailing parts), ``ext`` int64
    ``[nchunks]``. ``skip_empty``: rows without positions are left alone instead of stored.
    """

    @cuda.jit(device=True, inline=True)
    def slot_heads(lane, F, D, heads, slots):
        for c in range(C):
            f = lane + G * c
            heads[c] = f // D if f < F else -1
            slots[0, c] = heads[c] if f < F else 0
            slots[1, c] = f if f < F else 0

    @cuda.jit(device=True, inline=True)
    def put(part, ch, heads, lane, acc):
        for a in range(NA):
            for c in range(C):
                if heads[c] >= 0:
                    part[a, ch, lane + G * c] = acc[a, c]

    @cuda.jit
    def chunks(indptr, indices, F, D, T, args, part_f, part_l, ext):
        n = indptr.shape[0] - 1
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % G
        heads = cuda.local.array(C, np.int64)
        slots = cuda.local.array((2, C), np.int64)
        tmp = cuda.local.array((NT, C), nbtype)
        acc = cuda.local.array((NA, C), nbtype)
        slot_heads(lane, F, D, heads, slots)
        for ch in range(tid // G, nchunks, (cuda.gridDim.x * cuda.blockDim.x) // G):
            lo, hi, r0, r1, lead = chunk_rows(ch, T, indptr, n, indices.shape[0], nchunks)
            if lead > lo:
                reset(acc)
                segment(r0 - 1, lo, lead, indices, args, heads, slots, tmp, lane, acc)
                put(part_f, ch, heads, lane, acc)
            last = -1
            for r in range(r0, r1):
                start = indptr[r]
                end = indptr[r + 1]
                if skip_empty and start == end:
                    continue
                reset(acc)
                segment(r, start, min(end, hi), indices, args, heads, slots, tmp, lane, acc)
                if end <= hi:
                    store(r, end - start, D, args, heads, lane, acc)
                else:
                    last = r
                    put(part_l, ch, heads, lane, acc)
            if lane == 0:
                ext[ch] = last

    @cuda.jit
    def fixup(indptr, F, D, T, args, part_f, part_l, ext):
        # a row that ran past its chunk: its own chunk's trailing part, then the leading parts of the chunks
        # it covers, in chunk order (deterministic), then the row's finish
        nchunks = ext.shape[0]
        tid = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        lane = tid % G
        heads = cuda.local.array(C, np.int64)
        slots = cuda.local.array((2, C), np.int64)
        acc = cuda.local.array((NA, C), nbtype)
        slot_heads(lane, F, D, heads, slots)
        for ch in range(tid // G, nchunks, (cuda.gridDim.x * cuda.blockDim.x) // G):
            r = ext[ch]
            if r < 0:
                continue
            end = indptr[r + 1]
            reset(acc)
            merge(acc, part_l, ch, heads, lane)
            c2 = ch + 1
            while c2 * T < end:
                merge(acc, part_f, c2, heads, lane)
                c2 += 1
            store(r, end - indptr[r], D, args, heads, lane, acc)

    return chunks, fixup


def sum_parts(G: int, C: int, NA: int, nbtype):
    """``(reset, merge)`` for accumulators that are plain sums (zeros; add a stored part)."""
    zero = nbtype(0)

    @cuda.jit(device=True, inline=True)
    def reset(acc):
        for a in range(NA):
            for c in range(C):
                acc[a, c] = zero

    @cuda.jit(device=True, inline=True)
    def merge(acc, part, ch, heads, lane):
        for a in range(NA):
            for c in range(C):
                if heads[c] >= 0:
                    acc[a, c] += part[a, ch, lane + G * c]

    return reset, merge


def launch_chunks(kernels, G: int, threads: int, max_blocks: int, stream, indptr, indices, F: int, D: int, T: int,
                  args: tuple, dtype, scratch, num_acc: int) -> None:
    """Allocate the parts and run ``kernels = (chunks, fixup)`` of :func:`chunk_kernels` on ``stream``."""
    nchunks = num_chunks(indices.shape[0], T)
    part_f = scratch((num_acc, nchunks, F), dtype)
    part_l = scratch((num_acc, nchunks, F), dtype)
    ext = scratch((nchunks,), np.int64)
    blocks = max(1, min((nchunks * G + threads - 1) // threads, max_blocks))
    kernels[0][blocks, threads, stream](indptr, indices, F, D, T, args, part_f, part_l, ext)
    kernels[1][blocks, threads, stream](indptr, F, D, T, args, part_f, part_l, ext)
