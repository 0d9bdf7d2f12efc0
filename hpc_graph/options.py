"""Typed, documented option fields: what a config field may hold, how it is checked, how it is described.

One field is a dataclass field whose metadata holds its validation spec (a small dict: ``{"kind": "int",
"lo": 1, ...}``) and its help text; :func:`check_value` checks a value against a spec and raises
:class:`ConfigError` naming the field. The training config (:mod:`hpc_graph.train.config`), each engine's
options (``Engine.Options``, :mod:`hpc_graph.engines`) and the generated reference
(``docs/configuration.md``) are built from such fields, so a field is declared once, next to the code
that uses it. No torch here: the CLI validates configs before torch is imported.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

BIT_WIDTHS = (1, 2, 4, 8, 32)


class ConfigError(ValueError):
    """An invalid configuration; the message names the field (``section.key: problem``)."""


def int_spec(lo: int | None = None, optional: bool = False, hi: int | None = None):
    return {"kind": "int", "lo": lo, "optional": optional, "hi": hi}


def float_spec(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False):
    return {"kind": "float", "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open}


def choice_spec(*choices: str):
    return {"kind": "choice", "choices": choices}


def only_engines(spec: dict, *engines: str) -> dict:
    """``spec`` of a field that only the named engines use (setting it for another engine is an error)."""
    return {**spec, "engines": engines}


def only_models(spec: dict, *models: str) -> dict:
    """``spec`` of a model field that only the named models use (setting it for another model is an error)."""
    return {**spec, "models": models}


BOOL = {"kind": "bool"}
BITS = {"kind": "bits"}
BANDWIDTH = {"kind": "bandwidth"}
LATENCY = {"kind": "latency"}
FANOUTS = {"kind": "fanouts"}
LAYER_LIST = {"kind": "layer_list"}
CLUSTER_BETA = {"kind": "cluster_beta"}
PATH = {"kind": "path"}
OPT_PATH = {"kind": "path", "optional": True}


def option(default: Any, spec: dict, help: str, *, section: str | None = None) -> Any:  # noqa: A002
    """A dataclass field whose metadata holds its validation ``spec`` and its ``help`` text (docs).

    ``section``: for an engine's options, the config section the field is read from (``engine``, or
    ``sampler``/``hec`` for the sampling engines' historical sections); ``None`` elsewhere."""
    meta = {**spec, "help": help}
    if section is not None:
        meta["section"] = section
    return dataclasses.field(default=default, metadata=meta)



def fmt_number(x: float) -> str:
    return f"{x:g}"


