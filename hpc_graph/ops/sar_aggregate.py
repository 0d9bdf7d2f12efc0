"""Sequential aggregation and rematerialisation (SAR, Mostafa, MLSys'22): the autograd Functions.

Rank ``p`` of ``N`` aggregates its local block G_{p,p}, then the remote blocks
G_{p,q} one at a time in a rotation: at step ``k = 1..N-1`` it sends its rows to
``(p+k) % N`` and receives the rows of ``q = (p-k) % N`` (every rank talks to
one peer per direction per step, so the schedule cannot deadlock). At most one
remote block is resident, plus the next one when ``prefetch`` is on (its
exchange is started before the current block is computed: memory ~3/N of the
halo instead of 2/N). Autograd is off inside the aggregation: each Function's
forward saves only local tensors.

Backward, case 1 (``sum``/``mean``, i.e. GCN/SAGE): the gradient of the remote
rows ``A_{p,q}^T g`` does not depend on their values, so it is computed locally
and sent straight back to ``q`` (rotation in the other direction); no re-fetch.

Backward, case 2 (GAT): each remote block's ``z`` and ``s_src`` rows are fetched
again, the attention is recomputed block by block with the fused kernel's
block-wise backward (using the running max/denominator kept from the forward),
and the remote rows' gradients go back to their owner. No E x H attention
tensor is ever stored, and all halo rows are never resident at once.
"""
from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from hpc_graph.ops._kernel_args import csc
from hpc_graph.ops.attention_state import AttentionState
from hpc_graph.ops.gat_attention import (GATProjected, accumulate, backward_block, finalize, init_state,
                                         output_delta)
from hpc_graph.ops.spmm import spmm


def _steps(p: int, n: int) -> list[tuple[int, int]]:
    """Rotation schedule: step k -> ``(send_to, recv_from) = ((p+k) % n, (p-k) % n)``, k = 1..n-1."""
    return [((p + k) % n, (p - k) % n) for k in range(1, n)]


def _start(comm: Any, sends: dict, specs: dict, prefetch: bool, device: torch.device):
    """Start (prefetch) or run an exchange: a Request, a finished dict, or None when there is nothing to do."""
    if not sends and not specs:
        return None
    if prefetch:
        return comm.exchange_start(sends, specs, device=device)
    return comm.exchange(sends, specs, device=device)


def _finish(pending) -> dict:
    if pending is None:
        return {}
    if isinstance(pending, dict):
        return pending
    return pending.wait()


def _fetch_rotation(dg: Any, comm: Any, rows_for, feat: tuple[int, ...], dtype: torch.dtype,
                    prefetch: bool) -> Iterator[tuple[int, int, torch.Tensor | None]]:
    """Fetch the remote blocks' source rows one peer at a time.

    ``rows_for(q)`` returns float[send_count(q), *feat], the rows rank ``q`` needs from us.
    Yields ``(send_to, recv_from, rows)`` per step, ``rows`` float[recv_count(recv_from), *feat]
    or None when ``recv_from`` owns no halo row of ours. With ``prefetch`` the next step's
    exchange is in flight while the caller works on the current one.
    """
    steps = _steps(dg.part_id, dg.num_parts)

    def start(i: int):
        dst, src = steps[i]
        sends = {dst: rows_for(dst)} if dg.send_count(dst) else {}
        specs = {src: ((dg.recv_count[src], *feat), dtype)} if src in dg.recv_count else {}
        return _start(comm, sends, specs, prefetch, dg.device), sends

    pending = start(0) if steps and prefetch else None
    for i, (dst, src) in enumerate(steps):
        if prefetch:
            got = _finish(pending[0])
            pending = start(i + 1) if i + 1 < len(steps) else None
        else:
            got = _finish(start(i)[0])
        rows = got.get(src)
        del got
        yield dst, src, rows
        del rows


