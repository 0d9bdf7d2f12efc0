"""hpc_graph.nn.optim against torch.optim (the reference) on random parameters and gradients, float64."""
import copy

import pytest
import torch

from hpc_graph.nn import optim


def _params(seed, shapes=((5, 3), (3,), (2, 4, 2))):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]


def _run(make, params, steps, seed, skip=None, schedule=None):
    """``steps`` steps of ``make(params)`` on random gradients (parameter ``skip`` gets none at odd steps);
    returns the parameters and the optimiser."""
    opt = make(params)
    sched = schedule(opt) if schedule is not None else None
    gen = torch.Generator().manual_seed(seed + 1)
    for t in range(steps):
        for i, p in enumerate(params):
            g = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.grad = None if (i == skip and t % 2) else g
        opt.step()
        if sched is not None:
            sched.step()
    return params, opt


CASES = {
    "adam": (lambda ps: optim.Adam(ps, lr=0.05), lambda ps: torch.optim.Adam(ps, lr=0.05)),
    "adam_l2": (lambda ps: optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
                lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    "adamw": (lambda ps: optim.AdamW(ps, lr=0.03, weight_decay=0.2),
              lambda ps: torch.optim.AdamW(ps, lr=0.03, weight_decay=0.2)),
    "sgd": (lambda ps: optim.SGD(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "sgd_momentum": (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01),
                     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    "sgd_nesterov": (lambda ps: optim.SGD(ps, lr=0.1, momentum=0.5, nesterov=True),
                     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, nesterov=True)),
    "groups": (lambda ps: optim.AdamW([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.2}], lr=0.01,
                                      weight_decay=0.05),
               lambda ps: torch.optim.AdamW([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.2}], lr=0.01,
                                            weight_decay=0.05)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_updates_equal_torch(name):
    ours, ref = CASES[name]
    seed = sorted(CASES).index(name)
    p1, o1 = _run(ours, _params(seed), 7, seed, skip=1)
    p2, _ = _run(ref, _params(seed), 7, seed, skip=1)
    for a, b in zip(p1, p2):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
    assert not torch.equal(p1[0], _params(seed)[0])  # it did move
    assert all(isinstance(k, torch.Tensor) for k in o1.state)


@pytest.mark.parametrize("name", ["adam_l2", "sgd_momentum", "groups"])
def test_state_dict_loads_both_ways_and_resumes(name):
    """3 steps, save, load into a fresh optimiser (ours from torch's state and torch's from ours), 4 more steps:
    equal to 7 steps without the break."""
    ours, ref = CASES[name]
    whole, _ = _run(ours, _params(9), 7, 9)
    for first, second in ((ours, ref), (ref, ours), (ours, ours)):
        ps, opt = _run(first, _params(9), 3, 9)
        saved = copy.deepcopy(opt.state_dict())
        fresh = [p.detach().clone().requires_grad_(True) for p in ps]
        opt2 = second(fresh)
        opt2.load_state_dict(saved)
        gen = torch.Generator().manual_seed(10)
        for _ in range(3):  # replay the first three steps' gradients, then the remaining four
            for p in fresh:
                torch.randn(p.shape, generator=gen, dtype=p.dtype)
        for _ in range(4):
            for p in fresh:
                p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            opt2.step()
        for a, b in zip(fresh, whole):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind", ["step", "cosine"])
def test_schedules_equal_torch_and_resume(kind):
    def ours(opt):
        return optim.StepLR(opt, 3, 0.5) if kind == "step" else optim.CosineLR(opt, 10, 0.001)

    def ref(opt):
        return (torch.optim.lr_scheduler.StepLR(opt, 3, 0.5) if kind == "step"
                else torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10, 0.001))

    o1 = optim.SGD(_params(0), lr=0.3)
    o2 = torch.optim.SGD(_params(0), lr=0.3)
    s1, s2 = ours(o1), ref(o2)
    for _ in range(13):
        s1.step()
        s2.step()
        assert s1.get_last_lr()[0] == pytest.approx(s2.get_last_lr()[0], rel=1e-12, abs=1e-15)
    # resume from our state and from torch's: the same rates from there on
    for state in (s1.state_dict(), s2.state_dict()):
        o3 = optim.SGD(_params(0), lr=0.3)
        s3 = ours(o3)
        s3.load_state_dict(state)
        assert o3.param_groups[0]["lr"] == pytest.approx(s1.get_last_lr()[0], rel=1e-12)
        s3.step()
        s1c = copy.deepcopy(s1)
        s1c.step()
        assert s3.get_last_lr() == s1c.get_last_lr()


def test_zero_grad_and_no_grad_parameters():
    ps = _params(3)
    opt = optim.Adam(ps, lr=0.1)
    before = [p.detach().clone() for p in ps]
    opt.step()  # no gradients: nothing moves, no state
    assert all(torch.equal(a, b) for a, b in zip(ps, before)) and not opt.state
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in ps)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)


def test_bad_options_are_refused():
    ps = _params(0)
    with pytest.raises(ValueError, match="lr"):
        optim.Adam(ps, lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(ps, betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="weight_decay"):
        optim.SGD(ps, weight_decay=-0.1)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(ps, nesterov=True)
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([])
    with pytest.raises(ValueError, match="more than one group"):
        optim.SGD([{"params": ps[:2]}, {"params": ps[1:]}])
    with pytest.raises(ValueError, match="unknown option"):
        optim.SGD([{"params": ps, "betas": (0.9, 0.9)}])
    with pytest.raises(ValueError, match="step_size"):
        optim.StepLR(optim.SGD(ps), 0)
    opt = optim.Adam(ps)
    with pytest.raises(ValueError, match="group"):
        opt.load_state_dict(optim.Adam([{"params": ps[:1]}, {"params": ps[1:]}]).state_dict())
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(TypeError, match="sparse"):
        optim.SGD([p]).step()
