"""dropout_linear against plain torch: linear of the same dropout (same key), values and gradients in float64."""
import pytest
import torch
from torch.nn import functional as F

from hpc_graph.ops.dropout import dropout
from hpc_graph.ops.dropout_linear import dropout_linear


@pytest.mark.parametrize("p, bias", [(0.5, True), (0.6, False), (0.0, True), (0.9, True)])
def test_values_and_gradients_equal_linear_of_dropout(p, bias):
    torch.manual_seed(0)
    x = torch.randn(37, 11, dtype=torch.float64)
    w = torch.randn(5, 11, dtype=torch.float64)
    b = torch.randn(5, dtype=torch.float64) if bias else None
    grad = torch.randn(37, 5, dtype=torch.float64)

    def leaves():
        return [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]

    ref_in = leaves()
    torch.manual_seed(7)  # the key comes from torch's generator: same seed, same mask
    ref = F.linear(dropout(ref_in[0], p), ref_in[1], ref_in[2])
    ref.backward(grad)
    ours_in = leaves()
    torch.manual_seed(7)
    out = dropout_linear(ours_in[0], ours_in[1], ours_in[2], p)
    out.backward(grad)
    torch.testing.assert_close(out, ref)
    for a, r in zip(ours_in, ref_in):
        if a is not None:
            torch.testing.assert_close(a.grad, r.grad)
    if p > 0:  # the mask really drops: the fraction of zero rows of dropout(x) is about p
        torch.manual_seed(7)
        dropped = (dropout(torch.ones(37, 11, dtype=torch.float64), p) == 0).double().mean().item()
        assert abs(dropped - p) < 0.15


def test_mask_matches_kept_elements_exactly():
    """Independent of the dropout op: y = (m * x / keep) W^T with m the zero pattern of the dropped ones."""
    torch.manual_seed(1)
    x = torch.randn(20, 6, dtype=torch.float64)
    w = torch.randn(3, 6, dtype=torch.float64)
    torch.manual_seed(3)
    m = (dropout(torch.ones_like(x), 0.5) != 0).double()
    torch.manual_seed(3)
    out = dropout_linear(x, w, None, 0.5)
    keep = 1.0 - round(0.5 * 65536) / 65536
    torch.testing.assert_close(out, (m * x / keep) @ w.t())


def test_gradcheck():
    torch.manual_seed(2)
    x = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def f(x, w, b):
        torch.manual_seed(11)
        return dropout_linear(x, w, b, 0.3)

    assert torch.autograd.gradcheck(f, (x, w, b))


@pytest.mark.parametrize("kwargs, message", [
    ({"p": 1.0}, r"dropout_linear: p must be in \[0, 1\), got 1.0"),
    ({"x": torch.zeros(2, 3, 4)}, r"dropout_linear: x must be a dense \[N, F_in\] tensor"),
    ({"x": torch.zeros(2, 4, dtype=torch.int64)}, "dropout_linear: x dtype must be float32 or float64"),
])
def test_bad_inputs(kwargs, message):
    args = {"x": torch.zeros(2, 4), "weight": torch.zeros(3, 4), "bias": None, "p": 0.5, **kwargs}
    with pytest.raises(ValueError, match=message):
        dropout_linear(**args)


@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("act", ["relu", "elu"])
def test_act_and_two_weights_equal_plain_torch(p, act):
    """act and two projections of one input: values and every gradient equal linear(dropout(act(x)))."""
    from hpc_graph.ops.dropout_linear import dropout_linear_multi

    torch.manual_seed(4)
    x = torch.randn(41, 9, dtype=torch.float64)
    w1, w2 = torch.randn(6, 9, dtype=torch.float64), torch.randn(4, 9, dtype=torch.float64)
    b1 = torch.randn(6, dtype=torch.float64)
    g1, g2 = torch.randn(41, 6, dtype=torch.float64), torch.randn(41, 4, dtype=torch.float64)

    def leaves():
        return [t.clone().requires_grad_() for t in (x, w1, w2, b1)]

    r = leaves()
    torch.manual_seed(9)
    a = dropout(F.relu(r[0]) if act == "relu" else F.elu(r[0]), p)
    (F.linear(a, r[1], r[3]) * g1).sum().add((F.linear(a, r[2]) * g2).sum()).backward()
    o = leaves()
    torch.manual_seed(9)
    y1, y2 = dropout_linear_multi(o[0], (o[1], o[2]), (o[3], None), p, act=act)
    torch.testing.assert_close(y1, F.linear(a, r[1], r[3]).detach())
    torch.testing.assert_close(y2, F.linear(a, r[2]).detach())
    ((y1 * g1).sum() + (y2 * g2).sum()).backward()
    for ours, ref in zip(o, r):
        torch.testing.assert_close(ours.grad, ref.grad)


