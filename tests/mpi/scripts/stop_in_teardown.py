"""Run under ``mpiexec -n P``: every rank finishes (a stop handler installed, as ``hpc-graph`` installs one) and
ends through :func:`hpc_graph.comm.abort.end_process`, while a helper process sends it SIGTERM every millisecond
from just before that call until the rank is gone, its interpreter's teardown included. The job must exit 0."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

SENDER = """
import os, signal, sys, time
pid, end = int(sys.argv[1]), time.time() + 20
print("sending", flush=True)
while time.time() < end and os.getppid() == pid:  # until the rank is gone (this process is then re-parented)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        break
    time.sleep(0.001)
"""

if __name__ == "__main__":
    from hpc_graph.comm import get_communicator
    from hpc_graph.comm.abort import end_process

    signal.signal(signal.SIGTERM, lambda *_: None)
    get_communicator("mpi").barrier()
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(os.getpid())], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    sender.stdout.readline()  # it is sending
    end_process(0)
