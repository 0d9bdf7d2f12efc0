"""The entry point the scripts of tests/mpi/scripts share: ``run(main)`` exits with ``main()``'s status; an
exception on a rank prints its traceback and aborts the whole job, so that the other ranks do not wait in a
collective until the test's timeout."""
from __future__ import annotations

import sys
import traceback
from typing import Callable


def run(main: Callable[[], int | None]) -> None:
    """Run ``main`` and end the process with its status, skipping the interpreter's teardown (a second per
    rank with torch loaded; :func:`hpc_graph.comm.abort.end_process`)."""
    try:
        status = main()
    except Exception:  # noqa: BLE001 - any failure must end every rank
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        from hpc_graph.comm import get_communicator
        get_communicator("mpi").abort(1)
    from hpc_graph.comm.abort import end_process

    end_process(status or 0)