def test_relu_variant_keeps_only_the_input():
    from hpc_graph.ops.dropout_linear import dropout_linear_multi

    x = torch.randn(300, 16, requires_grad=True)
    w1, w2 = torch.randn(8, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        dropout_linear_multi(x, (w1, w2), (None, None), 0.5, act="relu")
    big = [t for t in saved if t.numel() >= x.numel()]
    assert len(big) == 1 and big[0].data_ptr() == x.data_ptr()


@pytest.mark.parametrize("bad, message", [
    ({"act": "tanh"}, "act must be one of"), ({"p": 1.0}, "p must be in [0, 1)"),
])
def test_bad_arguments_are_named(bad, message):
    from hpc_graph.ops.dropout_linear import dropout_linear_multi

    args = {"p": 0.5, "act": "relu", **bad}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        dropout_linear_multi(torch.randn(4, 3), (torch.randn(2, 3),), (None,), **args)


def test_row_scale_equals_scaling_the_outputs():
    from hpc_graph.ops.dropout_linear import dropout_linear_multi

    torch.manual_seed(5)
    x = torch.randn(23, 7, dtype=torch.float64)
    w, b = torch.randn(3, 7, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    s = torch.rand(23, 1, dtype=torch.float64) + 0.5
    g = torch.randn(23, 3, dtype=torch.float64)
    r = [t.clone().requires_grad_() for t in (x, w, b)]
    torch.manual_seed(2)
    (F.linear(dropout(F.relu(r[0]), 0.3), r[1], r[2]) * s).mul(g).sum().backward()
    o = [t.clone().requires_grad_() for t in (x, w, b)]
    torch.manual_seed(2)
    (y,) = dropout_linear_multi(o[0], (o[1],), (o[2],), 0.3, "relu", row_scale=s)
    y.mul(g).sum().backward()
    for ours, ref in zip(o, r):
        torch.testing.assert_close(ours.grad, ref.grad)
    with pytest.raises(ValueError, match="row_scale must be a constant"):
        dropout_linear_multi(o[0], (o[1],), (o[2],), 0.3, "relu", row_scale=s[:5])


@pytest.mark.parametrize("act", [None, "relu", "elu"])
def test_row_ids_give_a_subset_the_masks_of_the_whole(act):
    """With ``ids``, the rows of a subset (shuffled: a partition's rows) get the values and gradients the same
    rows get in the whole tensor with the same key: dropout, the fused dropout_linear (one and two weights,
    row scale) and the nn helpers (dense and sparse CSR input)."""
    from hpc_graph.nn._dropout import dropout as nn_dropout
    from hpc_graph.ops.dropout import act_dropout
    from hpc_graph.ops.dropout_linear import dropout_linear_multi

    torch.manual_seed(0)
    n, f = 53, 9
    x = torch.randn(n, f, dtype=torch.float64)
    ids = torch.randperm(n)[:31]
    w1, w2 = torch.randn(4, f, dtype=torch.float64), torch.randn(3, f, dtype=torch.float64)
    scale = torch.rand(n, 1, dtype=torch.float64) + 0.5
    g1, g2 = torch.randn(n, 4, dtype=torch.float64), torch.randn(n, 3, dtype=torch.float64)

    def run(rows, keyed):
        xs = x[rows].clone().requires_grad_()
        torch.manual_seed(5)
        a = act_dropout(xs, act, 0.45, rows if keyed else None)
        torch.manual_seed(5)
        y1, y2 = dropout_linear_multi(xs, (w1, w2), (None, None), 0.45, act, scale[rows], rows if keyed else None)
        ((y1 * g1[rows]).sum() + (y2 * g2[rows]).sum()).backward()
        return a.detach(), y1.detach(), y2.detach(), xs.grad

    whole = run(torch.arange(n), False)
    part = run(ids, True)
    for got, want in zip(part, whole):
        torch.testing.assert_close(got, want[ids], rtol=1e-12, atol=1e-12)
    unkeyed = run(ids, False)  # without ids the subset's masks are those of its positions: other ones
    assert not torch.equal(unkeyed[0], whole[0][ids])
    # nn helper: a sparse CSR input drops its stored values as the dense matrix drops those elements
    xz = x * (torch.rand(n, f, dtype=torch.float64) < 0.3)
    torch.manual_seed(9)
    dense = nn_dropout(xz, 0.5, True, None)
    torch.manual_seed(9)
    sparse = nn_dropout(xz[ids].to_sparse_csr(), 0.5, True, ids)
    torch.testing.assert_close(sparse.to_dense(), dense[ids])
    with pytest.raises(ValueError, match=r"ids must be int64\[31\]"):
        act_dropout(x[ids], act, 0.5, ids[:5])
