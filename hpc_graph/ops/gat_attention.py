"""Fused GATv1 attention: block-wise functions (for SAR) and the one-shot autograd op.

``out[i,h,:] = sum_j softmax_j(LeakyReLU(s_dst[i,h] + s_src[j,h])) * z[j,h,:]``
over the in-edges ``j -> i`` of a :class:`~hpc_graph.ops.csr.CSR`, computed by
the numba kernels in ``numba_kernels/{cpu,cuda}/gat_attention.py`` without
ever materialising an E x H attention tensor.

Block-wise use (sources split into blocks, e.g. SAR's G_{p,q}; every block is
a CSR over the same destinations whose columns are block-local source ids)::

    state = init_state(num_dst, H, D, dtype)
    for blk, z_q, s_q in blocks:
        accumulate(state, blk, z_q, s_q, s_dst)
    out = finalize(state)
    # backward, given grad_out:
    delta = output_delta(state, grad_out)
    for blk, z_q, s_q in blocks:
        gz_q, gs_q, gsd = backward_block(state, grad_out, delta, blk, z_q, s_q, s_dst)
        grad_s_dst += gsd

The result does not depend on how the sources are split.  Self-loops are NOT
added: pass them as an extra block (for example ``CSR(arange(N+1), arange(N))``
over the destinations' own rows).

Attention dropout drops head ``h`` of edge ``(i, j)`` by a splitmix64 hash of
``(seed, dst_gid[i], src_gid[j], h)`` (kept values scaled by ``1/(1-p)``), so
every engine and every block split drops the same coefficients and backward
recomputes the same mask.  Global ids default to local ids (``src_gid`` to the
block's column ids, ``dst_gid`` to the row ids).
"""
from __future__ import annotations

import torch

from hpc_graph.ops._bridge import as_array, get_kernel, kernel_device
from hpc_graph.ops.attention_state import (AttentionState, check_block, check_tensor, finalize,
                                           init_state, output_delta)
from hpc_graph.ops.csr import CSR

__all__ = ["AttentionState", "init_state", "accumulate", "finalize", "output_delta", "backward_block",
           "GATAttention", "gat_attention", "project", "project_backward", "GATProjected", "WholeAttend",
           "gat_projected"]

def _check_dropout(attn_dropout: float, seed: int) -> tuple[float, int]:
    p = float(attn_dropout)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attn_dropout: must be in [0, 1), got {attn_dropout}")
    if int(seed) < 0:
        raise ValueError(f"seed: must be >= 0, got {seed}")
    return p, int(seed) & 0x7FFFFFFFFFFFFFFF


def _gids(name: str, gid, n: int, p: float, device) -> torch.Tensor | None:
    """Validated int64[n] global ids, or ``None`` (local ids; also whenever dropout is off)."""
    if p == 0.0 or gid is None:
        return None
    gid = torch.as_tensor(gid, device=device)
    if gid.dtype != torch.int64 or tuple(gid.shape) != (n,):
        raise ValueError(f"{name}: expected an int64 tensor of shape ({n},), got {gid.dtype} {tuple(gid.shape)}")
    if n and not gid.is_meta and int(gid.min()) < 0:
        raise ValueError(f"{name}: global ids must be >= 0")
    return gid.contiguous()


def _check_inputs(state: AttentionState, block: CSR, z_block, s_src_block, s_dst) -> None:
    ref = state.acc
    check_block("block", block, state.num_dst, ref.device)
    check_tensor("z_block", z_block, (block.num_src, state.heads, state.dim), ref.dtype, ref.device)
    check_tensor("s_src_block", s_src_block, (block.num_src, state.heads), ref.dtype, ref.device)
    check_tensor("s_dst", s_dst, (state.num_dst, state.heads), ref.dtype, ref.device)


