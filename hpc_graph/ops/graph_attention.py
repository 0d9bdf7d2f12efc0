"""``pattern_attention``: softmax attention over a sparse pattern, or over every pair without an S x S tensor.

Scores are ``scale * q_i . k_j + bias``, ``scale = 1/sqrt(d_k)``, one max-subtracted softmax per
(token, head), the same in both modes (TorchGT's two modes used different logit scales; ours cannot):

* ``dense=False``: the pattern's entries only (:func:`hpc_graph.ops.dot_attention.dot_attention`:
  the fused online-softmax kernels, O(E) time and memory, no E x H score tensor).
* ``dense=True``: every pair of node tokens plus the pattern (which holds the global token's
  entries). The pattern's entries, with their own bias, go through the same fused kernels; all
  other node pairs ("far" pairs, with the far bias) are folded into the **same** online-softmax
  state (running max, sum and numerator, :class:`~hpc_graph.ops.attention_state.AttentionState`),
  their pattern pairs masked so that no pair is counted twice. On the CPU a fused kernel does it
  (:mod:`numba_kernels.cpu.dense_attention`: scores, mask, exponentials and products per block of
  columns, no score tile in memory); on other devices ``tile x tile`` blocks of torch matrix
  products (at most one tile of scores kept). The result equals a dense softmax over the S x S
  matrix exactly (up to summation order); the backward pass recomputes the scores from the saved
  max and sum.

Shapes: q, k float[T, H, Dk], v float[T, H, Dv] for the ``T`` tokens of the pattern; the bias
is a per-entry float[E, H] (usually a per-head table indexed by the pattern's codes) and, for
the dense mode, a per-head float[H] for every pair outside the pattern.
"""
from __future__ import annotations

import math

import torch

from hpc_graph.ops._bridge import as_array, get_kernel
from hpc_graph.ops.attention_state import AttentionState, check_tensor
from hpc_graph.ops.dot_attention import accumulate, backward_block, dot_attention, finalize, init_state, output_delta
from hpc_graph.ops.csr import CSR

#: query and key rows per dense tile (scores of one tile: H x TILE x TILE floats)
TILE = 1024


def pattern_attention(pattern: CSR, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      bias: torch.Tensor | None = None, dense: bool = False, num_nodes: int | None = None,
                      far_bias: torch.Tensor | None = None, tile: int | None = None,
                      codes: torch.Tensor | None = None, fused: bool | None = None) -> torch.Tensor:
    """Attention of every token over its pattern entries (``dense=False``) or over all node pairs too.

    Args:
        pattern: CSR over the T tokens (row ``i`` lists the tokens ``i`` attends to).
        q, k: float[T, H, Dk]; v: float[T, H, Dv].
        bias: float[E, H] score bias per pattern entry, or None.
        dense: also attend to every node token outside the pattern.
        num_nodes: the node tokens, the first ``num_nodes`` (default: all T); the others (a global
            token) attend and are attended only through the pattern.
        far_bias: float[H] score bias of the pairs outside the pattern (dense only; default 0).
        tile: rows per dense tile (default :data:`TILE`; the torch-tile path only, used off the CPU or with
            ``fused=False``).
        codes: uint8[E] (sparse mode only): ``bias`` is then a per-head table float[C, H] and entry ``e``
            gets ``bias[codes[e]]`` inside the kernels (1 byte kept per entry instead of H floats).
        fused: dense mode: the far pairs through the fused CPU kernel (default: on CPU tensors) or through
            torch tiles (``False``; the only choice on other devices).
    Returns:
        float[T, H, Dv], differentiable in q, k, v, bias and far_bias.
    Raises:
        ValueError: shapes, dtypes or devices that do not match (before any kernel runs).
    """
    T = pattern.num_dst
    if pattern.num_src != T:
        raise ValueError(f"pattern_attention: the pattern must be square (tokens x tokens), got "
                         f"{pattern.num_dst} x {pattern.num_src}")
    check_tensor("v", v, (T, None, None), None, v.device)
    if v.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"pattern_attention: v dtype must be float32 or float64, got {v.dtype}")
    H = v.shape[1]
    check_tensor("q", q, (T, H, None), v.dtype, v.device)
    check_tensor("k", k, (T, H, q.shape[2]), v.dtype, v.device)
    if codes is not None:
        if dense:
            raise ValueError("pattern_attention: codes apply to the sparse mode only (gather the bias for dense)")
        return dot_attention(pattern, q, k, v, bias, codes=codes)
    if bias is not None:
        check_tensor("bias", bias, (pattern.num_edges, H), v.dtype, v.device)
    if not dense:
        if far_bias is not None:
            raise ValueError("pattern_attention: far_bias applies only with dense=True")
        return dot_attention(pattern, q, k, v, bias)
    n = T if num_nodes is None else int(num_nodes)
    if not 0 <= n <= T:
        raise ValueError(f"pattern_attention: num_nodes must be in [0, {T}], got {num_nodes}")
    if far_bias is None:
        far_bias = torch.zeros(H, dtype=v.dtype, device=v.device)
    check_tensor("far_bias", far_bias, (H,), v.dtype, v.device)
    t = TILE if tile is None else int(tile)
    if t < 1:
        raise ValueError(f"pattern_attention: tile must be >= 1, got {tile}")
    if fused is None:
        fused = not v.is_cuda
    elif fused and v.is_cuda:
        raise ValueError("pattern_attention: the fused dense kernel runs on the CPU only (fused=False on CUDA)")
    return _DenseMerged.apply(pattern, q.contiguous(), k.contiguous(), v.contiguous(),
                              None if bias is None else bias.contiguous(), far_bias, n, t if not fused else 0)


