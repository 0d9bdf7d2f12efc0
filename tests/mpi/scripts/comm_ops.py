"""Every Communicator operation against a NumPy reference, on however many ranks it runs.

Usage: mpiexec -n N python comm_ops.py [--backend mpi,torch] [--tiny-limit BYTES] [--link-model]
                                       [--fail-rank R [--in-thread]]

Each rank's data comes from a generator seeded by its rank, so every rank can
rebuild any other rank's data and compute the expected result locally. Runs
all checks twice: with the default message limit, and with a tiny
``max_message_bytes`` that forces chunking (checked by recording the size of
every message). Prints "OK BACKEND rank R" per backend; any failure raises and the
abort handler takes the job down.

Two more checks share the job (each launch costs seconds of interpreter start-up per rank):

* ``--link-model`` (2 ranks): after a backend's checks, ``link_model.py`` runs on that backend's
  communicator (counters zeroed, as in a job of its own); prints "OK link BACKEND rank R".
* ``--fail-rank R``: at the end, rank R raises (in a thread named ``worker`` with ``--in-thread``)
  while the other ranks wait in an all-reduce of the MPI communicator. The abort handler must end
  the job with a non-zero status and name the rank on stderr; without it the others would block
  forever. Rank R prints "FAILING rank R at T" (``time.time()``) first, so that the test can time
  the abort; a rank that is not aborted prints "rank R was not aborted".
"""
import argparse
import logging
import runpy
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from hpc_graph.comm import get_communicator, install_abort_handler

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