class _Returns:
    """Send remote rows' gradients back to their owners, one exchange per rotation step.

    Step ``(send_to, recv_from)`` of the fetch rotation becomes: send the gradient of
    ``recv_from``'s rows to ``recv_from``; receive from ``send_to`` the gradient of the
    rows we sent it, float[send_count(send_to), *feat], handed to ``add(send_to, rows)``
    (default: summed into ``grad`` at ``send_lid[send_to]``). With ``prefetch`` one
    return is left in flight while the next block is computed.
    """

    def __init__(self, dg: Any, comm: Any, grad: torch.Tensor | None, prefetch: bool, *,
                 feat: tuple[int, ...] | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | None = None, add=None):
        self.dg, self.comm, self.grad, self.prefetch = dg, comm, grad, prefetch
        self.feat = tuple(grad.shape[1:]) if feat is None else tuple(feat)
        self.dtype = grad.dtype if dtype is None else dtype
        self.device = grad.device if device is None else device
        self._add = add  # a closure over self here would be a reference cycle keeping grad alive until gc runs
        self._pending = None

    def _accumulate(self, q: int, rows: torch.Tensor) -> None:
        if self._add is not None:
            self._add(q, rows)
        else:
            self.grad.index_add_(0, self.dg.send_lid[q], rows)

    def push(self, send_to: int, recv_from: int, grad_rows: torch.Tensor | None) -> None:
        sends = {} if grad_rows is None else {recv_from: grad_rows.contiguous()}
        specs = ({send_to: ((self.dg.send_count(send_to), *self.feat), self.dtype)}
                 if self.dg.send_count(send_to) else {})
        self._drain()
        self._pending = (_start(self.comm, sends, specs, self.prefetch, self.device), sends)
        if not self.prefetch:
            self._drain()

    def _drain(self) -> None:
        if self._pending is not None:
            got = _finish(self._pending[0])
            self._pending = None
            for q, g in got.items():
                self._accumulate(q, g)
            del got

    def close(self) -> torch.Tensor | None:
        self._drain()
        grad, self.grad = self.grad, None
        return grad


class SARAggregate(torch.autograd.Function):
    """``out = SARAggregate.apply(x, dg, comm, reduce, prefetch)``: sum/mean over in-edges, block by block.

    Args:
        x: float[n, F] rows of owned nodes.
        dg: :class:`hpc_graph.graph.dist_graph.DistGraph` (blocks, plans, in-degree).
        comm: communicator (``exchange``, ``exchange_start``).
        reduce: ``"sum"`` or ``"mean"`` (divide by the global in-degree, 0 rows for none).
        prefetch: overlap the next block's exchange with the current block's compute.
    Returns:
        float[n, F]. Saves nothing but references to the graph (case 1 backward).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, dg: Any, comm: Any, reduce: str, prefetch: bool) -> torch.Tensor:
        if reduce not in ("sum", "mean"):
            raise ValueError(f"reduce: expected 'sum' or 'mean', got {reduce!r}")
        p = dg.part_id
        x = x.detach()
        out = spmm(dg.blocks[p], x, "sum")
        feat = tuple(x.shape[1:])
        for _, src, rows in _fetch_rotation(dg, comm, lambda q: x.index_select(0, dg.send_lid[q]),
                                             feat, x.dtype, prefetch):
            if rows is not None:
                out += spmm(dg.blocks[src], rows, "sum")
        if reduce == "mean":
            out /= dg.in_degree.clamp(min=1).to(out.dtype).view(-1, *([1] * len(feat)))
        ctx.dg, ctx.comm, ctx.reduce, ctx.prefetch = dg, comm, reduce, prefetch
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        dg, comm = ctx.dg, ctx.comm
        g = grad_out.contiguous()
        if ctx.reduce == "mean":
            g = g / dg.in_degree.clamp(min=1).to(g.dtype).view(-1, *([1] * (g.dim() - 1)))
        grad_x = spmm(dg.block_t(dg.part_id), g, "sum")
        returns = _Returns(dg, comm, grad_x, ctx.prefetch)
        for send_to, recv_from in _steps(dg.part_id, dg.num_parts):
            rows = spmm(dg.block_t(recv_from), g, "sum") if recv_from in dg.recv_count else None
            returns.push(send_to, recv_from, rows)
            del rows
        return returns.close(), None, None, None, None


def sar_aggregate(x: torch.Tensor, dg: Any, comm: Any, reduce: str = "sum",
                  prefetch: bool = False) -> torch.Tensor:
    """float[n, F] sum/mean of in-neighbour rows of ``x`` float[n, F] (see :class:`SARAggregate`)."""
    return SARAggregate.apply(x, dg, comm, reduce, prefetch)


def _pack(z: torch.Tensor, s: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """float[k, H*D + H]: rows of ``z`` float[n, H, D] and ``s`` float[n, H] in one message.

    Layout: the k rows of ``z`` (k*H*D values) followed by the k rows of ``s`` (k*H values),
    so that :func:`_unpack` returns contiguous views instead of copies. Gathered straight
    into the message buffer (no intermediate copies).
    """
    k = z.shape[0] if rows is None else int(rows.shape[0])
    heads, dim = int(z.shape[1]), int(z.shape[2])
    buf = z.new_empty((k, heads * dim + heads))
    flat = buf.view(-1)
    zv, sv = flat[:k * heads * dim].view(k, heads, dim), flat[k * heads * dim:].view(k, heads)
    if rows is None:
        zv.copy_(z)
        sv.copy_(s)
    else:
        torch.index_select(z, 0, rows, out=zv)
        torch.index_select(s, 0, rows, out=sv)
    return buf


def _unpack(packed: torch.Tensor, heads: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``(z float[k, H, D], s float[k, H])`` of a message written by :func:`_pack`."""
    k = int(packed.shape[0])
    flat = packed.reshape(-1)
    return flat[:k * heads * dim].view(k, heads, dim), flat[k * heads * dim:].view(k, heads)


