"""Parameter initialisers shared by the layers (private)."""
from __future__ import annotations

import math

import torch


def glorot_(t: torch.Tensor) -> None:
    """Glorot/Xavier uniform init in place, fans taken from the last two dims (PyG convention)."""
    fan = t.size(-2) + t.size(-1)
    bound = math.sqrt(6.0 / fan)
    with torch.no_grad():
        t.uniform_(-bound, bound)
