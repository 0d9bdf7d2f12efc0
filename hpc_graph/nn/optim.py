"""Optimisers and learning-rate schedules: Adam, AdamW, SGD; step and cosine schedules.

The same update rules as ``torch.optim``'s (same state, same ``state_dict`` layout, results equal to
rounding on random inputs -- tested), written here because using ``torch.optim`` imports
``torch._dynamo`` on the first call into an optimiser: ~2 s of start-up on every rank of every job (and of
every test process), more than importing torch itself on the machines this was measured on. Nothing here
imports it.

An optimiser holds ``param_groups`` (list of dicts: ``params`` and the hyper-parameters, ``lr`` first) and
``state`` (dict: parameter -> its buffers); a parameter without a gradient is skipped by ``step`` (no
momentum drift, no decay), as in ``torch.optim``. ``state_dict()`` numbers the parameters in group order
(``{"state": {i: {...}}, "param_groups": [{..., "params": [i, ...]}]}``), which is ``torch.optim``'s
layout: a state saved by either loads into the other. Only dense gradients; complex parameters are not
supported.

A schedule (:class:`StepLR`, :class:`CosineLR`) sets every group's ``lr`` from its initial value and the
number of ``step()`` calls (closed forms, so a resumed run sets the same rates as an uninterrupted one).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch


class Optimizer:
    """Base: parameter groups, per-parameter state, ``zero_grad``, ``state_dict`` / ``load_state_dict``.

    Args:
        params: tensors, or dicts with ``params`` and per-group overrides of ``defaults``.
        defaults: the hyper-parameters (``lr`` among them).
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[torch.Tensor, dict[str, Any]] = {}
        items = list(params)
        if not items:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(items[0], dict):
            items = [{"params": items}]
        for group in items:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group (``params`` plus overrides of the defaults)."""
        if "params" not in group:
            raise ValueError(f"{type(self).__name__}: a parameter group needs 'params'")
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{type(self).__name__}: parameters must be tensors, got {type(p).__name__}")
            if p.is_complex():
                raise TypeError(f"{type(self).__name__}: complex parameters are not supported")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: a parameter appears in more than one group")
            seen.add(id(p))
        unknown = sorted(set(group) - set(self.defaults) - {"params", "initial_lr"})
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown option(s) {unknown}; known: {sorted(self.defaults)}")
        full = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}, "params": params}
        self._check(full)
        self.param_groups.append(full)

    def _check(self, group: dict[str, Any]) -> None:
        lr = group["lr"]
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"{type(self).__name__}: lr must be a finite number >= 0, got {lr!r}")
        if group.get("weight_decay", 0.0) < 0:
            raise ValueError(f"{type(self).__name__}: weight_decay must be >= 0, got {group['weight_decay']!r}")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: ``None``, or zeros in place (``set_to_none=False``)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Update every parameter that has a gradient."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise TypeError(f"{type(self).__name__}: sparse gradients are not supported")
                self._update(p, p.grad, group, self.state.setdefault(p, {}))

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: buffers}, "param_groups": [options + "params": indices]}`` (torch's layout)."""
        index: dict[int, int] = {}  # a parameter is in one group only (add_param_group)
        groups = []
        for group in self.param_groups:
            ids = list(range(len(index), len(index) + len(group["params"])))
            index.update(zip((id(p) for p in group["params"]), ids))
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (ours or ``torch.optim``'s): the groups must hold the same numbers of
        parameters; buffers are copied to each parameter's device and (floating point) dtype."""
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            raise ValueError(f"{type(self).__name__}.load_state_dict: {len(groups or [])} parameter group(s) saved, "
                             f"{len(self.param_groups)} here")
        by_index: dict[int, torch.Tensor] = {}
        for saved, group in zip(groups, self.param_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"{type(self).__name__}.load_state_dict: a group of {len(saved['params'])} "
                                 f"parameters saved, {len(group['params'])} here")
            by_index.update(zip(saved["params"], group["params"]))
        self.state = {}
        for i, buffers in state_dict.get("state", {}).items():
            p = by_index.get(int(i))
            if p is None:
                continue
            self.state[p] = {k: (v.to(p.device, p.dtype if k != "step" else v.dtype).clone()
                                 if isinstance(v, torch.Tensor) else v) for k, v in buffers.items()}
        for saved, group in zip(groups, self.param_groups):
            for k in self.defaults:
                if k in saved:
                    group[k] = saved[k]
            if "initial_lr" in saved:
                group["initial_lr"] = saved["initial_lr"]


class Adam(Optimizer):
    """Adam (Kingma & Ba): ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    ``p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)``. ``weight_decay`` adds ``wd * p`` to the
    gradient (L2); ``decoupled_weight_decay`` instead shrinks ``p`` by ``1 - lr * wd`` first (AdamW).
    State per parameter: ``step`` (float32 scalar tensor), ``exp_avg``, ``exp_avg_sq``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled_weight_decay: bool = False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "decoupled_weight_decay": bool(decoupled_weight_decay)})

    def _check(self, group: dict[str, Any]) -> None:
        super()._check(group)
        b1, b2 = group["betas"]
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"{type(self).__name__}: betas must lie in [0, 1), got {group['betas']!r}")
        if not group["eps"] >= 0.0:
            raise ValueError(f"{type(self).__name__}: eps must be >= 0, got {group['eps']!r}")

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        state["step"] += 1
        t = float(state["step"])
        if wd != 0:
            if group["decoupled_weight_decay"]:
                p.mul_(1 - lr * wd)
            else:
                grad = grad.add(p, alpha=wd)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        correction2 = (1 - b2 ** t) ** 0.5
        denom = (v.sqrt() / correction2).add_(eps)
        p.addcdiv_(m, denom, value=-(lr / (1 - b1 ** t)))


class AdamW(Adam):
    """:class:`Adam` with decoupled weight decay (Loshchilov & Hutter; default ``weight_decay`` 0.01)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay, decoupled_weight_decay=True)


