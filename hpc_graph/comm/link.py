"""A modelled network link: what a message would cost on a slower (or faster) network.

On one machine, ranks talk through shared memory, so every engine's
communication looks nearly free. :class:`LinkModel` makes the cost of a
chosen network visible: every modelled operation is charged

    latency x (peers it talks to) + 8 x max(bytes sent, bytes received) / bandwidth

seconds (a full-duplex link per rank), and the communicator sleeps until that
much time has passed since the operation started. For a non-blocking
``exchange_start`` the sleep happens in ``Request.wait()``, so computation
done between start and wait hides the modelled time exactly as it would hide
a real transfer. The all-reduce is charged as a ring: ``2 (P-1)`` steps of
``latency + 8 x nbytes / (P x bandwidth)``.

Modelled: ``exchange``/``exchange_start`` (halo exchanges), ``allreduce_``
(gradients, losses, statistics) and ``alltoallv``. Not modelled: set-up
traffic (``bcast``, ``allgather_object``, ``barrier``).

Units: bandwidth in bits per second, latency in seconds; strings with units
are accepted (``"1Gb/s"``, ``"100 Gbit/s"``, ``"12.5GB/s"`` (bytes),
``"50us"``, ``"1.5 ms"``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

__all__ = ["LinkModel", "parse_bandwidth", "parse_latency"]

_BANDWIDTH_UNITS = {  # -> bits per second
    "b/s": 1.0, "bit/s": 1.0, "bps": 1.0,
    "kb/s": 1e3, "kbit/s": 1e3, "kbps": 1e3,
    "mb/s": 1e6, "mbit/s": 1e6, "mbps": 1e6,
    "gb/s": 1e9, "gbit/s": 1e9, "gbps": 1e9,
    "tb/s": 1e12, "tbit/s": 1e12, "tbps": 1e12,
}
_BYTE_UNITS = {"B/s": 8.0, "KB/s": 8e3, "MB/s": 8e6, "GB/s": 8e9, "TB/s": 8e12}  # case-sensitive: B = byte
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def _number(value: Any, name: str) -> float | None:
    if isinstance(value, bool):
        raise ValueError(f"{name}: must be a number with an optional unit, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    return None


def parse_bandwidth(value: Any, name: str = "comm.link_bandwidth") -> float | None:
    """Bits per second from a number (bits/s) or a string with a unit; ``None``/0 means no model.

    Raises ValueError naming ``name`` for negative, non-finite or unreadable values.
    """
    if value is None:
        return None
    num = _number(value, name)
    if num is None:
        if not isinstance(value, str):
            raise ValueError(f"{name}: must be a number (bits/s) or a string like '1Gb/s', got {value!r}")
        m = re.fullmatch(_NUMBER + r"\s*([A-Za-z/]*)", value.strip())
        unit = m.group(2) if m else None
        if m is None or not (unit == "" or unit in _BYTE_UNITS or unit.lower() in _BANDWIDTH_UNITS):
            raise ValueError(f"{name}: cannot read {value!r}; use bits/s or a unit such as "
                             "'1Gb/s', '100Gbit/s', '12.5GB/s'")
        num = float(m.group(1)) * (1.0 if unit == "" else _BYTE_UNITS.get(unit) or _BANDWIDTH_UNITS[unit.lower()])
    if not num == num or num in (float("inf"), float("-inf")) or num < 0:
        raise ValueError(f"{name}: must be a non-negative finite bandwidth, got {value!r}")
    return None if num == 0 else num


def parse_latency(value: Any, name: str = "comm.link_latency") -> float:
    """Seconds from a number (seconds) or a string with a unit (``"50us"``); ValueError naming ``name``."""
    if value is None:
        return 0.0
    num = _number(value, name)
    if num is None:
        if not isinstance(value, str):
            raise ValueError(f"{name}: must be a number (seconds) or a string like '50us', got {value!r}")
        m = re.fullmatch(_NUMBER + r"\s*([A-Za-zµ]*)", value.strip())
        if m is None or m.group(2) not in ("",) + tuple(_LATENCY_UNITS):
            raise ValueError(f"{name}: cannot read {value!r}; use seconds or a unit such as '50us', '1ms'")
        num = float(m.group(1)) * (_LATENCY_UNITS[m.group(2)] if m.group(2) else 1.0)
    if not num == num or num in (float("inf"), float("-inf")) or num < 0:
        raise ValueError(f"{name}: must be a non-negative finite latency, got {value!r}")
    return num


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """A per-rank full-duplex link: ``bandwidth`` bits/s (> 0) and ``latency`` seconds per message."""

    bandwidth: float
    latency: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"LinkModel: bandwidth must be positive, got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise ValueError(f"LinkModel: latency must be non-negative, got {self.latency!r}")

    def cost(self, bytes_out: int, bytes_in: int, peers: int) -> float:
        """Seconds for a point-to-point step: ``latency x peers + 8 max(out, in) / bandwidth``."""
        if peers <= 0:
            return 0.0
        return self.latency * peers + 8.0 * max(int(bytes_out), int(bytes_in)) / self.bandwidth

    def allreduce_cost(self, nbytes: int, size: int) -> float:
        """Seconds for a ring all-reduce of ``nbytes`` over ``size`` ranks."""
        if size <= 1 or nbytes <= 0:
            return 0.0
        steps = 2 * (size - 1)
        return steps * (self.latency + 8.0 * nbytes / size / self.bandwidth)

    def describe(self) -> str:
        bw = self.bandwidth
        text = f"{bw / 1e9:g} Gb/s" if bw >= 1e9 else f"{bw / 1e6:g} Mb/s"
        return f"{text}, {self.latency * 1e6:g} us latency"