def rank_data(seed, shape, dtype):
    rng = np.random.default_rng(seed)
    if dtype == torch.int64:
        return torch.from_numpy(rng.integers(-1000, 1000, size=shape).astype(np.int64))
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def close(actual, expected, what):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.dtype.is_floating_point:
        tol = 1e-5 if actual.dtype == torch.float32 else 1e-12
        ok = torch.allclose(actual.double(), expected.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(actual, expected)
    assert ok, f"{what}: max diff {(actual.double() - expected.double()).abs().max()}"


class Recorder:
    """Wraps a communicator's p2p/bcast/allreduce primitives to record message sizes (bytes)."""

    def __init__(self, comm):
        self.sizes = []
        for name in ("_isend", "_bcast_flat", "_allreduce_flat"):
            original = getattr(comm, name)

            def wrapper(buf, *args, _original=original, **kw):
                self.sizes.append(buf.numel() * buf.element_size())
                return _original(buf, *args, **kw)
            setattr(comm, name, wrapper)


def check_allreduce(comm, size):
    for name, dtype in DTYPES.items():
        for op in ("sum", "max", "min", "mean", "prod"):
            if op == "mean" and dtype == torch.int64:
                continue
            shape = (5, 3)
            per_rank = [rank_data(100 * r + 7, shape, dtype) for r in range(size)]
            if op == "prod" and dtype != torch.int64:  # keep the product well conditioned
                per_rank = [1.0 + 0.1 * x for x in per_rank]
            elif op == "prod":
                per_rank = [x % 3 + 1 for x in per_rank]
            stack = torch.stack(per_rank)
            expected = {"sum": stack.sum(0), "max": stack.max(0).values, "min": stack.min(0).values,
                        "mean": stack.sum(0) / size if dtype != torch.int64 else None,
                        "prod": stack.prod(0)}[op]
            t = per_rank[comm.rank].clone()
            out = comm.allreduce_(t, op)
            assert out is t, "allreduce_ must work in place and return its argument"
            close(t, expected.to(dtype), f"allreduce_ {name} {op}")
    # non-contiguous input (a transposed view) is reduced in place too
    base = rank_data(31 + comm.rank, (4, 6), torch.float64)
    view = base.t()
    comm.allreduce_(view)
    close(base, sum(rank_data(31 + r, (4, 6), torch.float64) for r in range(size)), "allreduce_ non-contiguous")
    # half precision goes through float32
    h = torch.full((9,), float(comm.rank + 1), dtype=torch.bfloat16)
    comm.allreduce_(h)
    close(h.float(), torch.full((9,), float(size * (size + 1) // 2)), "allreduce_ bfloat16")


def check_bucketed(comm, size):
    shapes = [((3, 4), torch.float32), ((17,), torch.float64), ((2, 2, 2), torch.int64),
              ((40,), torch.float32), ((1,), torch.float32), ((5, 5), torch.float64)]
    for bucket_bytes in (64, 25 << 20):
        tensors = [rank_data(1000 * r + i, s, d) for i, (s, d) in enumerate(shapes) for r in [comm.rank]]
        expected = [sum(rank_data(1000 * r + i, s, d) for r in range(size)) for i, (s, d) in enumerate(shapes)]
        before = dict(comm.calls)
        comm.allreduce_bucketed_(tensors, bucket_bytes=bucket_bytes)
        for i, (t, e) in enumerate(zip(tensors, expected)):
            close(t, e, f"allreduce_bucketed_ tensor {i} (bucket {bucket_bytes} B)")
        assert comm.calls.get("allreduce", 0) == before.get("allreduce", 0) + 1


def a2a_counts(src, size, zero_rank=None):
    """Rows rank ``src`` sends to each rank; rank ``zero_rank`` sends and receives nothing."""
    counts = np.random.default_rng(5000 + src).integers(0, 4, size=size)
    counts[src % size] = 0 if src % 2 else counts[src % size]  # some self-blocks empty
    if zero_rank is not None:
        if src == zero_rank:
            counts[:] = 0
        counts[zero_rank] = 0
    return counts


def check_alltoallv(comm, size):
    me = comm.rank
    for name, dtype in DTYPES.items():
        for row_shape in ((), (3,), (2, 2)):
            for zero_rank in (None, size - 1):
                counts = [a2a_counts(r, size, zero_rank) for r in range(size)]
                data = [rank_data(7000 + r, (int(counts[r].sum()),) + row_shape, dtype) for r in range(size)]
                offsets = [np.concatenate(([0], np.cumsum(c))) for c in counts]
                expected = torch.cat([data[r][offsets[r][me]:offsets[r][me + 1]] for r in range(size)])
                comm.reset_counters()
                recv, recv_counts = comm.alltoallv(data[me], counts[me])
                close(recv, expected, f"alltoallv {name} rows {row_shape} zero_rank {zero_rank}")
                assert recv_counts.tolist() == [int(counts[r][me]) for r in range(size)], recv_counts
                row_bytes = int(np.prod(row_shape, dtype=np.int64)) * data[me].element_size()
                sent = int(counts[me].sum() - counts[me][me]) * row_bytes
                assert comm.bytes_sent == sent, (comm.bytes_sent, sent)
    # every count zero
    recv, recv_counts = comm.alltoallv(torch.empty(0, 4), np.zeros(size, dtype=np.int64))
    assert recv.shape == (0, 4) and not recv_counts.any()


def exchange_plan(src, size):
    """{dst: rows} rank ``src`` sends; rank 1 sends nothing, rank 0 also sends to itself."""
    if src == 1 % size and size > 1:
        return {}
    rng = np.random.default_rng(9000 + src)
    plan = {dst: int(rng.integers(0, 5)) for dst in range(size) if dst != src and rng.random() < 0.7}
    if src == 0:
        plan[0] = 2
    return plan


def check_exchange(comm, size):
    me = comm.rank
    plans = [exchange_plan(r, size) for r in range(size)]
    for name, dtype in DTYPES.items():
        feat = 3
        msg = lambda src, dst: rank_data(src * 131 + dst * 7 + 3, (plans[src][dst], feat), dtype)  # noqa: E731
        sends = {dst: msg(me, dst) for dst in plans[me]}
        specs = {src: ((plans[src][me], feat), dtype) for src in range(size) if me in plans[src]}
        comm.reset_counters()
        got = comm.exchange(sends, specs)
        assert sorted(got) == sorted(specs), (sorted(got), sorted(specs))
        for src, t in got.items():
            close(t, msg(src, me), f"exchange {name} from {src}")
        expected_bytes = sum(t.numel() * t.element_size() for dst, t in sends.items() if dst != me)
        assert comm.bytes_sent == expected_bytes, (comm.bytes_sent, expected_bytes)
        assert comm.bytes_by_op.get("exchange", 0) == expected_bytes
        assert comm.comm_seconds > 0
    # non-contiguous send rows, and two exchanges in flight at once (prefetch), waited in reverse order
    ring_to, ring_from = (me + 1) % size, (me - 1) % size
    wide = rank_data(40 + me, (6, 4), torch.float64)
    first = comm.exchange_start({ring_to: wide[:, 1]}, {ring_from: ((6,), torch.float64)})
    second = comm.exchange_start({ring_from: wide.t()}, {ring_to: ((4, 6), torch.float64)})
    got2 = second.wait()
    got1 = first.wait()
    assert first.done and second.done and first.wait() is got1
    close(got1[ring_from], rank_data(40 + ring_from, (6, 4), torch.float64)[:, 1], "exchange_start first")
    close(got2[ring_to], rank_data(40 + ring_to, (6, 4), torch.float64).t().contiguous(), "exchange_start second")


def check_bounded_exchange(comm, size):
    """exchange_start_bounded: random lengths under random bounds, some empty, some peers silent; polled with
    test(); bytes count the payload and an 8-byte length per message; then again in two phases."""
    me = comm.rank
    cap = min(40, comm.max_message_bytes - 8)
    rng = np.random.default_rng(77)  # the same plan on every rank
    for rnd in range(3):
        plan = {(s, d): int(rng.integers(0, cap + 1)) for s in range(size) for d in range(size)
                if s != d and rng.random() < 0.8}
        slack = {(s, d): int(rng.integers(0, cap - n + 1)) for (s, d), n in plan.items()}
        msg = lambda s, d: torch.from_numpy(  # noqa: E731
            np.random.default_rng(1000 * rnd + 10 * s + d).integers(0, 256, plan[(s, d)]).astype(np.uint8))
        for two_phase in (False, True):
            native = comm.shorter_receives
            if two_phase:
                comm.shorter_receives = False
            try:
                comm.reset_counters()
                sends = {d: msg(me, d) for (s, d) in plan if s == me}
                bounds = {s: plan[(s, d)] + slack[(s, d)] for (s, d) in plan if d == me}
                req = comm.exchange_start_bounded(sends, bounds, channel=5)
                while not req.test():
                    pass
                got = req.wait()
            finally:
                comm.shorter_receives = native
            assert sorted(got) == sorted(bounds), (sorted(got), sorted(bounds))
            for s, t in got.items():
                assert t.dtype == torch.uint8 and torch.equal(t, msg(s, me)), (s, t.numel(), plan[(s, me)])
            assert comm.bytes_sent == sum(t.numel() + 8 for t in sends.values()), comm.bytes_sent
    for bad, match in ((lambda: comm.exchange_start_bounded({me: torch.zeros(1, dtype=torch.uint8)}, {me: 1}),
                        "cannot send to itself"),
                       (lambda: comm.exchange_start_bounded({}, {(me + 1) % size: comm.max_message_bytes}),
                        "must be in"),
                       (lambda: comm.exchange_start_bounded({(me + 1) % size: torch.zeros(2)}, {}),
                        "1-D uint8 CPU tensor")):
        try:
            bad()
        except ValueError as e:
            assert match in str(e), str(e)
        else:
            raise AssertionError(f"exchange_start_bounded accepted a bad call ({match})")
    comm.barrier()


def check_bcast_objects(comm, size):
    root = size - 1
    for name, dtype in DTYPES.items():
        t = rank_data(60 + comm.rank, (7, 3), dtype)
        comm.reset_counters()
        assert comm.bcast(t, root=root) is t
        close(t, rank_data(60 + root, (7, 3), dtype), f"bcast {name}")
        assert comm.bytes_sent == (t.numel() * t.element_size() if comm.rank == root else 0)
    base = rank_data(70 + comm.rank, (3, 5), torch.float32)
    comm.bcast(base.t(), root=0)
    close(base, rank_data(70, (3, 5), torch.float32), "bcast non-contiguous")
    obj = {"rank": comm.rank, "payload": list(range(comm.rank * 50)), "text": "x" * 300}
    got = comm.bcast_object(obj, root=root)
    assert got == {"rank": root, "payload": list(range(root * 50)), "text": "x" * 300}, got["rank"]
    everyone = comm.allgather_object(("r", comm.rank, "y" * comm.rank))
    assert everyone == [("r", r, "y" * r) for r in range(size)], everyone
    comm.barrier()


def run_all(comm, size):
    check_allreduce(comm, size)
    check_bucketed(comm, size)
    check_alltoallv(comm, size)
    check_exchange(comm, size)
    check_bounded_exchange(comm, size)
    check_bcast_objects(comm, size)


def check_backend(backend, tiny_limit):
    comm = get_communicator(backend)
    install_abort_handler(comm)
    size = comm.size
    assert comm.backend == backend, comm.backend
    assert size > 1 and 0 <= comm.rank < size and 0 <= comm.local_rank < comm.local_size <= size
    run_all(comm, size)

    tiny = get_communicator(backend, max_message_bytes=tiny_limit)
    assert tiny is not comm and tiny.max_message_bytes == tiny_limit
    assert get_communicator(backend) is comm
    recorder = Recorder(tiny)
    run_all(tiny, size)
    # halves are reduced as float32: 4-byte elements, so the element step keeps messages within the limit
    assert recorder.sizes and max(recorder.sizes) <= tiny_limit, max(recorder.sizes)
    full = sum(1 for s in recorder.sizes if s == tiny_limit)
    assert full > 10, f"chunking never produced full-size chunks ({full})"
    comm.barrier()


LINK_MODEL = Path(__file__).resolve().parent / "link_model.py"


def run_link_model(backend):
    """``link_model.py BACKEND`` on this job's communicator of ``backend``, its counters zeroed first."""
    comm = get_communicator(backend)
    comm.reset_counters()
    argv = sys.argv
    sys.argv = [str(LINK_MODEL), backend]
    try:
        runpy.run_path(str(LINK_MODEL), run_name="__main__")
    finally:
        sys.argv = argv
    print(f"OK link {backend} rank {comm.rank}", flush=True)


def fail_on(rank, in_thread):
    """Rank ``rank`` raises while the other ranks wait in an all-reduce; only an abort ends the job."""
    comm = get_communicator("mpi")
    install_abort_handler(comm)
    comm.barrier()
    if comm.rank == rank:
        def fail():
            raise ValueError(f"deliberate failure on rank {comm.rank}")
        print(f"FAILING rank {comm.rank} at {time.time():.3f}", flush=True)
        if in_thread:
            worker = threading.Thread(target=fail, name="worker")
            worker.start()
            worker.join()
            comm.allreduce_(torch.ones(3))  # the thread's abort must end this rank too
        else:
            fail()
    comm.allreduce_(torch.ones(3))  # the other ranks block here until aborted
    print(f"rank {comm.rank} was not aborted", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi", help="comma-separated: mpi,torch")
    parser.add_argument("--tiny-limit", type=int, default=24)
    parser.add_argument("--link-model", action="store_true", help="run link_model.py after each backend")
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank raises at the end")
    parser.add_argument("--in-thread", action="store_true", help="--fail-rank raises in a thread")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for backend in args.backend.split(","):
        check_backend(backend, args.tiny_limit)
        print(f"OK {backend} rank {get_communicator(backend).rank}", flush=True)
        if args.link_model:
            run_link_model(backend)
    if args.fail_rank is not None:
        fail_on(args.fail_rank, args.in_thread)


if __name__ == "__main__":
    main()
