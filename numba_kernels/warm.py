"""Compile the CPU kernels before they are needed: numba's on-disk cache filled once, in parallel.

numba compiles a kernel for each combination of argument types it is called with (its *specialisations*:
float32 or float64 values, int32 or int64 indices, ...) at the first such call, and keeps the machine code in
its on-disk cache (``__pycache__`` beside the kernel's source, or ``NUMBA_CACHE_DIR``). After an install the
cache is empty, so the first job compiles every kernel it uses, minutes in all, on every rank that calls it
first, with the cores busy compiling the same code side by side.

:func:`warm` compiles the specialisations listed in a manifest (:data:`MANIFEST`, the shipped one covers the
training paths of every engine and the test suite) up front, one kernel per worker process at a time, the
slowest first, so a machine with ``P`` cores compiles them in about ``1/P`` of the time; specialisations
already in the cache are only loaded. ``hpc-graph warmup`` runs it; the job scripts and the test command
call it before launching.

The manifest is a text file, one specialisation per line::

    numba_kernels.cpu.spmm._spmm_sum<TAB>2.61<TAB>(Array(int64, 1, 'C', False, aligned=True), int64, ...)

the kernel (module and function), the seconds its compilation took when recorded (to start the slowest
first) and the argument types as numba writes them (``str`` of the signature tuple). ``#`` starts a comment.
:func:`install_recorder` records them: ``scripts/record_kernel_specialisations.py`` runs a command (the
test suite, a training run) with it in every process and writes the manifest.

No torch and no MPI here.
"""
from __future__ import annotations

import ast
import importlib
import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

log = logging.getLogger(__name__)

#: the specialisations the shipped warm-up compiles
MANIFEST = Path(__file__).with_name("specialisations.tsv")


class ManifestError(ValueError):
    """A manifest line that names no kernel, or argument types that cannot be read; the message names the
    file and line."""


@dataclass(frozen=True)
class Specialisation:
    """One line of a manifest: ``kernel`` (``module.function``), ``seconds`` (its recorded compile time) and
    ``args`` (the argument types as text)."""

    kernel: str
    seconds: float
    args: str
    where: str = ""  # "FILE:LINE", for messages


@dataclass
class WarmReport:
    """What :func:`warm` did: specialisations ``compiled`` and ``loaded`` (already cached), kernels, worker
    processes, wall seconds, and the cache folder of the first kernel."""

    compiled: int
    loaded: int
    kernels: int
    jobs: int
    seconds: float
    cache_dir: str


# ---------------------------------------------------------------- argument types as text

def _types_namespace() -> dict:
    from numba.core import types

    names = {n: getattr(types, n) for n in (
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64",
        "complex64", "complex128", "intp", "uintp", "none", "boolean")}
    names["bool"] = types.boolean  # str(types.boolean) is "bool"
    names["Array"] = types.Array
    names["UniTuple"] = types.UniTuple
    names["Tuple"] = types.Tuple
    names["Omitted"] = types.Omitted
    return names


