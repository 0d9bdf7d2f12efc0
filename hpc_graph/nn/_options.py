"""Argument checks of the models (private): a ``ValueError`` naming the ``model.<field>`` config key."""
from __future__ import annotations

import math
from typing import Any


def positive_int(field: str, value: Any) -> int:
    """``value`` as an int >= 1, else ``ValueError("model.<field>: must be a positive integer, got ...")``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"model.{field}: must be a positive integer, got {value!r}")
    return int(value)


def number_in(field: str, value: Any, lo: float, hi: float | None, *, lo_open: bool = False,
              hi_open: bool = False) -> float:
    """``value`` as a float in the interval ``lo .. hi`` (``hi=None``: unbounded), else a ValueError naming it."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok:
        v = float(value)
        ok = (v > lo if lo_open else v >= lo) and (hi is None or (v < hi if hi_open else v <= hi))
    if not ok:
        what = (f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}" if hi is not None
                else f"a number {'>' if lo_open else '>='} {lo:g}")
        raise ValueError(f"model.{field}: must be {what}, got {value!r}")
    return float(value)


def choice(field: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError naming the field and the choices."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"model.{field}: must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value