def accumulate(state: AttentionState, block: CSR, z_block: torch.Tensor, s_src_block: torch.Tensor,
               s_dst: torch.Tensor, negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
               src_gid: torch.Tensor | None = None, dst_gid: torch.Tensor | None = None) -> None:
    """Fold one block of sources into ``state`` (in place, no autograd).

    Args:
        state: from :func:`init_state` (num_dst rows, H heads, D features).
        block: CSR with ``num_dst`` rows; columns are block-local source ids.
        z_block: float[block.num_src, H, D] source features; s_src_block: float[block.num_src, H].
        s_dst: float[num_dst, H] destination scores.
        negative_slope: LeakyReLU slope; attn_dropout: probability in [0, 1); seed: int >= 0.
        src_gid: int64[block.num_src], dst_gid: int64[num_dst]: global ids for the dropout hash.
    """
    if state.finalized:
        raise ValueError("accumulate: state is already finalized")
    _check_inputs(state, block, z_block, s_src_block, s_dst)
    p, seed = _check_dropout(attn_dropout, seed)
    dev = state.acc.device
    get_kernel("gat_attention.accumulate", kernel_device(state.acc))(
        as_array(block.indptr), as_array(block.indices), as_array(z_block), as_array(s_src_block),
        as_array(s_dst), as_array(_gids("src_gid", src_gid, block.num_src, p, dev)),
        as_array(_gids("dst_gid", dst_gid, state.num_dst, p, dev)), float(negative_slope), p, seed,
        as_array(state.m), as_array(state.l), as_array(state.acc))