def parse_signature(text: str) -> tuple:
    """The numba argument types written as ``str(signature_tuple)``: ``"(Array(int64, 1, 'C', False,
    aligned=True), float32)"`` -> ``(types.Array(...), types.float32)``. Only type names, their calls and
    constants are read (no ``eval``); anything else raises ``ValueError``."""
    names = _types_namespace()

    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"unknown type {node.id!r}")
            return names[node.id]
        if isinstance(node, ast.Tuple):
            return tuple(value(e) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            return names[node.func.id](*[value(a) for a in node.args],
                                       **{k.arg: value(k.value) for k in node.keywords})
        raise ValueError(f"cannot read {ast.dump(node)[:80]}")

    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a signature: {exc.msg}") from None
    sig = value(tree)
    if not isinstance(sig, tuple):
        sig = (sig,)
    return sig


# ---------------------------------------------------------------- the manifest

def read_manifest(path: str | os.PathLike = MANIFEST) -> list[Specialisation]:
    """The specialisations listed in ``path`` (format in the module docstring), in file order, duplicates
    dropped. Raises :class:`ManifestError` naming ``FILE:LINE`` for a malformed line and ``OSError`` when
    the file cannot be read."""
    path = Path(path)
    out, seen = [], set()
    for no, line in enumerate(path.read_text().splitlines(), 1):
        line = line.rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{no}"
        parts = line.split("\t")
        if len(parts) != 3:
            raise ManifestError(f"{where}: expected KERNEL<TAB>SECONDS<TAB>ARGUMENT_TYPES, got {line[:80]!r}")
        kernel, seconds, args = (p.strip() for p in parts)
        if "." not in kernel:
            raise ManifestError(f"{where}: {kernel!r} is not MODULE.FUNCTION")
        try:
            sec = float(seconds)
        except ValueError:
            raise ManifestError(f"{where}: compile seconds {seconds!r} is not a number") from None
        if (kernel, args) in seen:
            continue
        seen.add((kernel, args))
        out.append(Specialisation(kernel, sec, args, where))
    return out


def write_manifest(path: str | os.PathLike, specs: Sequence[Specialisation], header: str = "") -> None:
    """Write ``specs`` to ``path`` sorted by kernel and argument types (stable diffs), written whole or not at
    all (a temporary file renamed over it)."""
    path = Path(path)
    lines = [f"# {h}" for h in header.splitlines()] if header else []
    for s in sorted(specs, key=lambda s: (s.kernel, s.args)):
        lines.append(f"{s.kernel}\t{s.seconds:.2f}\t{s.args}")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def resolve(kernel: str):
    """The numba dispatcher ``kernel`` (``module.function``) names; ``ValueError`` when it names none."""
    module, _, func = kernel.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"no kernel {kernel!r} ({exc})") from None
    if not hasattr(obj, "py_func") or not hasattr(obj, "compile"):
        raise ValueError(f"{kernel!r} is not a numba-compiled function")
    return obj


def check_manifest(specs: Sequence[Specialisation]) -> None:
    """Resolve every kernel and read every signature (nothing compiled): :class:`ManifestError` at the first
    line that names no cached kernel or whose types cannot be read or do not fit the function's arguments."""
    import inspect

    for s in specs:
        try:
            disp = resolve(s.kernel)
            sig = parse_signature(s.args)
        except ValueError as exc:
            raise ManifestError(f"{s.where}: {exc}") from None
        if not getattr(disp, "_cache", None) or type(disp._cache).__name__ == "NullCache":
            raise ManifestError(f"{s.where}: {s.kernel} is not compiled with cache=True: warming it keeps nothing")
        params = inspect.signature(disp.py_func).parameters.values()
        required = sum(p.default is p.empty for p in params)
        if not required <= len(sig) <= len(params):
            raise ManifestError(f"{s.where}: {s.kernel} takes {required}..{len(params)} arguments, the line "
                                f"gives {len(sig)}")


# ---------------------------------------------------------------- compiling

def _compile_kernel(kernel: str, arg_texts: list[str]) -> tuple[str, int, int, str]:
    """In a worker: compile (or load from the cache) every listed specialisation of one kernel. Returns
    ``(kernel, compiled, loaded, cache_dir)``."""
    disp = resolve(kernel)
    compiled = loaded = 0

    def hits() -> int:  # numba's per-signature cache-hit counter (internal: without it, all count as compiled)
        return sum(getattr(disp, "_cache_hits", {}).values())

    for text in arg_texts:
        sig = parse_signature(text)
        before = hits()
        disp.compile(sig)
        if hits() > before:
            loaded += 1
        else:
            compiled += 1
    return kernel, compiled, loaded, str(getattr(disp._cache, "_cache_path", ""))