def check_value(where: str, value: Any, spec: dict) -> Any:
    """Return ``value`` converted to the field's type or raise ConfigError naming ``where``."""
    kind = spec["kind"]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if kind == "int":
        if value is None and spec.get("optional"):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            what = {1: "a positive integer", 0: "a non-negative integer"}.get(spec["lo"], "an integer")
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        if spec["lo"] is not None and value < spec["lo"]:
            what = {1: "a positive integer", 0: "a non-negative integer"}.get(spec["lo"], f"an integer >= {spec['lo']}")
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        if spec.get("hi") is not None and value > spec["hi"]:
            raise ConfigError(f"{where}: must be at most {spec['hi']}, got {value!r}")
        return value
    if kind == "float":
        lo, hi = spec["lo"], spec["hi"]
        if lo is not None and hi is not None:
            what = (f"a number in {'(' if spec['lo_open'] else '['}{fmt_number(lo)}, "
                    f"{fmt_number(hi)}{')' if spec['hi_open'] else ']'}")
        elif lo is not None:
            what = ("a positive number" if lo == 0 and spec["lo_open"]
                    else "a non-negative number" if lo == 0 else f"a number >= {fmt_number(lo)}")
        else:
            what = "a number"
        num = value
        if isinstance(value, str):  # YAML reads 5e-4 (no dot) as a string
            try:
                num = float(value)
            except ValueError:
                raise ConfigError(f"{where}: must be {what}, got {value!r}") from None
        if isinstance(num, bool) or not isinstance(num, (int, float)) or not math.isfinite(num):
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        num = float(num)
        bad = ((lo is not None and (num < lo or (spec["lo_open"] and num == lo)))
               or (hi is not None and (num > hi or (spec["hi_open"] and num == hi))))
        if bad:
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        return num
    if kind == "choice":
        if isinstance(value, bool) and {"on", "off"} <= set(spec["choices"]):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if not isinstance(value, str) or value not in spec["choices"]:
            choices = ", ".join(repr(c) for c in spec["choices"])
            raise ConfigError(f"{where}: must be one of {choices}, got {value!r}")
        return value
    if kind == "bits":
        text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        if text == "auto":
            return "auto"
        if text is not None and text.isdigit() and int(text) in BIT_WIDTHS:
            return int(text)
        raise ConfigError(f"{where}: must be one of 'auto', {', '.join(map(str, BIT_WIDTHS))}, got {value!r}")
    if kind == "cluster_beta":
        if value is None or value == "auto":
            return value
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ConfigError(f"{where}: must be null, 'auto' or a number in [0, 1], got {value!r}")
        return float(value)
    if kind == "layer_list":
        items = list(value) if isinstance(value, (list, tuple)) else None
        if items is None or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in items):
            raise ConfigError(f"{where}: must be a list of layer indices (integers >= 0), got {value!r}")
        return tuple(items)
    if kind == "fanouts":
        items = list(value) if isinstance(value, (list, tuple)) else None
        if not items or any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1) for v in items):
            raise ConfigError(f"{where}: must be a non-empty list of positive integers (or -1 for all "
                              f"neighbours), got {value!r}")
        return tuple(items)
    if kind in ("bandwidth", "latency"):
        from hpc_graph.comm.link import parse_bandwidth, parse_latency

        try:
            (parse_bandwidth if kind == "bandwidth" else parse_latency)(value, where)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return value
    if kind == "path":
        if value is None:
            if spec.get("optional"):
                return None
            raise ConfigError(f"{where}: required (a path), but not given")
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: must be a non-empty path string, got {value!r}")
        return value
    raise AssertionError(f"unknown field kind {kind}")


def type_name(spec: dict) -> str:
    return {"int": "integer", "float": "number", "bool": "boolean", "choice": "string",
            "path": "path", "bits": "integer or string", "bandwidth": "number, string or null",
            "latency": "number or string", "fanouts": "list of integers",
            "layer_list": "list of integers", "cluster_beta": "number, string or null"}[spec["kind"]] + \
        (" or null" if spec.get("optional") else "")


def allowed_text(spec: dict) -> str:
    kind = spec["kind"]
    if kind == "choice":
        return ", ".join(f"`{c}`" for c in spec["choices"])
    if kind == "bits":
        return "`auto`, " + ", ".join(f"`{b}`" for b in BIT_WIDTHS)
    if kind == "bandwidth":
        return ">= 0 bits/s, or with a unit"
    if kind == "fanouts":
        return "each >= 1, or -1"
    if kind == "latency":
        return ">= 0 s, or with a unit"
    if kind == "cluster_beta":
        return "`null`, `auto`, [0, 1]"
    if kind == "bool":
        return "`true`, `false`"
    if kind == "int":
        text = "any" if spec["lo"] is None else f">= {spec['lo']}"
        if spec.get("hi") is not None:
            text = f"{spec['lo']}..{spec['hi']}" if spec["lo"] is not None else f"<= {spec['hi']}"
        return text + (" or null" if spec.get("optional") else "")
    if kind == "float":
        lo, hi = spec["lo"], spec["hi"]
        if lo is not None and hi is not None:
            return (f"{'(' if spec['lo_open'] else '['}{fmt_number(lo)}, "
                    f"{fmt_number(hi)}{')' if spec['hi_open'] else ']'}")
        if lo is not None:
            return f"{'>' if spec['lo_open'] else '>='} {fmt_number(lo)}"
        return "any finite number"
    if kind == "layer_list":
        return "layer indices < `model.num_layers`"
    return "a non-empty path" + (" or null" if spec.get("optional") else "")


def default_text(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{fmt_number(value)}`"
    return f"`{value}`"
