"""Training configuration: dataclasses, YAML loading, ``key=value`` overrides and validation.

A config file has up to five sections, each optional except ``data.path``::

    data:   {path: data/cora.h5, feature_norm: row, feature_layout: auto}
    engine: {name: single, prefetch: true}
    model:  {name: gcn, hidden: 16, num_layers: 2, dropout: 0.5}
    optim:  {name: adam, lr: 0.01, weight_decay: 5.0e-4}
    train:  {epochs: 200, seed: 0, eval_every: 1, run_dir: runs/cora-gcn}

Every field is checked (type, range, choice) and every error is one
:class:`ConfigError` line naming the field, e.g.
``model.hidden: must be a positive integer, got -3``. Unknown sections and keys
are rejected by name. Relative ``data.path``/``train.run_dir`` are relative to
the current directory (not to the config file).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable

import yaml

ENGINE_NAMES = ("auto", "single", "dp", "sar")


class ConfigError(ValueError):
    """An invalid configuration; the message names the field (``section.key: problem``)."""


def _int(lo: int | None = None):
    return {"kind": "int", "lo": lo}


def _float(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False):
    return {"kind": "float", "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open}


def _choice(*choices: str):
    return {"kind": "choice", "choices": choices}


_BOOL = {"kind": "bool"}
_PATH = {"kind": "path"}
_OPT_PATH = {"kind": "path", "optional": True}


@dataclasses.dataclass
class DataConfig:
    """``path``: a dataset file (single) or partition directory (dp, sar); ``feature_norm``: none|row
    (divide each node's features by their sum); ``feature_layout``: dense|sparse|auto (auto: sparse CSR
    when at most 10% of this rank's feature entries are non-zero, e.g. bag-of-words features)."""
    path: str | None = dataclasses.field(default=None, metadata=_PATH)
    feature_norm: str = dataclasses.field(default="none", metadata=_choice("none", "row"))
    feature_layout: str = dataclasses.field(default="auto", metadata=_choice("auto", "dense", "sparse"))


@dataclasses.dataclass
class EngineConfig:
    """``name``: auto|single|dp|sar (auto: single on one process, dp under a launcher with several ranks);
    ``prefetch``: SAR prefetches the next remote block while aggregating the current one."""
    name: str = dataclasses.field(default="auto", metadata=_choice(*ENGINE_NAMES))
    prefetch: bool = dataclasses.field(default=True, metadata=_BOOL)


@dataclasses.dataclass
class ModelConfig:
    """See :func:`hpc_graph.nn.build_model`; ``hidden`` is per head for GAT."""
    name: str = dataclasses.field(default="gcn", metadata=_choice("gcn", "sage", "gat"))
    hidden: int = dataclasses.field(default=16, metadata=_int(1))
    num_layers: int = dataclasses.field(default=2, metadata=_int(1))
    dropout: float = dataclasses.field(default=0.5, metadata=_float(0.0, 1.0, hi_open=True))
    heads: int = dataclasses.field(default=8, metadata=_int(1))
    out_heads: int = dataclasses.field(default=1, metadata=_int(1))
    attn_dropout: float = dataclasses.field(default=0.0, metadata=_float(0.0, 1.0, hi_open=True))
    residual: bool = dataclasses.field(default=False, metadata=_BOOL)
    batchnorm: bool = dataclasses.field(default=False, metadata=_BOOL)


@dataclasses.dataclass
class OptimConfig:
    """Optimiser (adam|sgd) and learning-rate schedule (none|step|cosine).

    ``step``: multiply lr by ``gamma`` every ``step_size`` epochs; ``cosine``: anneal to 0 over all epochs.
    ``momentum`` is used by sgd only."""
    name: str = dataclasses.field(default="adam", metadata=_choice("adam", "sgd"))
    lr: float = dataclasses.field(default=0.01, metadata=_float(0.0, lo_open=True))
    weight_decay: float = dataclasses.field(default=5e-4, metadata=_float(0.0))
    momentum: float = dataclasses.field(default=0.0, metadata=_float(0.0, 1.0, hi_open=True))
    schedule: str = dataclasses.field(default="none", metadata=_choice("none", "step", "cosine"))
    step_size: int = dataclasses.field(default=50, metadata=_int(1))
    gamma: float = dataclasses.field(default=0.5, metadata=_float(0.0, 1.0, lo_open=True))


@dataclasses.dataclass
class TrainConfig:
    """Loop settings. ``run_dir`` (default ``runs/<date-time>``) receives metrics and summary.json;
    ``checkpoint_every`` (epochs, 0 = never) is stored for the checkpoint feature."""
    epochs: int = dataclasses.field(default=200, metadata=_int(1))
    seed: int = dataclasses.field(default=0, metadata=_int(0))
    eval_every: int = dataclasses.field(default=1, metadata=_int(1))
    device: str = dataclasses.field(default="cpu", metadata=_choice("cpu", "cuda"))
    dtype: str = dataclasses.field(default="float32", metadata=_choice("float32", "float64"))
    comm_backend: str = dataclasses.field(default="mpi", metadata=_choice("mpi", "torch"))
    run_dir: str | None = dataclasses.field(default=None, metadata=_OPT_PATH)
    checkpoint_every: int = dataclasses.field(default=0, metadata=_int(0))
    progress: bool = dataclasses.field(default=True, metadata=_BOOL)


@dataclasses.dataclass
class Config:
    """The whole training configuration."""
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)


