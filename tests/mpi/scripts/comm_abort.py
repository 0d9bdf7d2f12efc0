"""Rank ``--fail-rank`` raises while the other ranks wait in a collective.

Usage: mpiexec -n N python comm_abort.py [--fail-rank R] [--in-thread] [--backend mpi|torch]

With the abort handler installed the job must end quickly with a non-zero
status and the failing rank named on stderr; without it, the other ranks
would block in ``allreduce_`` forever.
"""
import argparse
import logging
import threading

import torch

from hpc_graph.comm import get_communicator, install_abort_handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=2)
    parser.add_argument("--in-thread", action="store_true")
    parser.add_argument("--backend", default="mpi")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    comm = get_communicator(args.backend)
    install_abort_handler(comm)
    comm.barrier()
    if comm.rank == args.fail_rank:
        def fail():
            raise ValueError(f"deliberate failure on rank {comm.rank}")
        if args.in_thread:
            worker = threading.Thread(target=fail, name="worker")
            worker.start()
            worker.join()
            comm.allreduce_(torch.ones(3))  # the thread's abort must end this rank too
        else:
            fail()
    comm.allreduce_(torch.ones(3))  # the other ranks block here until aborted
    print(f"rank {comm.rank} was not aborted", flush=True)


if __name__ == "__main__":
    main()