def _groups(specs: Sequence[Specialisation]) -> list[tuple[str, list[str], float]]:
    """One task per kernel (two processes never save one kernel's cache index at once: the index is
    rewritten whole, so one save would drop the other's entry), the slowest first."""
    by: dict[str, tuple[list[str], list[float]]] = {}
    for s in specs:
        args, secs = by.setdefault(s.kernel, ([], []))
        args.append(s.args)
        secs.append(s.seconds)
    return sorted(((k, a, sum(t)) for k, (a, t) in by.items()), key=lambda g: -g[2])


def default_jobs() -> int:
    """Worker processes: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def warm(specs: Sequence[Specialisation] | None = None, jobs: int | None = None,
         progress: Callable[[int, int, str, float], None] | None = None) -> WarmReport:
    """Compile ``specs`` (default: the shipped :data:`MANIFEST`) into numba's on-disk cache with ``jobs``
    worker processes (default: :func:`default_jobs`), each kernel's specialisations in one worker, the
    kernels with the longest recorded compile time first. ``progress(done, total, kernel, seconds)`` is
    called as each kernel finishes. The manifest is checked first (:func:`check_manifest`); a kernel whose
    compilation fails raises its error."""
    t0 = time.perf_counter()
    specs = read_manifest() if specs is None else list(specs)
    check_manifest(specs)
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    groups = _groups(specs)
    compiled = loaded = 0
    cache_dir = ""
    if not groups:
        return WarmReport(0, 0, 0, jobs, time.perf_counter() - t0, "")
    if jobs == 1:
        results = []
        for i, (k, a, _) in enumerate(groups, 1):
            results.append(_compile_kernel(k, a))
            if progress:
                progress(i, len(groups), k, time.perf_counter() - t0)
    else:
        import multiprocessing

        # spawn: a worker starts clean (no threads or locks inherited from a caller that already ran numba)
        ctx = multiprocessing.get_context("spawn")
        results = []
        with ProcessPoolExecutor(max_workers=min(jobs, len(groups)), mp_context=ctx) as pool:
            pending = {pool.submit(_compile_kernel, k, a) for k, a, _ in groups}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    results.append(fut.result())
                    if progress:
                        progress(len(results), len(groups), results[-1][0], time.perf_counter() - t0)
    for _, c, lo, d in results:
        compiled += c
        loaded += lo
        cache_dir = cache_dir or d
    report = WarmReport(compiled, loaded, len(groups), jobs, time.perf_counter() - t0, cache_dir)
    log.info("warm-up: %d specialisations of %d kernels, %d compiled, %d loaded from the cache, %.1f s, %d "
             "processes", compiled + loaded, len(groups), compiled, loaded, report.seconds, jobs)
    return report


# ---------------------------------------------------------------- recording

def install_recorder(path: str | os.PathLike) -> None:
    """Append a manifest line to ``path`` for every specialisation this process compiles from now on (not
    for those loaded from the cache): kernel, compile seconds, argument types. Compilations nested in another
    (a kernel calling a kernel) are part of the outer one and not listed. Several processes may append to
    one file."""
    import threading

    from numba.core import event

    path = str(path)
    state = threading.local()

    class _Recorder(event.Listener):
        def on_start(self, ev):
            depth = getattr(state, "depth", 0)
            state.depth = depth + 1
            if depth == 0:
                state.t0 = time.perf_counter()

        def on_end(self, ev):
            state.depth -= 1
            if state.depth:
                return
            data = ev.data or {}
            func = getattr(data.get("dispatcher"), "py_func", None)
            if func is None or data.get("args") is None:
                return
            line = (f"{func.__module__}.{func.__qualname__}\t{time.perf_counter() - state.t0:.2f}\t"
                    f"{tuple(data['args'])}\n")
            with open(path, "a") as fh:  # one short write per line: appends from processes do not mix
                fh.write(line)

    event.register("numba:compile", _Recorder())
