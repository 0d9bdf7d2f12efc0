"""Software prefetch for the CPU kernels' row gathers (``llvm.prefetch`` via a numba intrinsic).

SpMM-like kernels read whole source rows at random addresses; the hardware
cannot predict them, so each edge waits for DRAM. Prefetching the rows of the
edges ``PREFETCH_DISTANCE`` positions ahead keeps several misses in flight and
roughly halves the time per edge on graphs whose features exceed the caches.
A prefetch is only a hint: a wrong address never faults.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: edges ahead whose source rows are prefetched
PREFETCH_DISTANCE = 8
#: at most this many 64-byte lines of a row are prefetched (wider rows stream on their own)
MAX_LINES = 16


@intrinsic
def _prefetch_address(typingctx, addr):
    """Emit ``llvm.prefetch(addr, read, high locality, data)`` for an integer address."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        ptr = builder.inttoptr(args[0], i8p)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(addr), codegen


@njit(inline="always", nogil=True)
def prefetch_row(base, row_bytes, lines, j) -> None:
    """Prefetch ``lines`` cache lines of row ``j`` of an array at address ``base`` with ``row_bytes`` per row."""
    a = base + j * row_bytes
    for line in range(lines):
        _prefetch_address(a + 64 * line)


@njit(inline="always", nogil=True)
def row_lines(row_bytes) -> int:
    """Cache lines of one row to prefetch (capped at :data:`MAX_LINES`)."""
    return min((row_bytes + 63) // 64, MAX_LINES)