def backward_block(state: AttentionState, grad_out: torch.Tensor, delta: torch.Tensor, block: CSR,
                   z_block: torch.Tensor, s_src_block: torch.Tensor, s_dst: torch.Tensor,
                   negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
                   src_gid: torch.Tensor | None = None, dst_gid: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of one block, recomputing its attention scores (no autograd).

    Args:
        state: the finalized forward state (``m``, ``l``, output in ``acc``).
        grad_out: float[num_dst, H, D] gradient of the output.
        delta: float[num_dst, H] from :func:`output_delta` (computed once for all blocks).
        block, z_block, s_src_block, s_dst, negative_slope, attn_dropout, seed, src_gid, dst_gid:
            exactly as passed to :func:`accumulate` for this block.
    Returns:
        ``(grad_z_block float[num_src, H, D], grad_s_src_block float[num_src, H],
        grad_s_dst float[num_dst, H])``; the last is this block's share, to be
        summed over all blocks.
    """
    if not state.finalized:
        raise ValueError("backward_block: the state must be finalized first")
    _check_inputs(state, block, z_block, s_src_block, s_dst)
    ref = state.acc
    check_tensor("grad_out", grad_out, tuple(ref.shape), ref.dtype, ref.device)
    check_tensor("delta", delta, tuple(state.m.shape), ref.dtype, ref.device)
    p, seed = _check_dropout(attn_dropout, seed)
    dev = ref.device
    device = kernel_device(ref)
    src_ids = as_array(_gids("src_gid", src_gid, block.num_src, p, dev))
    dst_ids = as_array(_gids("dst_gid", dst_gid, state.num_dst, p, dev))
    grad_z = torch.zeros_like(z_block)
    grad_s_src = torch.zeros_like(s_src_block)
    grad_s_dst = torch.zeros_like(s_dst)
    common = (as_array(z_block), as_array(s_src_block), as_array(s_dst), src_ids, dst_ids,
              float(negative_slope), p, seed, as_array(state.m), as_array(state.l),
              as_array(grad_out), as_array(delta))
    get_kernel("gat_attention.backward_dst", device)(
        as_array(block.indptr), as_array(block.indices), *common, as_array(grad_s_dst))
    indptr_t, indices_t, _ = block.csc(perm=False)
    get_kernel("gat_attention.backward_src", device)(
        as_array(indptr_t), as_array(indices_t), *common, as_array(grad_z), as_array(grad_s_src))
    return grad_z, grad_s_src, grad_s_dst


class GATAttention(torch.autograd.Function):
    """Autograd wrapper: one block holding all sources.  Use :func:`gat_attention`."""

    @staticmethod
    def forward(ctx, g: CSR, z_src, s_src, s_dst, negative_slope, attn_dropout, seed, src_gid, dst_gid):
        state = init_state(g.num_dst, z_src.shape[1], z_src.shape[2], z_src.dtype, z_src.device)
        accumulate(state, g, z_src, s_src, s_dst, negative_slope, attn_dropout, seed, src_gid, dst_gid)
        out = finalize(state)
        ctx.save_for_backward(z_src, s_src, s_dst, state.m, state.l, out)
        ctx.g = g
        ctx.args = (negative_slope, attn_dropout, seed, src_gid, dst_gid)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        z_src, s_src, s_dst, m, l, out = ctx.saved_tensors
        state = AttentionState(m, l, out, finalized=True)
        grad_out = grad_out.contiguous()
        delta = output_delta(state, grad_out)
        gz, gs, gd = backward_block(state, grad_out, delta, ctx.g, z_src, s_src, s_dst, *ctx.args)
        return None, gz, gs, gd, None, None, None, None, None


def gat_attention(g: CSR, z_src: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor,
                  negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
                  src_gid: torch.Tensor | None = None, dst_gid: torch.Tensor | None = None,
                  training: bool = True) -> torch.Tensor:
    """GATv1 attention aggregation over the in-edges of ``g`` (differentiable in z, s_src, s_dst).

    Args:
        g: CSR, row ``i`` lists the sources of destination ``i`` (no self-loops added).
        z_src: float[Ns, H, D] source features; s_src: float[Ns, H]; s_dst: float[Nd, H].
        negative_slope: LeakyReLU slope.
        attn_dropout: probability of dropping an attention coefficient (only when ``training``).
        seed: dropout seed (int >= 0); src_gid int64[Ns] / dst_gid int64[Nd]: global ids
            feeding the dropout hash (default: local ids).
    Returns:
        float[Nd, H, D]; rows without in-edges are 0.
    """
    check_tensor("z_src", z_src, (None, None, None), None, getattr(z_src, "device", "cpu"))
    for name, t in (("s_src", s_src), ("s_dst", s_dst)):
        check_tensor(name, t, (None, None), z_src.dtype, z_src.device)
    p = float(attn_dropout) if training else 0.0
    return GATAttention.apply(g, z_src.contiguous(), s_src.contiguous(), s_dst.contiguous(),
                              float(negative_slope), p, int(seed), src_gid, dst_gid)


# -- projection, scores and attention as one op that keeps only its input ---------------------------
def _head_dots(z: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """float[n, H] ``(z * att).sum(-1)`` for z float[n, H, D], att float[1, H, D]: one matrix-vector product per
    head on a strided view of ``z`` (no n x H x D temporary)."""
    return torch.stack([torch.mv(z[:, h, :], att[0, h]) for h in range(z.shape[1])], 1)


def _head_grads(z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """float[1, H, D] ``(g.unsqueeze(-1) * z).sum(0, keepdim=True)`` for g float[n, H]: the gradient of an
    attention vector, one matrix-vector product per head (no n x H x D temporary)."""
    return torch.stack([torch.mv(z[:, h, :].t(), g[:, h]) for h in range(z.shape[1])], 0).unsqueeze(0)


def project(x: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor,
            mask: tuple | None = None):
    """``(z float[n, H, D], s_src float[n, H], s_dst float[n, H])`` of a GAT layer, no autograd.

    ``a = dropout(act(x))`` with ``mask = (key, cut, scale, act code, ids)`` of
    :func:`hpc_graph.ops.dropout_linear.mask_params` (``a`` is ``x`` itself when ``mask`` is None);
    ``z = (a W^T).view(n, H, D)``, ``s_src = (z * att_src).sum(-1)``, ``s_dst = (z * att_dst).sum(-1)``.
    ``a`` is dropped as soon as ``z`` exists.
    """
    from hpc_graph.ops.dropout_linear import act_mask

    heads, dim = int(att_src.shape[1]), int(att_src.shape[2])
    a = x if mask is None else act_mask(x, *mask)
    z = torch.nn.functional.linear(a, weight).view(-1, heads, dim)
    del a
    return z, _head_dots(z, att_src), _head_dots(z, att_dst)


def project_backward(x: torch.Tensor, work: list, weight: torch.Tensor, att_src: torch.Tensor,
                     att_dst: torch.Tensor, grad_s_src: torch.Tensor, grad_s_dst: torch.Tensor, mask: tuple | None,
                     needs: tuple[bool, bool, bool, bool]):
    """Gradients ``(x, weight, att_src, att_dst)`` (None where ``needs`` is False) of :func:`project`.

    ``work = [z, grad_z]`` (``grad_z`` float[n, H, D], written over) is emptied: the caller drops its own
    references first, so each is freed here as soon as it has been used. The dropped input ``a`` is
    recomputed once ``z`` is gone (for the weight gradient), so at most three float[n, *] tensors live
    at once (``z``/``a``, ``grad_z``, the input's gradient) beside the caller's.
    """
    from hpc_graph.ops.dropout_linear import act_mask, act_mask_grad

    z, grad_z = work
    work.clear()
    grad_att_src = _head_grads(z, grad_s_src) if needs[2] else None
    grad_att_dst = _head_grads(z, grad_s_dst) if needs[3] else None
    del z
    grad_z.addcmul_(grad_s_src.unsqueeze(-1), att_src)  # the score paths, in place
    grad_z.addcmul_(grad_s_dst.unsqueeze(-1), att_dst)
    gz = grad_z.flatten(1)  # [n, H * D] (a view; n may be 0)
    del grad_z
    grad_w = None
    if needs[1]:
        a = x if mask is None else act_mask(x, *mask)
        grad_w = gz.t() @ a
        del a
    grad_x = None
    if needs[0]:
        grad_x = gz @ weight
        del gz
        if mask is not None:
            grad_x = act_mask_grad(x, grad_x, *mask)
    return grad_x, grad_w, grad_att_src, grad_att_dst


class GATProjected(torch.autograd.Function):
    """``out = GATProjected.apply(x, weight, att_src, att_dst, attend, mask)``: ``dropout(act(x))``, projection,
    scores and attention as one op keeping only ``x``.

    ``attend`` runs the attention itself: ``attend.forward(z, s_src, s_dst)`` -> the finalized
    :class:`AttentionState` and ``attend.backward(state, grad_out, z, s_src, s_dst)`` -> ``(grad_z, grad_s_src,
    grad_s_dst)`` (one CSR: :class:`WholeAttend`; SAR's blocks in rotation:
    :class:`hpc_graph.ops.sar_aggregate.SARAttend`). ``mask``: :func:`project`'s.

    Saved for the backward pass: ``x`` (referenced; usually alive anyway: the previous layer's output or
    the input features), the parameters, the output and the softmax state ``m``, ``l``. The dropped
    activation ``a``, the projection ``z`` and the scores are recomputed from ``x`` in the backward pass
    (one extra GEMM and two mask passes), so a hidden GAT layer keeps two N x H*D tensors (its output
    and, as the next layer's input, output + bias) instead of five; scores and attention-vector
    gradients are matrix-vector products per head, with no N x H x D temporaries.
    """

    @staticmethod
    def forward(ctx, x, weight, att_src, att_dst, attend, mask):
        with torch.no_grad():
            z, s_src, s_dst = project(x, weight, att_src, att_dst, mask)
            state = attend.forward(z, s_src.contiguous(), s_dst.contiguous())
            del z, s_src, s_dst
        ctx.save_for_backward(x, weight, att_src, att_dst, state.m, state.l, state.acc)
        ctx.attend, ctx.mask = attend, mask
        return state.acc

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, att_src, att_dst, m, l, out = ctx.saved_tensors
        with torch.no_grad():
            z, s_src, s_dst = project(x, weight, att_src, att_dst, ctx.mask)
            state = AttentionState(m, l, out, finalized=True)
            gz, gs, gd = ctx.attend.backward(state, grad_out.contiguous(), z, s_src.contiguous(), s_dst.contiguous())
            del state, s_src, s_dst
            work = [z, gz]
            del z, gz
            grads = project_backward(x, work, weight, att_src, att_dst, gs, gd, ctx.mask,
                                     tuple(ctx.needs_input_grad[:4]))
        return (*grads, None, None)


class WholeAttend:
    """:class:`GATProjected`'s attention over one CSR holding every source (a whole graph)."""

    def __init__(self, g: CSR, negative_slope: float, attn_dropout: float, seed: int, src_gid, dst_gid):
        self.g = g
        self.args = (negative_slope, attn_dropout, seed, src_gid, dst_gid)

    def forward(self, z, s_src, s_dst) -> AttentionState:
        state = init_state(self.g.num_dst, z.shape[1], z.shape[2], z.dtype, z.device)
        accumulate(state, self.g, z, s_src, s_dst, *self.args)
        finalize(state)
        return state

    def backward(self, state, grad_out, z, s_src, s_dst):
        delta = output_delta(state, grad_out)
        return backward_block(state, grad_out, delta, self.g, z, s_src, s_dst, *self.args)


def gat_projected(g: CSR, x: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor,
                  act: str | None = None, p: float = 0.0, negative_slope: float = 0.2, attn_dropout: float = 0.0,
                  seed: int = 0, src_gid: torch.Tensor | None = None, dst_gid: torch.Tensor | None = None,
                  training: bool = True, ids: torch.Tensor | None = None) -> torch.Tensor:
    """float[N, H, D]: a GAT layer (without bias) on a whole graph, keeping only ``x`` (:class:`GATProjected`).

    Args:
        g: CSR with ``num_src == num_dst`` (self loops included if wanted).
        x: float[N, F_in] dense; ``act`` (None, ``"relu"``, ``"elu"``) and feature dropout ``p`` are applied
            to it first, with the masks :func:`hpc_graph.ops.dropout.act_dropout` would draw.
        weight: float[H*D, F_in]; att_src, att_dst: float[1, H, D].
        negative_slope, attn_dropout, seed, src_gid, dst_gid, training: as for :func:`gat_attention`.
        ids: int64[N] row ids keying the feature dropout mask (:func:`hpc_graph.ops.dropout.dropout`), or None.
    """
    from hpc_graph.ops.dropout import row_ids
    from hpc_graph.ops.dropout_linear import mask_params

    if x.layout != torch.strided or x.dim() != 2 or x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"gat_projected: x must be a dense float [N, F_in] tensor, got {x.layout} {x.dtype} "
                         f"of shape {tuple(x.shape)}")
    if g.num_src != g.num_dst or x.shape[0] != g.num_src:
        raise ValueError(f"gat_projected: the graph must be square over x's {x.shape[0]} rows, got "
                         f"{g.num_dst} x {g.num_src}")
    if att_src.dim() != 3 or weight.shape != (att_src.shape[1] * att_src.shape[2], x.shape[1]):
        raise ValueError(f"gat_projected: weight {tuple(weight.shape)} must be [H*D, F_in] for att_src "
                         f"{tuple(att_src.shape)} and x {tuple(x.shape)}")
    mask = mask_params(float(p), act, row_ids(ids, x, "gat_projected"))
    q, seed = _check_dropout(float(attn_dropout) if training else 0.0, seed)
    return GATProjected.apply(x, weight, att_src, att_dst,
                              WholeAttend(g, float(negative_slope), q, seed, src_gid, dst_gid), mask)