class SGD(Optimizer):
    """Stochastic gradient descent: ``g += wd * p``; with momentum ``b = mu b + (1 - dampening) g`` (the first
    step: ``b = g``), ``g = b`` (or ``g + mu b`` with ``nesterov``); ``p -= lr g``. State: ``momentum_buffer``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": bool(nesterov)})

    def _check(self, group: dict[str, Any]) -> None:
        super()._check(group)
        if group["momentum"] < 0:
            raise ValueError(f"SGD: momentum must be >= 0, got {group['momentum']!r}")

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        wd, mu = group["weight_decay"], group["momentum"]
        if wd != 0:
            grad = grad.add(p, alpha=wd)
        if mu != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.detach().clone()
            else:
                buf.mul_(mu).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=mu) if group["nesterov"] else buf
        p.add_(grad, alpha=-group["lr"])


class _Schedule:
    """Sets every group's ``lr`` to ``factor(epoch) * initial_lr`` after each ``step()``."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = 0

    def lr(self, base: float, epoch: int) -> float:
        raise NotImplementedError

    def _apply(self) -> None:
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr(base, self.last_epoch)

    def step(self) -> None:
        """One epoch done: set the rates of the next."""
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (ours or a ``torch.optim.lr_scheduler``'s: ``last_epoch``, ``base_lrs``)."""
        self.last_epoch = int(state["last_epoch"])
        self.base_lrs = [float(v) for v in state.get("base_lrs", self.base_lrs)]
        self._apply()


class StepLR(_Schedule):
    """``lr = initial_lr * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        if int(step_size) < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size!r}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer)

    def lr(self, base: float, epoch: int) -> float:
        return base * self.gamma ** (epoch // self.step_size)


class CosineLR(_Schedule):
    """``lr = eta_min + (initial_lr - eta_min) (1 + cos(pi epoch / T)) / 2`` (half a cosine over ``T`` epochs)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
        if int(T_max) < 1:
            raise ValueError(f"CosineLR: T_max must be >= 1, got {T_max!r}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer)

    def lr(self, base: float, epoch: int) -> float:
        return self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2