def _far_mask(pattern: CSR, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mptr int64[n+1], mcols int64[*])``: each node row's pattern entries among node columns, sorted
    (what the fused far-pair kernel must skip); built once per pattern and ``n``."""
    key = ("far_mask", n)
    if key not in pattern._cache:
        rows = torch.repeat_interleave(torch.arange(pattern.num_dst), pattern.in_degree().cpu())
        cols = pattern.indices.cpu().long()
        keep = (rows < n) & (cols < n)
        rows, cols = rows[keep], cols[keep]
        order = torch.argsort(rows * max(n, 1) + cols)
        rows, cols = rows[order], cols[order]
        mptr = torch.zeros(n + 1, dtype=torch.int64)
        mptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
        pattern._cache[key] = (mptr, cols.contiguous())
    return pattern._cache[key]


def _fused_far_forward(pattern: CSR, state: AttentionState, q, k, v, far_bias, scale: float, n: int) -> None:
    """Fold the far pairs into ``state`` with the fused CPU kernel."""
    mptr, mcols = _far_mask(pattern, n)
    kT = k[:n].permute(1, 2, 0).contiguous()
    vT = v[:n].permute(1, 2, 0).contiguous()
    get_kernel("dense_attention.accumulate_far", "cpu")(
        as_array(q), as_array(kT), as_array(vT), as_array(far_bias.detach().contiguous()), scale,
        mptr.numpy(), mcols.numpy(), n, as_array(state.m), as_array(state.l), as_array(state.acc))


def _fused_far_backward(pattern: CSR, q, k, v, far_bias, m, l, go, delta, gq, gk, gv, scale: float,
                        n: int) -> torch.Tensor:
    """Add the far pairs' gradients to ``gq``, ``gk``, ``gv`` (contiguous, in place); return ``grad_far`` [H]."""
    from numba_kernels.cpu.dense_attention import far_chunks

    mptr, mcols = _far_mask(pattern, n)
    H = q.shape[1]
    kT = k[:n].permute(1, 2, 0).contiguous()
    vT = v[:n].permute(1, 2, 0).contiguous()
    chunks = far_chunks(n, H)
    gkT = torch.zeros((chunks,) + tuple(kT.shape), dtype=q.dtype)
    gvT = torch.zeros((chunks,) + tuple(vT.shape), dtype=q.dtype)
    gfar = torch.zeros(chunks, H, dtype=q.dtype)
    get_kernel("dense_attention.backward_far", "cpu")(
        as_array(q), as_array(kT), as_array(vT), as_array(far_bias.detach().contiguous()), scale,
        mptr.numpy(), mcols.numpy(), n, as_array(m), as_array(l), as_array(go), as_array(delta), as_array(gq),
        as_array(gkT), as_array(gvT), as_array(gfar))
    gk[:n] += gkT.sum(0).permute(2, 0, 1)
    gv[:n] += gvT.sum(0).permute(2, 0, 1)
    return gfar.sum(0)


