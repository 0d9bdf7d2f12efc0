"""Abort-on-error: an uncaught exception on any rank ends the whole job.

Without this, a rank that dies leaves its peers blocked in a collective
until the batch system's wall-time limit. :func:`install_abort_handler`
replaces ``sys.excepthook`` and ``threading.excepthook``: the exception is
logged at ERROR as ``rank R: <type>: <message>`` with its traceback, then
``comm.abort(1)`` (``MPI_Abort``) brings every rank down within seconds. In a
single-process job the previous hooks run as usual and Python exits normally.
"""
from __future__ import annotations

import logging
import sys
import threading
import traceback
from typing import Any, NoReturn

log = logging.getLogger(__name__)

#: seconds between the last flush of a rank's output and MPI_Abort (the launcher forwards the lines first);
#: here, beside the abort, so that a signal handler can read it without importing the torch-based communicator
ABORT_GRACE_S = 1.0


def _report(comm: Any, exc_type: type, exc: BaseException, tb: Any, thread: str | None = None) -> None:
    """Log ``rank R: Type: message`` with the traceback (straight to stderr if logging is unset)."""
    where = f"rank {getattr(comm, 'rank', '?')}" + (f" (thread {thread!r})" if thread else "")
    message = f"{where}: {exc_type.__name__}: {exc}"
    if logging.getLogger().handlers:
        log.error(message, exc_info=(exc_type, exc, tb))
        return
    try:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"ERROR {__name__}: {message}\n{text}")
        sys.stderr.flush()
    except Exception:  # stderr closed: nothing left to report to
        pass


def install_abort_handler(comm: Any) -> None:
    """Make any uncaught exception (main thread or any other thread) abort the whole job.

    Args:
        comm: a :class:`~hpc_graph.comm.Communicator`; its ``abort(1)`` is called
            when ``comm.size > 1``. ``KeyboardInterrupt`` is treated the same way
            in a multi-rank job (exit status 130 is not propagated by MPI_Abort).
    Calling it again replaces the communicator used.
    """
    previous_sys = getattr(sys.excepthook, "_hpc_graph_previous", sys.excepthook)
    previous_thread = getattr(threading.excepthook, "_hpc_graph_previous", threading.excepthook)

    def sys_hook(exc_type, exc, tb):
        if getattr(comm, "size", 1) > 1:
            _report(comm, exc_type, exc, tb)
            comm.abort(1)
        previous_sys(exc_type, exc, tb)

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return previous_thread(args)
        if getattr(comm, "size", 1) > 1:
            name = args.thread.name if args.thread is not None else "?"
            _report(comm, args.exc_type, args.exc_value, args.exc_traceback, thread=name)
            comm.abort(1)
        return previous_thread(args)

    sys_hook._hpc_graph_previous = previous_sys
    thread_hook._hpc_graph_previous = previous_thread
    sys.excepthook = sys_hook
    threading.excepthook = thread_hook


def mpi_ready() -> bool:
    """Whether MPI is initialized, and not finalized, in this process (False while mpi4py is still loading)."""
    mpi = sys.modules.get("mpi4py.MPI")
    up, down = getattr(mpi, "Is_initialized", None), getattr(mpi, "Is_finalized", None)
    try:
        return bool(up is not None and down is not None and up() and not down())
    except Exception:  # a library half loaded: not ready
        return False


def end_process(status: int) -> NoReturn:
    """Exit with ``status`` as quickly as is safe. A process without MPI exits after what a normal exit runs first
    (non-daemon threads joined, ``atexit`` handlers, log handlers) but without the interpreter's module teardown,
    which takes about a second once torch is loaded. An MPI rank exits the normal way (its launcher expects
    ``MPI_Finalize`` at the very end: a rank that left at once after it was, now and then, killed by MPICH's
    launcher, exit code 9), with the garbage collector frozen, which halves the teardown, and with SIGTERM,
    SIGUSR1 and SIGINT ignored: the interpreter gives a signal with a Python handler its default action back
    early in its teardown (one it ignores stays ignored), so a batch system's stop arriving then would
    otherwise end a finished job with the signal's status instead of ``status``. For the end of a command-line
    process only; never call it from a library."""
    import atexit
    import gc
    import os
    import signal

    if mpi_ready():
        gc.freeze()  # the teardown then leaves the long-lived objects alone
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
                signal.signal(s, signal.SIG_IGN)
        sys.exit(status)
    try:
        main = threading.main_thread()
        for t in threading.enumerate():
            if t is not main and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream: nothing left to write
                pass
        os._exit(int(status))