def _gat_forward(z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, dg: Any, comm: Any, kw: dict,
                 add_self_loops: bool, prefetch: bool) -> AttentionState:
    """Forward attention over the local block (+ self loops), then the remote blocks in rotation.

    Returns the finalized state (``out`` float[n, H, D], ``m``, ``l`` float[n, H]).
    """
    n, heads, dim = z.shape
    state = init_state(n, heads, dim, z.dtype, z.device)
    accumulate(state, dg.blocks[dg.part_id], z, s_src, s_dst, src_gid=dg.orig_id, **kw)
    if add_self_loops:
        accumulate(state, dg.identity(), z, s_src, s_dst, src_gid=dg.orig_id, **kw)
    for _, src, rows in _fetch_rotation(dg, comm, lambda q: _pack(z, s_src, dg.send_lid[q]),
                                         (heads * dim + heads,), z.dtype, prefetch):
        if rows is not None:
            z_q, s_q = _unpack(rows, heads, dim)
            del rows
            accumulate(state, dg.blocks[src], z_q, s_q, s_dst, src_gid=dg.block_orig_id(src), **kw)
            del z_q, s_q
    finalize(state)
    return state


def _gat_backward(state: AttentionState, grad_out: torch.Tensor, z: torch.Tensor, s_src: torch.Tensor,
                  s_dst: torch.Tensor, dg: Any, comm: Any, kw: dict, add_self_loops: bool,
                  prefetch: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Case-2 backward: local blocks, then re-fetch each remote block, recompute, return its gradients.

    Returns ``(grad_z float[n, H, D], grad_s_src float[n, H], grad_s_dst float[n, H])``, the owned
    rows' gradients including those returned by the ranks that used them as halo.
    """
    _, heads, dim = z.shape
    g = grad_out.contiguous()
    delta = output_delta(state, g)
    for blk in dg.blocks.values():
        csc(blk, perm=False)  # the transposes backward_block walks, by counting sort (O(E), no sort temporaries)
    grad_z, grad_s_src, grad_s_dst = backward_block(state, g, delta, dg.blocks[dg.part_id], z, s_src,
                                                    s_dst, src_gid=dg.orig_id, **kw)
    if add_self_loops:
        gz, gs, gd = backward_block(state, g, delta, dg.identity(), z, s_src, s_dst, src_gid=dg.orig_id, **kw)
        grad_z += gz
        grad_s_src += gs
        grad_s_dst += gd
        del gz, gs, gd

    def add(q: int, packed: torch.Tensor) -> None:  # gradients of the rows we sent to q
        gz_q, gs_q = _unpack(packed, heads, dim)
        grad_z.index_add_(0, dg.send_lid[q], gz_q)
        grad_s_src.index_add_(0, dg.send_lid[q], gs_q)

    returns = _Returns(dg, comm, None, prefetch, feat=(heads * dim + heads,), dtype=z.dtype,
                       device=z.device, add=add)
    for send_to, src, rows in _fetch_rotation(dg, comm, lambda q: _pack(z, s_src, dg.send_lid[q]),
                                              (heads * dim + heads,), z.dtype, prefetch):
        grad_rows = None
        if rows is not None:
            z_q, s_q = _unpack(rows, heads, dim)
            del rows
            gz, gs, gd = backward_block(state, g, delta, dg.blocks[src], z_q, s_q, s_dst,
                                        src_gid=dg.block_orig_id(src), **kw)
            grad_s_dst += gd
            grad_rows = _pack(gz, gs)
            del z_q, s_q, gz, gs, gd
        returns.push(send_to, src, grad_rows)
        del grad_rows
    returns.close()
    return grad_z, grad_s_src, grad_s_dst


def _gat_kw(dg: Any, negative_slope: float, attn_dropout: float, seed: int) -> dict:
    return dict(negative_slope=float(negative_slope), attn_dropout=float(attn_dropout), seed=int(seed),
                dst_gid=dg.orig_id)


class SARGat(torch.autograd.Function):
    """``out = SARGat.apply(z, s_src, s_dst, dg, comm, negative_slope, attn_dropout, seed,
    add_self_loops, prefetch)``: GATv1 attention over in-edges, block by block.

    Args:
        z: float[n, H, D], s_src: float[n, H], s_dst: float[n, H] of owned nodes.
        dg, comm, prefetch: as for :class:`SARAggregate`.
        negative_slope, attn_dropout, seed: as for :func:`hpc_graph.ops.gat_attention.gat_attention`
            (dropout hashed on source-dataset ids, so it matches every other engine).
        add_self_loops: add the identity block (each node attends to itself).
    Returns:
        float[n, H, D]. Saves ``z``, ``s_src``, ``s_dst``, the output and the softmax
        state (running max ``m`` and denominator ``l``, float[n, H]): all local.
    """

    @staticmethod
    def forward(ctx, z, s_src, s_dst, dg, comm, negative_slope, attn_dropout, seed,
                add_self_loops, prefetch):
        z, s_src, s_dst = z.detach().contiguous(), s_src.detach().contiguous(), s_dst.detach().contiguous()
        kw = _gat_kw(dg, negative_slope, attn_dropout, seed)
        state = _gat_forward(z, s_src, s_dst, dg, comm, kw, add_self_loops, prefetch)
        ctx.save_for_backward(z, s_src, s_dst, state.m, state.l, state.acc)
        ctx.dg, ctx.comm, ctx.kw = dg, comm, kw
        ctx.add_self_loops, ctx.prefetch = add_self_loops, prefetch
        return state.acc

    @staticmethod
    def backward(ctx, grad_out):
        z, s_src, s_dst, m, l, out = ctx.saved_tensors
        state = AttentionState(m, l, out, finalized=True)
        grads = _gat_backward(state, grad_out, z, s_src, s_dst, ctx.dg, ctx.comm, ctx.kw, ctx.add_self_loops,
                              ctx.prefetch)
        return (*grads, None, None, None, None, None, None, None)


class SARAttend:
    """:class:`hpc_graph.ops.gat_attention.GATProjected`'s attention run block by block, as :class:`SARGat`
    (the local block and self loops, then the remote blocks in rotation, fetched again in the backward pass).

    With it a GAT layer under SAR rematerialises one step further than SAR's attention: the dropped input
    ``a = dropout(act(x))`` and the projected rows ``z = a W^T`` (float[n, H, D], as large as the layer's
    output) are not kept but recomputed from ``x``; the op keeps ``x``, the parameters, the output and
    ``m``, ``l``.
    """

    def __init__(self, dg: Any, comm: Any, negative_slope: float, attn_dropout: float, seed: int,
                 add_self_loops: bool, prefetch: bool):
        self.dg, self.comm = dg, comm
        self.kw = _gat_kw(dg, negative_slope, attn_dropout, seed)
        self.add_self_loops, self.prefetch = add_self_loops, prefetch

    def forward(self, z, s_src, s_dst) -> AttentionState:
        return _gat_forward(z.contiguous(), s_src, s_dst, self.dg, self.comm, self.kw, self.add_self_loops,
                            self.prefetch)

    def backward(self, state, grad_out, z, s_src, s_dst):
        return _gat_backward(state, grad_out, z.contiguous(), s_src, s_dst, self.dg, self.comm, self.kw,
                             self.add_self_loops, self.prefetch)


def sar_gat_projected(x: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor,
                      dg: Any, comm: Any, *, act: str | None = None, p: float = 0.0, negative_slope: float = 0.2,
                      attn_dropout: float = 0.0, seed: int = 0, add_self_loops: bool = True,
                      prefetch: bool = False, ids: torch.Tensor | None = None) -> torch.Tensor:
    """float[n, H, D]: ``dropout(act(x), p)`` and a GAT layer (without bias) whose backward recomputes the
    dropped input and ``z`` (:class:`~hpc_graph.ops.gat_attention.GATProjected` with :class:`SARAttend`);
    ``ids``: the rows' dataset ids keying the dropout mask (:func:`hpc_graph.ops.dropout.dropout`)."""
    from hpc_graph.ops.dropout import row_ids
    from hpc_graph.ops.dropout_linear import mask_params

    attend = SARAttend(dg, comm, negative_slope, attn_dropout, seed, add_self_loops, prefetch)
    return GATProjected.apply(x, weight, att_src, att_dst, attend,
                              mask_params(float(p), act, row_ids(ids, x, "sar_gat_projected")))


def sar_gat(z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, dg: Any, comm: Any, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True, prefetch: bool = False) -> torch.Tensor:
    """float[n, H, D] GAT attention aggregation run block by block (see :class:`SARGat`)."""
    return SARGat.apply(z, s_src, s_dst, dg, comm, negative_slope, attn_dropout, seed,
                        add_self_loops, prefetch)


# -- graph-transformer attention (dot products), block by block ------------------------------------
def _pack_kv(k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """float[r, H*Dk + H*Dv]: rows of ``k`` float[n, H, Dk] and ``v`` float[n, H, Dv] in one message."""
    if rows is not None:
        k, v = k.index_select(0, rows), v.index_select(0, rows)
    return torch.cat([k.flatten(1), v.flatten(1)], 1)


def _unpack_kv(packed: torch.Tensor, heads: int, dk: int, dv: int) -> tuple[torch.Tensor, torch.Tensor]:
    r = packed.shape[0]
    return (packed[:, :heads * dk].reshape(r, heads, dk).contiguous(),
            packed[:, heads * dk:].reshape(r, heads, dv).contiguous())


def _code_rows(table: torch.Tensor | None, code: int, count: int) -> torch.Tensor | None:
    """float[count, H]: every entry of a block gets the bias of one code (edges 1, self loops 0)."""
    return None if table is None else table[code].expand(count, -1).contiguous()


class SARDotAttention(torch.autograd.Function):
    """``out = SARDotAttention.apply(q, k, v, table, dg, comm, prefetch)``: softmax dot-product attention of the
    owned rows over their self loops and in-edges, block by block (the graph transformers' sparse layers).

    Args:
        q: float[n, H, Dk], k: float[n, H, Dk], v: float[n, H, Dv] of owned nodes.
        table: float[C, H] per-head bias table (row 0 self loops, row 1 edges) or None.
        dg, comm, prefetch: as for :class:`SARAggregate`.
    Forward: the local block and the self loops, then each remote block's k/v rows fetched in the
    rotation and folded into the online-softmax state. Backward (case 2): the remote rows are fetched
    again, each block's gradients recomputed from the saved max/denominator, and the k/v gradients of
    the remote rows sent back to their owners. Saves only local tensors.
    """

    @staticmethod
    def forward(ctx, q, k, v, table, dg, comm, prefetch):
        from hpc_graph.ops.dot_attention import accumulate as dot_accumulate
        from hpc_graph.ops.dot_attention import finalize as dot_finalize
        from hpc_graph.ops.dot_attention import init_state as dot_init

        q, k, v = q.detach().contiguous(), k.detach().contiguous(), v.detach().contiguous()
        tab = None if table is None else table.detach()
        n, heads, dk = q.shape
        dv = v.shape[2]
        scale = 1.0 / float(dk) ** 0.5
        state = dot_init(n, heads, dv, v.dtype, v.device)
        local = dg.blocks[dg.part_id]
        dot_accumulate(state, local, q, k, v, _code_rows(tab, 1, local.num_edges), scale)
        dot_accumulate(state, dg.identity(), q, k, v, _code_rows(tab, 0, n), scale)
        for _, src, rows in _fetch_rotation(dg, comm, lambda p: _pack_kv(k, v, dg.send_lid[p]),
                                            (heads * (dk + dv),), v.dtype, prefetch):
            if rows is not None:
                k_q, v_q = _unpack_kv(rows, heads, dk, dv)
                del rows
                blk = dg.blocks[src]
                dot_accumulate(state, blk, q, k_q, v_q, _code_rows(tab, 1, blk.num_edges), scale)
                del k_q, v_q
        out = dot_finalize(state)
        ctx.save_for_backward(q, k, v, tab if tab is not None else torch.empty(0), state.m, state.l, out)
        ctx.has_table, ctx.dg, ctx.comm, ctx.prefetch, ctx.scale = table is not None, dg, comm, prefetch, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from hpc_graph.ops.dot_attention import backward_block as dot_backward
        from hpc_graph.ops.dot_attention import output_delta as dot_delta

        q, k, v, tab, m, l, out = ctx.saved_tensors
        tab = tab if ctx.has_table else None
        dg, scale = ctx.dg, ctx.scale
        n, heads, dk = q.shape
        dv = v.shape[2]
        state = AttentionState(m, l, out, finalized=True)
        g = grad_out.contiguous()
        delta = dot_delta(state, g)
        local = dg.blocks[dg.part_id]
        gq, gk, gv, gb = dot_backward(state, g, delta, local, q, k, v, _code_rows(tab, 1, local.num_edges), scale)
        gtab = None if tab is None else torch.zeros_like(tab)
        if gtab is not None:
            gtab[1] += gb.sum(0)
        gq2, gk2, gv2, gb2 = dot_backward(state, g, delta, dg.identity(), q, k, v, _code_rows(tab, 0, n), scale)
        gq += gq2
        gk += gk2
        gv += gv2
        if gtab is not None:
            gtab[0] += gb2.sum(0)
        del gq2, gk2, gv2, gb2

        def add(p: int, packed: torch.Tensor) -> None:  # gradients of the k/v rows we sent to p
            gk_p, gv_p = _unpack_kv(packed, heads, dk, dv)
            gk.index_add_(0, dg.send_lid[p], gk_p)
            gv.index_add_(0, dg.send_lid[p], gv_p)

        returns = _Returns(dg, ctx.comm, None, ctx.prefetch, feat=(heads * (dk + dv),), dtype=v.dtype,
                           device=v.device, add=add)
        for send_to, src, rows in _fetch_rotation(dg, ctx.comm, lambda p: _pack_kv(k, v, dg.send_lid[p]),
                                                  (heads * (dk + dv),), v.dtype, ctx.prefetch):
            grad_rows = None
            if rows is not None:
                k_q, v_q = _unpack_kv(rows, heads, dk, dv)
                del rows
                blk = dg.blocks[src]
                gq3, gk_q, gv_q, gb3 = dot_backward(state, g, delta, blk, q, k_q, v_q,
                                                    _code_rows(tab, 1, blk.num_edges), scale)
                gq += gq3
                if gtab is not None:
                    gtab[1] += gb3.sum(0)
                grad_rows = _pack_kv(gk_q, gv_q)
                del k_q, v_q, gk_q, gv_q, gq3, gb3
            returns.push(send_to, src, grad_rows)
            del grad_rows
        returns.close()
        return gq, gk, gv, gtab, None, None, None


def sar_dot_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None, dg: Any,
                      comm: Any, prefetch: bool = False) -> torch.Tensor:
    """float[n, H, Dv]: sparse graph-transformer attention run block by block (see :class:`SARDotAttention`)."""
    return SARDotAttention.apply(q, k, v, table, dg, comm, prefetch)


# -- a layer's own message function, block by block ---------------------------------------------------
class SARSources:
    """The source blocks of :func:`hpc_graph.ops.message.message_passing` under SAR: the local block (and the
    self loops), then each remote partition's rows in the rotation, all ``src`` tensors in one message per peer.
    The backward pass fetches each remote block again and returns the gradients of its rows to their owner, as
    GAT's case-2 backward does; at most one remote block (two with ``prefetch``) is resident at a time."""

    def __init__(self, dg: Any, comm: Any, prefetch: bool, self_loops: bool):
        from hpc_graph.ops.message import edge_types

        self.dg, self.comm, self.prefetch, self.self_loops = dg, comm, prefetch, self_loops
        self.missing: dict[str, str] = {}
        self._types = {q: edge_types(b, dg._block_types.get(q)) for q, b in dg.blocks.items()}

    def _block(self, q: int, rows: dict):
        from hpc_graph.ops.message import SourceBlock

        b = self.dg.blocks[q]
        return SourceBlock(rows, b, b.edge_weight, self._types[q])

    def _local(self, src: dict) -> list:
        from hpc_graph.ops.message import SourceBlock

        out = [self._block(self.dg.part_id, src)]
        if self.self_loops:
            out.append(SourceBlock(src, self.dg.identity(), loop=True))
        return out

    @staticmethod
    def _message(src: dict) -> tuple[int, torch.dtype]:
        """Width and dtype of one packed row of every ``src`` tensor (:func:`~hpc_graph.ops.message.pack_rows`)."""
        return sum(math.prod(v.shape[1:]) for v in src.values()), next(iter(src.values())).dtype

    def _rotation(self, src: dict):
        from hpc_graph.ops.message import pack_rows, unpack_rows

        dg = self.dg
        width, dtype = self._message(src)
        for send_to, q, rows in _fetch_rotation(dg, self.comm, lambda p: pack_rows(src, dg.send_lid[p]), (width,),
                                                dtype, self.prefetch):
            yield send_to, q, None if rows is None else unpack_rows(rows, src)

    def forward(self, src: dict):
        yield from self._local(src)
        for _, q, rows in self._rotation(src):
            if rows is not None:
                yield self._block(q, rows)

    def backward(self, src: dict, grad_src: dict):
        from hpc_graph.ops.message import pack_rows, unpack_rows

        dg = self.dg
        for block in self._local(src):
            yield block, None

        def add(q: int, packed: torch.Tensor) -> None:  # gradients of the rows we sent to q
            for name, g in unpack_rows(packed, src).items():
                grad_src[name].index_add_(0, dg.send_lid[q], g)

        width, dtype = self._message(src)
        returns = _Returns(dg, self.comm, None, self.prefetch, feat=(width,), dtype=dtype, device=dg.device, add=add)
        for send_to, q, rows in self._rotation(src):
            grad_rows = None
            if rows is not None:
                got: list[dict] = []
                yield self._block(q, rows), got.append
                grad_rows = pack_rows(got[0])
                del got
            returns.push(send_to, q, grad_rows)
            del grad_rows
        returns.close()