def _tile_masks(pattern: CSR, n: int, t: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per query tile: the (local row, column) of its pattern entries among node columns, sorted by column."""
    rows = torch.repeat_interleave(torch.arange(pattern.num_dst, device=pattern.device), pattern.in_degree())
    cols = pattern.indices
    keep = (rows < n) & (cols < n)
    rows, cols = rows[keep], cols[keep]
    out = []
    for r0 in range(0, n, t):
        sel = (rows >= r0) & (rows < r0 + t)
        r, c = rows[sel] - r0, cols[sel]
        order = torch.argsort(c, stable=True)
        out.append((r[order], c[order]))
    return out


def _tiles(n: int, t: int, masks):
    """Yield ``(r0, r1, c0, c1, rows, cols)``: the dense tiles and the pattern pairs inside each one."""
    for qi, r0 in enumerate(range(0, n, t)):
        r, c = masks[qi]
        bounds = torch.searchsorted(c, torch.arange(0, n + t, t, device=c.device)).tolist()
        for ci, c0 in enumerate(range(0, n, t)):
            a, b = bounds[ci], bounds[ci + 1]
            yield r0, min(n, r0 + t), c0, min(n, c0 + t), r[a:b], c[a:b] - c0


def _scores(q, k, far_bias, scale, r0, r1, c0, c1, rows, cols):
    """float[H, r1-r0, c1-c0]: the tile's scores, pattern pairs set to -inf."""
    s = torch.matmul(q[r0:r1].transpose(0, 1), k[c0:c1].transpose(0, 1).transpose(1, 2)) * scale
    s += far_bias.view(-1, 1, 1)
    if rows.numel():
        s[:, rows, cols] = float("-inf")
    return s


def _merge_tile(state: AttentionState, s: torch.Tensor, v: torch.Tensor, r, c) -> None:
    """Fold the scores ``s`` float[H, tr, tc] (-inf: not a pair) of the query rows ``r`` against the key rows
    ``c`` (each a slice or a tensor of distinct token ids) into the online-softmax ``state`` (in place)."""
    m, l, acc = state.m, state.l, state.acc  # [T, H], [T, H], [T, H, Dv]
    m_old = m[r].t()  # [H, tr]
    m_new = torch.maximum(m_old, s.amax(-1))
    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m_old - safe)  # 0 where nothing was seen before
    p = torch.exp(s - safe.unsqueeze(-1))
    l[r] = (l[r].t() * alpha + p.sum(-1)).t()
    acc[r] = (acc[r].permute(1, 0, 2) * alpha.unsqueeze(-1)
              + torch.matmul(p, v[c].transpose(0, 1))).permute(1, 0, 2)
    m[r] = m_new.t()


