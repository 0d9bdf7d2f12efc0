"""Run under mpiexec (2 ranks): the modelled link makes exchanges and all-reduces last as the model says.

Checks on every rank: a blocking exchange lasts at least its modelled cost; work done between
exchange_start and wait hides that time (the sleep in wait is shorter by the work done); a bounded
exchange waits for nothing when the work outlasts its cost and for the remainder when not; an
all-reduce lasts at least the ring cost; the counters add up. Prints OK on success.
"""
import sys
import time

import torch

from hpc_graph.comm import get_communicator, install_abort_handler
from hpc_graph.comm.link import LinkModel

comm = get_communicator(sys.argv[1] if len(sys.argv) > 1 else "mpi")
install_abort_handler(comm)
peer = 1 - comm.rank
link = LinkModel(bandwidth=8e6, latency=2e-3)  # 1 MB/s, 2 ms
comm.set_link(link)
n = 50_000  # 200 KB of float32: 0.2 s + 2 ms
x = torch.full((n,), float(comm.rank))
cost = link.cost(4 * n, 4 * n, 1)

comm.barrier()
t0 = time.perf_counter()
got = comm.exchange({peer: x}, {peer: ((n,), torch.float32)})
blocking = time.perf_counter() - t0
assert torch.equal(got[peer], torch.full((n,), float(peer)))
assert blocking >= cost * 0.999, (blocking, cost)
assert abs(comm.modeled_seconds - cost) < 1e-9, (comm.modeled_seconds, cost)
assert abs(comm.modeled_by_op["exchange"] - cost) < 1e-9 and not comm.modeled_by_op.get("allreduce")

comm.barrier()
slept0 = comm.modeled_wait_seconds
req = comm.exchange_start({peer: x}, {peer: ((n,), torch.float32)})
time.sleep(0.15)  # "compute" overlapping the transfer
t1 = time.perf_counter()
req.wait()
waited = time.perf_counter() - t1
slept = comm.modeled_wait_seconds - slept0
assert waited < cost - 0.1, (waited, cost)  # 0.15 s of the cost was hidden by the work
assert slept <= cost - 0.14, (slept, cost)

# a bounded exchange (receives posted at the start, sizes known only on arrival) is charged from its start:
# work longer than its cost leaves nothing to wait; shorter work leaves the remainder
nb = 4 * n
payload = torch.full((nb,), comm.rank, dtype=torch.uint8)
bcost = link.cost(nb + 8, nb + 8, 1)
for work in (bcost + 0.1, bcost / 2):
    comm.barrier()
    slept0 = comm.modeled_wait_seconds
    req = comm.exchange_start_bounded({peer: payload}, {peer: nb + 100}, channel=3)
    t_work = time.perf_counter()
    while time.perf_counter() - t_work < work:  # "compute", polling the transfer as the minibatch engine does
        req.test()
        time.sleep(0.005)
    want = max(0.0, bcost - (time.perf_counter() - t_work))  # the cost not hidden by the work
    got = req.wait()
    slept = comm.modeled_wait_seconds - slept0
    assert torch.equal(got[peer], torch.full((nb,), peer, dtype=torch.uint8))
    assert want - 0.03 <= slept <= want + 1e-3, (work, slept, want, bcost)
    assert (slept == 0.0) == (work > bcost), (work, slept, bcost)

comm.barrier()
before = comm.modeled_seconds
t2 = time.perf_counter()
comm.allreduce_(torch.ones(n))
reduce_time = time.perf_counter() - t2
ring = link.allreduce_cost(4 * n, 2)
assert reduce_time >= ring * 0.999 and abs(comm.modeled_seconds - before - ring) < 1e-9
assert abs(comm.modeled_by_op["allreduce"] - ring) < 1e-9
assert abs(sum(comm.modeled_wait_by_op.values()) - comm.modeled_wait_seconds) < 1e-9

comm.set_link(None)
t3 = time.perf_counter()
comm.exchange({peer: x}, {peer: ((n,), torch.float32)})
assert time.perf_counter() - t3 < cost  # no model: as fast as shared memory
comm.barrier()
print(f"OK rank {comm.rank}", flush=True)
