"""``hpc-graph warmup [--jobs N] [--manifest FILE]``: compile the CPU kernels into numba's cache, in parallel.

numba compiles each kernel at its first use after an install, on every rank that reaches it first: the first
job of a fresh install spends minutes compiling the same code on all its ranks. This command compiles every
specialisation in the manifest (``numba_kernels/specialisations.tsv``: the training paths of every engine and
the test suite) once, one kernel per process, ``N`` processes at a time, into the cache later processes load
from (``__pycache__`` beside the kernels, or ``NUMBA_CACHE_DIR``). With a warm cache it only loads them (a few
seconds). The job scripts and the test command run it before launching. See :mod:`numba_kernels.warm`.
"""
from __future__ import annotations

from hpc_graph.cli import CLIError

#: the CLI leaves the thread decision to this command: compiling runs one thread per worker process
CONFIGURES_THREADS = True


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "warmup", help="compile the CPU kernels into numba's on-disk cache before the first job",
        description="Compile every kernel specialisation listed in the manifest into numba's on-disk cache, "
                    "one kernel per worker process, the slowest first; those already cached are only loaded.")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes (default: the CPUs this process may run on)")
    p.add_argument("--manifest", default=None, metavar="FILE",
                   help="specialisations to compile (default: the shipped numba_kernels/specialisations.tsv; "
                        "format in numba_kernels/warm.py)")
    p.set_defaults(func=run)


def run(args) -> int:
    from numba_kernels.warm import MANIFEST, ManifestError, read_manifest, warm

    if args.jobs is not None and args.jobs < 1:
        raise CLIError(f"--jobs: must be >= 1, got {args.jobs}")
    path = args.manifest or MANIFEST
    try:
        specs = read_manifest(path)
    except OSError as exc:
        raise CLIError(f"--manifest {path}: cannot read it ({exc.strerror or exc})") from None
    except ManifestError as exc:
        raise CLIError(str(exc)) from None
    last = [0.0]
    say = not args.quiet  # -q: nothing but errors

    def progress(done: int, total: int, kernel: str, seconds: float) -> None:
        if say and (done == total or seconds - last[0] >= 10):  # a line every 10 s at most: minutes in all
            last[0] = seconds
            print(f"[warmup] {done}/{total} kernels ({seconds:.0f} s; last {kernel})", flush=True)

    if say:
        print(f"[warmup] {len(specs)} specialisations from {path}", flush=True)
    try:
        report = warm(specs, jobs=args.jobs, progress=progress)
    except ManifestError as exc:
        raise CLIError(str(exc)) from None
    if say:
        print(f"[warmup] {report.compiled} compiled, {report.loaded} already in the cache, {report.kernels} kernels, "
              f"{report.jobs} process(es), {report.seconds:.1f} s; cache: {report.cache_dir or 'n/a'}")
    return 0
