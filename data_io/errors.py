"""Errors of the data layer and the atomic-output helper every writer uses.

Every error names the file (and the field when there is one) so that the CLI
can print it as one line.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)


class DataError(Exception):
    """Base class of all expected data errors (bad input, bad output path, full disk)."""


class SettingError(DataError, ValueError):
    """A bad value in an environment setting (``HPC_GRAPH_...``): the message names the variable."""


class FormatError(DataError):
    """A file is not in the expected format: names the file and the field.

    >>> str(FormatError("g.h5", "/graph/indices", "index 7 out of range [0, 5)"))
    'g.h5: /graph/indices: index 7 out of range [0, 5)'
    """

    def __init__(self, path: str | os.PathLike, field: str | None, message: str):
        self.path = str(path)
        self.field = field
        self.message = message
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {message}")


class OutputExistsError(DataError):
    """The output path exists and ``force`` was not given."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(f"{path}: output exists (use --force to overwrite)")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for lack of space (ENOSPC, or EDQUOT: a quota)."""
    return isinstance(exc, OSError) and (exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space" in str(exc))


def check_output(path: str | os.PathLike, force: bool) -> Path:
    """Fail early when ``path`` exists and ``force`` is false; check its folder exists."""
    path = Path(path)
    if path.exists() and not force:
        raise OutputExistsError(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise DataError(f"{path}: folder {parent} does not exist (create it first: mkdir -p {parent})")
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, force: bool = False, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` on success.

    On any exception the temporary file (or directory) is removed, so no partial
    output is ever left at ``path``. An ``OSError`` (a full disk, a permission
    problem) becomes a :class:`DataError` naming ``path``.

    Args:
        path: final output path.
        force: replace an existing ``path``; otherwise :class:`OutputExistsError`.
        directory: create the temporary path as an empty directory.
    """
    path = check_output(path, force)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    if directory:
        tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            if not force:
                raise OutputExistsError(path)
            _remove(path)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        reason = "disk full" if is_disk_full(exc) else str(exc)
        raise DataError(f"{path}: write failed: {reason}") from exc
    except BaseException:
        _remove(tmp)
        raise