SECTIONS: dict[str, type] = {"data": DataConfig, "engine": EngineConfig, "model": ModelConfig,
                             "optim": OptimConfig, "train": TrainConfig}


# -- validation ----------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return f"{x:g}"


def _check_value(where: str, value: Any, spec: dict) -> Any:
    """Return ``value`` converted to the field's type or raise ConfigError naming ``where``."""
    kind = spec["kind"]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            what = {1: "a positive integer", 0: "a non-negative integer"}.get(spec["lo"], "an integer")
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        if spec["lo"] is not None and value < spec["lo"]:
            what = {1: "a positive integer", 0: "a non-negative integer"}.get(spec["lo"], f"an integer >= {spec['lo']}")
            raise ConfigError(f"{where}: must be {what}, got {value!r}")
        return value
    if kind == "float":
        lo, hi = spec["lo"], spec["hi"]
        if lo is not None and hi is not None:
            what = f"a number in {'(' if spec['lo_open'] else '['}{_fmt(lo)}, {_fmt(hi)}{')' if spec['hi_open'] else ']'}"
        elif lo is not None:
            what = ("a positive number" if lo == 0 and spec["lo_open"]
                    else "a non-negative number" if lo == 0 else f"a number >= {_fmt(lo)}")
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
        if not isinstance(value, str) or value not in spec["choices"]:
            choices = ", ".join(repr(c) for c in spec["choices"])
            raise ConfigError(f"{where}: must be one of {choices}, got {value!r}")
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


def _section_from_dict(name: str, raw: Any) -> Any:
    cls = SECTIONS[name]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: must be a mapping of keys to values, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            raise ConfigError(f"{name}.{key}: unknown key (known: {', '.join(fields)})")
    values = {}
    for fname, f in fields.items():
        value = raw[fname] if fname in raw else getattr(cls(), fname)
        values[fname] = _check_value(f"{name}.{fname}", value, f.metadata)
    return cls(**values)


def config_from_dict(raw: Any) -> Config:
    """Build and validate a :class:`Config` from nested dicts (as read from YAML)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config: must be a mapping with sections {', '.join(SECTIONS)}, got {raw!r}")
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(SECTIONS)})")
    return Config(**{name: _section_from_dict(name, raw.get(name)) for name in SECTIONS})


def validate_config(config: Config) -> Config:
    """Re-check a :class:`Config` built in code; returns a validated copy (ConfigError on a bad field)."""
    return config_from_dict(config_to_dict(config))


def config_to_dict(config: Config) -> dict[str, dict[str, Any]]:
    """Nested plain dicts (YAML/JSON-serialisable) of ``config``."""
    return dataclasses.asdict(config)


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    """Apply ``"section.key=value"`` strings to nested dicts ``raw`` (values parsed as YAML scalars)."""
    for item in overrides:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        section, dot, field = key.partition(".")
        if not sep or not dot or not section or not field or "." in field:
            raise ConfigError(f"--set {item!r}: expected section.key=value (e.g. model.hidden=64)")
        if section not in SECTIONS:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(SECTIONS)})")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        target = raw.get(section)
        if target is None:
            target = raw[section] = {}
        if not isinstance(target, dict):
            raise ConfigError(f"{section}: must be a mapping of keys to values, got {target!r}")
        target[field] = value
    return raw


def load_config(path: str | os.PathLike, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config, apply ``overrides`` (``"model.hidden=64"``), validate every field.

    Raises:
        ConfigError: one line naming the file or the field.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a YAML config file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({exc})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with sections {', '.join(SECTIONS)}")
    return config_from_dict(apply_overrides(raw, overrides))


def check_paths(config: Config) -> None:
    """Check that ``data.path`` exists (ConfigError naming it otherwise)."""
    if config.data.path is None:
        raise ConfigError("data.path: required (a dataset file or partition directory), but not given")
    if not os.path.exists(config.data.path):
        raise ConfigError(f"data.path: no such file or directory: {config.data.path}")
