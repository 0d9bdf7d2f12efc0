"""Run a script under ``mpiexec`` from a test, with a hard timeout.

Shared by every multi-rank test in ``tests/mpi/``::

    from _run import run_mpi, SCRIPTS
    run_mpi(SCRIPTS / "comm_ops.py", 4)              # asserts exit status 0
    run_mpi([SCRIPTS / "x.py", "--flag"], 2, timeout=60, env={"FOO": "1"})
    proc = run_mpi(script, 4, check=False)           # expect a failure yourself

A hang is a failure: on timeout the whole process group (launcher and ranks)
is killed and an ``AssertionError`` carrying stdout/stderr is raised. Ranks run
with unbuffered output and decide their threads as a user's ranks would
(``hpc_graph.comm.threads``: one per rank when they share the 2 test cores);
an ``env`` value of ``None`` removes that variable. ``HPC_GRAPH_MPIEXEC`` overrides the launcher command
(e.g. ``"srun --mpi=pmix"``); Open MPI gets ``--oversubscribe`` automatically.
"""
from __future__ import annotations

import functools
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

SCRIPTS = Path(__file__).resolve().parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
_TAIL = 6000  # characters of each stream shown in a failure message


@functools.lru_cache(maxsize=1)
def _launcher() -> list[str]:
    custom = os.environ.get("HPC_GRAPH_MPIEXEC")
    if custom:
        return shlex.split(custom)
    cmd = ["mpiexec"]
    try:
        version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd


def openmpi_launcher() -> list[str]:
    """Open MPI's ``mpiexec`` (Debian's ``mpiexec.openmpi``) with the flags a test box needs, for the
    runs that must use Open MPI (PT-Scotch's ParMETIS API is built against it); the ranks select Open
    MPI in mpi4py themselves (``hpc_graph.comm.env.select_mpi_library``)."""
    import shutil

    exe = os.environ.get("HPC_GRAPH_OPENMPI_MPIEXEC") or shutil.which("mpiexec.openmpi") or shutil.which("orterun")
    if not exe:
        raise AssertionError("Open MPI's mpiexec (mpiexec.openmpi) not found: install openmpi-bin and "
                             "libscotchparmetis-dev (scripts/test.sh does so when run as root on Debian/Ubuntu)")
    # one node: no remote-shell agent is needed (a machine without ssh would otherwise refuse to start)
    cmd = [exe, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "--mca", "plm_rsh_agent", "false"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd += ["--allow-run-as-root"]
    return cmd


def _command(script_or_args, nprocs: int, launcher: Sequence[str] | None = None) -> list[str]:
    if isinstance(script_or_args, (str, os.PathLike)):
        args = [os.fspath(script_or_args)]
    else:
        args = [os.fspath(a) for a in script_or_args]
    if not args:
        raise ValueError("run_mpi: empty command")
    if args[0].endswith(".py") or args[0] == "-m" or args[0] == "-c":
        args = [sys.executable] + args
    return list(launcher or _launcher()) + ["-n", str(int(nprocs))] + args


def _tail(text: str) -> str:
    text = text or ""
    return text if len(text) <= _TAIL else "...\n" + text[-_TAIL:]


def _as_text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run_mpi(script_or_args: str | os.PathLike | Sequence[str | os.PathLike], nprocs: int,
            timeout: float = 120, env: Mapping[str, str | None] | None = None, *,
            check: bool = True, cwd: str | os.PathLike | None = None,
            launcher: Sequence[str] | None = None) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n nprocs`` on a Python script (or a full argument list).

    ``script_or_args``: a ``.py`` path, or a list whose first item is a ``.py``
    path (run with this interpreter) or a program. ``env`` entries are added to
    (``None``: removed from) a copy of the current environment. ``timeout`` is in seconds. Returns the
    ``CompletedProcess`` (text stdout/stderr, plus ``.elapsed`` seconds); raises
    ``AssertionError`` with both streams on timeout, or on a non-zero exit
    status when ``check`` is true. ``launcher`` replaces the default ``mpiexec`` command
    (e.g. :func:`openmpi_launcher`).
    """
    cmd = _command(script_or_args, nprocs, launcher)
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    path = full_env.get("PYTHONPATH", "")
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), path) if p)
    if env:
        if any(k in env for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")):
            # a thread variable the test sets must count as the user's, not as one this process exported
            full_env.pop("HPC_GRAPH_EXPORTED_THREADS", None)
        for k, v in env.items():
            if v is None:
                full_env.pop(k, None)
            else:
                full_env[k] = str(v)

    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        out, err = proc.communicate()
        out = out or _as_text(exc.stdout)
        err = err or _as_text(exc.stderr)
        raise AssertionError(
            f"run_mpi: timed out after {timeout:.0f} s (a hang is a failure): {shlex.join(cmd)}\n"
            f"--- stdout ---\n{_tail(out)}\n--- stderr ---\n{_tail(err)}") from None
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    elapsed = time.monotonic() - start
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    result.elapsed = elapsed
    if check and proc.returncode != 0:
        raise AssertionError(
            f"run_mpi: exit status {proc.returncode} after {elapsed:.1f} s: {shlex.join(cmd)}\n"
            f"--- stdout ---\n{_tail(out)}\n--- stderr ---\n{_tail(err)}")
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the launcher's whole process group (ranks included)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