def _safe_m_inv_l(m: torch.Tensor, l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    safe_m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    inv_l = torch.where(l > 0, 1.0 / l.clamp(min=torch.finfo(l.dtype).tiny), torch.zeros_like(l))
    return safe_m, inv_l


def _tile_backward(s, safe_m, inv_l, go, delta, q, k, v, gq, gk, gv, scale, r, c) -> torch.Tensor:
    """Add one tile's share to ``gq``, ``gk``, ``gv`` (in place; ``r``, ``c`` as for :func:`_merge_tile`) from
    its recomputed scores ``s`` float[H, tr, tc]; return ``scale * d loss / d score`` (0 where ``s`` is -inf)."""
    p = torch.exp(s - safe_m[r].t().unsqueeze(-1)) * inv_l[r].t().unsqueeze(-1)  # [H, tr, tc]
    go_r = go[r].transpose(0, 1)  # [H, tr, Dv]
    gv[c] += torch.matmul(p.transpose(1, 2), go_r).transpose(0, 1)
    dp = torch.matmul(go_r, v[c].transpose(0, 1).transpose(1, 2))  # [H, tr, tc]
    ds = p * (dp - delta[r].t().unsqueeze(-1))
    ds *= scale
    gq[r] += torch.matmul(ds, k[c].transpose(0, 1)).transpose(0, 1)
    gk[c] += torch.matmul(ds.transpose(1, 2), q[r].transpose(0, 1)).transpose(0, 1)
    return ds


class _DenseMerged(torch.autograd.Function):
    """Pattern entries through the sparse kernels + all other node pairs (fused CPU kernel when ``t == 0``,
    else torch tiles of ``t`` rows), one softmax state."""

    @staticmethod
    def forward(ctx, pattern: CSR, q, k, v, bias, far_bias, n: int, t: int):
        scale = 1.0 / math.sqrt(q.shape[2])
        state = init_state(pattern.num_dst, v.shape[1], v.shape[2], v.dtype, v.device)
        accumulate(state, pattern, q, k, v, bias, scale)
        masks = None
        if t == 0:
            _fused_far_forward(pattern, state, q, k, v, far_bias, scale, n)
        else:
            masks = _tile_masks(pattern, n, t)
            for r0, r1, c0, c1, rows, cols in _tiles(n, t, masks):
                _merge_tile(state, _scores(q, k, far_bias, scale, r0, r1, c0, c1, rows, cols), v,
                            slice(r0, r1), slice(c0, c1))
        out = finalize(state)
        ctx.save_for_backward(q, k, v, bias, far_bias, state.m, state.l, out)
        ctx.pattern, ctx.n, ctx.t, ctx.scale, ctx.masks = pattern, n, t, scale, masks
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, far_bias, m, l, out = ctx.saved_tensors
        go = grad_out.contiguous()
        state = AttentionState(m, l, out, finalized=True)
        delta = output_delta(state, go)
        gq, gk, gv, gb = backward_block(state, go, delta, ctx.pattern, q, k, v, bias, ctx.scale)
        if ctx.t == 0:
            gq, gk, gv = gq.contiguous(), gk.contiguous(), gv.contiguous()
            gfar = _fused_far_backward(ctx.pattern, q, k, v, far_bias, m, l, go, delta.contiguous(), gq, gk, gv,
                                       ctx.scale, ctx.n)
            return None, gq, gk, gv, gb, gfar, None, None
        gfar = torch.zeros_like(far_bias)
        safe_m, inv_l = _safe_m_inv_l(m, l)
        for r0, r1, c0, c1, rows, cols in _tiles(ctx.n, ctx.t, ctx.masks):
            s = _scores(q, k, far_bias, ctx.scale, r0, r1, c0, c1, rows, cols)
            ds = _tile_backward(s, safe_m, inv_l, go, delta, q, k, v, gq, gk, gv, ctx.scale, slice(r0, r1),
                                slice(c0, c1))
            gfar += ds.sum((1, 2)) / ctx.scale
        return None, gq, gk, gv, gb, gfar, None, None


def code_bias(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """float[E, H] = ``table[codes]``: a per-head bias table indexed by 1-byte per-entry codes.

    ``table`` float[C, H] (differentiable), ``codes`` uint8/int[E] in ``[0, C)``. The backward sums the
    entries' gradients per code (C masked sums), with no E-sized int64 index kept.
    """
    if table.dim() != 2 or codes.dim() != 1:
        raise ValueError(f"code_bias: table must be [C, H] and codes [E], got {tuple(table.shape)} and "
                         f"{tuple(codes.shape)}")
    return _CodeBias.apply(table, codes)


class _CodeBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, codes):
        ctx.save_for_backward(codes)
        ctx.num_codes = table.shape[0]
        return table.index_select(0, codes.to(torch.int32))

    @staticmethod
    def backward(ctx, grad):
        (codes,) = ctx.saved_tensors
        out = grad.new_zeros(ctx.num_codes, grad.shape[1])
        for c in range(ctx.num_codes):
            out[c] = grad[codes == c].sum(0)
        return out, None


# -- the cluster-sparse layout ---------------------------------------------------------------------
def cluster_attention(sparse: CSR, sparse_ids: torch.Tensor, blocks: list, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pattern attention with the pattern split into a CSR part and dense blocks (TorchGT's cluster-sparse
    layout, exact): equal to :func:`pattern_attention` over the union of the two parts.

    Args:
        sparse: CSR over the T tokens with the entries outside the dense blocks.
        sparse_ids: int64[sparse.num_edges] the pattern-order index of each of its entries.
        blocks: ``(rid, cid, rows, cols, ids)`` per dense block: its query tokens ``rid`` and key tokens
            ``cid`` (int64, distinct; a cluster each), its pattern entries as positions ``rows`` in ``rid``
            and ``cols`` in ``cid``, and their pattern-order indices ``ids``. The block's scores are one dense
            tile (matrix products); every pair of the tile that is not an entry is masked (-inf), so no pair
            is added and none is lost.
        q, k: float[T, H, Dk]; v: float[T, H, Dv]; bias: float[E, H] per entry in pattern order, or None.
    Returns:
        float[T, H, Dv], differentiable in q, k, v and bias.
    """
    T = sparse.num_dst
    check_tensor("v", v, (T, None, None), None, v.device)
    H = v.shape[1]
    check_tensor("q", q, (T, H, None), v.dtype, v.device)
    check_tensor("k", k, (T, H, q.shape[2]), v.dtype, v.device)
    if bias is not None:
        n_entries = sparse.num_edges + sum(int(b[4].numel()) for b in blocks)
        check_tensor("bias", bias, (n_entries, H), v.dtype, v.device)
    return _ClusterSparse.apply(sparse, sparse_ids, blocks, q.contiguous(), k.contiguous(), v.contiguous(),
                                None if bias is None else bias.contiguous())


def _block_scores(q, k, bias, scale, rid, cid, rows, cols, ids):
    """float[H, tr, tc]: a dense block's tile, -inf except at its entries (which get their bias)."""
    s = torch.matmul(q[rid].transpose(0, 1), k[cid].transpose(0, 1).transpose(1, 2)) * scale
    out = torch.full_like(s, float("-inf"))
    kept = s[:, rows, cols]
    out[:, rows, cols] = kept if bias is None else kept + bias[ids].t()
    return out


class _ClusterSparse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sparse: CSR, sparse_ids, blocks, q, k, v, bias):
        scale = 1.0 / math.sqrt(q.shape[2])
        state = init_state(sparse.num_dst, v.shape[1], v.shape[2], v.dtype, v.device)
        b_sparse = None if bias is None else bias.index_select(0, sparse_ids)
        accumulate(state, sparse, q, k, v, b_sparse, scale)
        for rid, cid, rows, cols, ids in blocks:
            _merge_tile(state, _block_scores(q, k, bias, scale, rid, cid, rows, cols, ids), v, rid, cid)
        out = finalize(state)
        ctx.save_for_backward(q, k, v, bias, state.m, state.l, out)
        ctx.sparse, ctx.sparse_ids, ctx.blocks, ctx.scale = sparse, sparse_ids, blocks, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, m, l, out = ctx.saved_tensors
        go = grad_out.contiguous()
        state = AttentionState(m, l, out, finalized=True)
        delta = output_delta(state, go)
        b_sparse = None if bias is None else bias.index_select(0, ctx.sparse_ids)
        gq, gk, gv, gbs = backward_block(state, go, delta, ctx.sparse, q, k, v, b_sparse, ctx.scale)
        gb = None
        if bias is not None:
            gb = torch.zeros_like(bias)
            gb[ctx.sparse_ids] = gbs
        safe_m, inv_l = _safe_m_inv_l(m, l)
        for rid, cid, rows, cols, ids in ctx.blocks:
            s = _block_scores(q, k, bias, ctx.scale, rid, cid, rows, cols, ids)
            ds = _tile_backward(s, safe_m, inv_l, go, delta, q, k, v, gq, gk, gv, ctx.scale, rid, cid)
            if gb is not None:
                gb[ids] = ds[:, rows, cols].t() / ctx.scale
        return None, None, None, gq, gk, gv, gb
