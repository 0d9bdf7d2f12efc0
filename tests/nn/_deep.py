"""Helpers of the deep-model tests: the dense GCN matrix, a graph that records the layers asked for, weights."""
from __future__ import annotations

import torch
from _graphs import DenseGraph, dense_adjacency, random_edges


def graph_and_p(n: int = 30, e: int = 110, seed: int = 0) -> tuple[DenseGraph, torch.Tensor]:
    """A random graph (the last 2 nodes without in-edges) and its ``P = D^-1/2 (A + I) D^-1/2``, float64."""
    src, dst = random_edges(n, e, seed=seed)
    a_hat = dense_adjacency(src, dst, n) + torch.eye(n, dtype=torch.float64)
    dinv = a_hat.sum(1).rsqrt()
    return DenseGraph(src, dst, n), dinv[:, None] * a_hat * dinv[None, :]


class LayerLog(DenseGraph):
    """A DenseGraph that logs ``layer(l)`` and ``aggregate`` calls (a full graph: every layer is itself)."""

    def __init__(self, graph: DenseGraph):
        self.__dict__.update(graph.__dict__)
        self.log: list[tuple[str, int]] = []

    def layer(self, index: int):
        self.log.append(("layer", index))
        return self

    def aggregate(self, x, reduce="sum"):
        self.log.append(("aggregate", x.shape[1]))
        return super().aggregate(x, reduce)


def check_grads(model: torch.nn.Module, out: torch.Tensor, ref: torch.Tensor, params: dict,
                rtol: float = 1e-9, atol: float = 1e-11) -> None:
    """``out`` (from ``model``) equals ``ref`` (from the leaf copies ``params``), and so do all gradients."""
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    r = torch.randn_like(ref)
    (out * r).sum().backward()
    (ref * r).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, params[name].grad, rtol=rtol, atol=atol, msg=name)


def leaf_copies(model: torch.nn.Module) -> dict:
    """``{name: detached copy requiring grad}`` of every parameter (the reference's own leaves)."""
    return {k: p.detach().clone().requires_grad_() for k, p in model.named_parameters()}
