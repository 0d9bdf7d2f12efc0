"""Generic message passing: a per-edge function of one's own, reduced over each node's in-edges, on every engine.

A layer gives tensors over its input rows (``src``) and output rows (``dst``) and a *message function* of a batch
of edges (:class:`Edges`). The graph walks its edges in chunks; for each chunk it gathers the source and
destination rows of its edges, calls the function and folds the result into the output:

* ``sum``  : ``out_i = sum_{j -> i} m_ij``                       message float[E, *F] -> out float[n, *F]
* ``mean`` : the sum divided by the in-degree of ``i`` in the whole graph (counting the self loop when added)
* ``softmax``: the message is a pair ``(score float[E, H], value float[E, H, *D])`` and
  ``out_i = sum_j softmax_j(score_ij) value_ij`` over ``i``'s in-edges (GAT-style attention: any score
  function of both ends, e.g. GATv2's ``a . LeakyReLU(W_l x_j + W_r x_i)``)

Memory: nothing per edge is kept for the backward pass. The forward runs without autograd; the backward walks
the same chunks again, recomputes each chunk's messages with autograd on and differentiates them (the
rematerialisation SAR applies to its remote blocks, here applied to every edge): a layer keeps its inputs and
output (plus the softmax's running max and denominator, float[n, H]) instead of E x F messages, at the price of
computing the messages twice. The largest transient is one chunk's messages and their gradients
(:func:`chunk_edges`: a few MiB, so that they stay in the cache from one op to the next).

Rules for the message function: it must be deterministic (it runs again in the backward pass: a random draw inside
it must be keyed, not drawn from a stream), and the trainable tensors it uses must reach the op, as the
parameters of the module the function belongs to (a module or a bound method) or through ``params``: the op returns
their gradients. A tensor it captures in any other way gets no gradient.

Where the source rows come from is a :class:`Sources` (the engines provide them): one local block (a whole graph,
a rank's ``[owned | halo]`` columns, a sampled block) or, for ``sar``, the local block and then each remote
partition's rows in a rotation, fetched again in the backward pass.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from hpc_graph.comm.malloc import heap_blocks
from hpc_graph.ops.csr import CSR

#: bytes of gathered end-point rows per chunk (the chunk's edges times the bytes of one edge's source and destination
#: rows): a few MiB keep a chunk's messages and their temporaries in the cache between the ops that make them
CHUNK_BYTES = 8 << 20
#: edges per chunk when set (tests use tiny chunks); None: from :data:`CHUNK_BYTES`, within [1024, 131072]
CHUNK_EDGES: int | None = None


def chunk_edges(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> int:
    """Edges per chunk for these end-point tensors (:data:`CHUNK_EDGES`, else :data:`CHUNK_BYTES` over the bytes
    one edge gathers)."""
    if CHUNK_EDGES is not None:
        return int(CHUNK_EDGES)
    row = sum(math.prod(t.shape[1:]) * t.element_size() for t in (*src.values(), *dst.values()))
    return int(min(1 << 17, max(1024, CHUNK_BYTES // max(1, row))))

REDUCES = ("sum", "mean", "softmax")


class Edges:
    """A batch of ``E`` edges ``j -> i`` handed to a message function.

    Attributes:
        src: ``{name: float[E, ...]}`` the source end's rows of every tensor given as ``src``.
        dst: ``{name: float[E, ...]}`` the destination end's rows of every tensor given as ``dst``.
        loop: True for the batch of self loops ``i -> i`` (``self_loops=True``): ``src`` rows are then the
            node's own input rows; such a batch has no dataset weight or type (:attr:`weight` is all ones,
            :attr:`type` raises).
    """

    __slots__ = ("src", "dst", "loop", "_weight", "_type", "_missing")

    def __init__(self, src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], weight: torch.Tensor | None,
                 etype: torch.Tensor | None, loop: bool, missing: dict[str, str]):
        self.src, self.dst, self.loop = src, dst, loop
        self._weight, self._type, self._missing = weight, etype, missing

    def __len__(self) -> int:
        for t in (*self.src.values(), *self.dst.values()):
            return int(t.shape[0])
        return 0 if self._weight is None else int(self._weight.shape[0])

    @property
    def weight(self) -> torch.Tensor:
        """float[E]: each edge's ``/graph/edge_weight`` (ones for self loops)."""
        if self._weight is None:
            raise ValueError(self._missing.get("weight", "message function: the graph has no edge weights "
                                                         "(/graph/edge_weight)"))
        return self._weight

    @property
    def type(self) -> torch.Tensor:
        """int64[E]: each edge's ``/graph/edge_type`` relation, in ``[0, graph.num_relations)``."""
        if self.loop:
            raise ValueError("message function: self loops have no edge type; pass self_loops=False or branch on "
                             "edges.loop")
        if self._type is None:
            raise ValueError(self._missing.get("type", "message function: the graph has no edge types "
                                                       "(/graph/edge_type)"))
        return self._type


@dataclasses.dataclass
class SourceBlock:
    """Edges into the ``n`` output rows from one set of source rows.

    Attributes:
        rows: ``{name: float[k, ...]}`` the source rows this block's columns index.
        csr: ``n`` rows over ``k`` columns.
        weight: float[E] or None; etype: int64[E] or None (in ``csr``'s edge order).
        loop: the self-loop block (column ``i`` of row ``i``).
        scale: float[n] factor applied to this block's sum (a sampled block's ``deg / sampled``), or None.
    """

    rows: dict[str, torch.Tensor]
    csr: CSR
    weight: torch.Tensor | None = None
    etype: torch.Tensor | None = None
    loop: bool = False
    scale: torch.Tensor | None = None


class Sources:
    """Where one call's source rows come from. ``forward(src)`` yields :class:`SourceBlock` s; ``backward(src,
    grad_src)`` yields ``(block, give)`` pairs, the op calls ``give(grads)`` with the gradients of ``block.rows``
    (``{name: float[k, ...]}``) before asking for the next block (a block whose ``rows`` is ``src`` itself gets
    no call: the op adds its gradients into ``grad_src`` directly), and ``grad_src`` holds the gradients of ``src``
    once the iteration ends. ``missing`` names, per edge field, why it is unavailable."""

    missing: dict[str, str] = {}

    def forward(self, src: dict[str, torch.Tensor]) -> Iterator[SourceBlock]:
        raise NotImplementedError

    def backward(self, src: dict[str, torch.Tensor], grad_src: dict[str, torch.Tensor]
                 ) -> Iterator[tuple[SourceBlock, Callable[[dict], None]]]:
        raise NotImplementedError


def loop_csr(n: int, k: int, device: torch.device | str) -> CSR:
    """``n`` rows over ``k >= n`` columns with the one edge ``i -> i`` per row (the self loops over input rows
    whose first ``n`` are the output nodes)."""
    return CSR(torch.arange(n + 1, device=device), torch.arange(n, device=device), k, validate=False)


class LocalSources(Sources):
    """One local block: every edge's source row is a row of ``src`` itself (a whole graph, a rank's ``[owned |
    halo]`` columns, a sampled block), plus the self loops over its first ``n`` rows when asked."""

    def __init__(self, csr: CSR, weight: torch.Tensor | None = None, etype: torch.Tensor | None = None,
                 self_loops: bool = False, scale: torch.Tensor | None = None, missing: dict[str, str] | None = None):
        self.csr, self.weight, self.etype, self.self_loops, self.scale = csr, weight, etype, self_loops, scale
        self.missing = missing or {}

    def _blocks(self, src: dict[str, torch.Tensor]) -> list[SourceBlock]:
        out = [SourceBlock(src, self.csr, self.weight, self.etype, scale=self.scale)]
        if self.self_loops:
            n, k = self.csr.num_dst, self.csr.num_src
            if "loops" not in self.csr._cache:
                self.csr._cache["loops"] = loop_csr(n, k, self.csr.device)
            out.append(SourceBlock(src, self.csr._cache["loops"], loop=True))
        return out

    def forward(self, src):
        yield from self._blocks(src)

    def backward(self, src, grad_src):
        for block in self._blocks(src):
            yield block, None  # its rows are src: the op adds their gradients into grad_src itself


def _chunks(csr: CSR, limit: int) -> list[tuple[int, int, int, int]]:
    """``(lo, hi, e0, e1)``: row ranges ``[lo, hi)`` of ``csr`` holding at most ``limit`` edges each (a row with
    more is one range), their edges ``[e0, e1)``; at least one range. A CSR of sizes only (planning) is cut into
    as many even ranges as its edge count needs."""
    key = ("message_chunks", limit)
    if key not in csr._cache:
        n, e = csr.num_dst, csr.num_edges
        if csr.is_shape_only:
            k = max(1, -(-e // limit))
            out = [(n * i // k, n * (i + 1) // k, e * i // k, e * (i + 1) // k) for i in range(k)]
        else:
            ptr = csr.indptr.cpu()
            bounds = [0]
            while bounds[-1] < n:
                lo = bounds[-1]
                hi = int(torch.searchsorted(ptr, ptr[lo] + limit, right=True)) - 1
                bounds.append(min(n, max(hi, lo + 1)))
            out = [(lo, hi, int(ptr[lo]), int(ptr[hi])) for lo, hi in zip(bounds[:-1], bounds[1:])] or [(0, 0, 0, 0)]
        csr._cache[key] = out
    return csr._cache[key]


def _edge_rows(csr: CSR, lo: int, hi: int, e0: int, e1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows int64[e], cols int64[e])``: destination and source of the edges ``[e0, e1)`` of rows ``[lo, hi)``
    (meta tensors of those sizes on a CSR of sizes only)."""
    if csr.is_shape_only:
        return (torch.empty(e1 - e0, dtype=torch.int64, device="meta"),
                torch.empty(e1 - e0, dtype=torch.int64, device="meta"))
    deg = csr.indptr[lo + 1:hi + 1] - csr.indptr[lo:hi]
    rows = torch.repeat_interleave(torch.arange(lo, hi, device=csr.device), deg, output_size=e1 - e0)
    return rows, csr.indices[e0:e1].to(torch.int64)


@dataclasses.dataclass
class _Spec:
    message: Callable[[Edges], Any]
    src_names: tuple[str, ...]
    dst_names: tuple[str, ...]
    num_params: int
    reduce: str
    sources: Sources
    num_out: int
    degree: torch.Tensor | None  # float[n] the mean's divisor
    chunk: int


def _edge_fields(block: SourceBlock, e0: int, e1: int, rows: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(weight float[e] or None, type int64[e] or None)`` of edges ``[e0, e1)`` of ``block`` (self loops:
    weights of one, no type)."""
    if block.loop:
        return torch.ones(rows.shape[0], dtype=dtype, device=rows.device), None
    weight = None if block.weight is None else block.weight[e0:e1].to(dtype)
    etype = None if block.etype is None else block.etype[e0:e1].to(torch.int64)
    return weight, etype


def _check_softmax(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError("message_passing(reduce='softmax'): the message function must return (score float[E, H], "
                         f"value float[E, H, ...]), got {type(out).__name__}")
    score, value = out
    if score.dim() != 2 or value.dim() < 2 or tuple(value.shape[:2]) != tuple(score.shape):
        raise ValueError(f"message_passing(reduce='softmax'): score must be [E, H] and value [E, H, ...], got "
                         f"{tuple(score.shape)} and {tuple(value.shape)}")
    return score, value


def _check_message(out: Any) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"message_passing: the message function must return a tensor float[E, ...], got "
                         f"{type(out).__name__} (a (score, value) pair needs reduce='softmax')")
    return out


def _expand(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.view(t.shape + (1,) * (like.dim() - t.dim()))


class _MessagePassing(torch.autograd.Function):
    """``out = _MessagePassing.apply(spec, *src, *dst, *params)``; see :func:`message_passing`."""

    @staticmethod
    def forward(ctx, spec: _Spec, *tensors):
        ns, nd = len(spec.src_names), len(spec.dst_names)
        src = dict(zip(spec.src_names, (t.detach() for t in tensors[:ns])))
        dst = dict(zip(spec.dst_names, (t.detach() for t in tensors[ns:ns + nd])))
        dtype = next((t.dtype for t in tensors if t.is_floating_point()), torch.get_default_dtype())
        n, soft = spec.num_out, spec.reduce == "softmax"
        out = m = den = None
        with torch.no_grad(), heap_blocks():
            for block in spec.sources.forward(src):
                for lo, hi, e0, e1 in _chunks(block.csr, spec.chunk):  # each chunk: a range of output rows
                    rows, cols = _edge_rows(block.csr, lo, hi, e0, e1)
                    r = rows - lo
                    msg = spec.message(Edges({k: v.index_select(0, cols) for k, v in block.rows.items()},
                                             {k: v.index_select(0, rows) for k, v in dst.items()},
                                             *_edge_fields(block, e0, e1, rows, dtype), block.loop,
                                             spec.sources.missing))
                    if soft:
                        score, value = _check_softmax(msg)
                        if out is None:
                            out = value.new_zeros((n,) + tuple(value.shape[1:]))
                            m = score.new_full((n, score.shape[1]), float("-inf"))
                            den = score.new_zeros((n, score.shape[1]))
                        # online softmax: what the rows hold so far is rescaled to the new running max
                        ms, ls, os_ = m[lo:hi], den[lo:hi], out[lo:hi]
                        new = ms.clone().scatter_reduce_(0, r.unsqueeze(1).expand_as(score), score, "amax")
                        keep = torch.where(torch.isinf(ms), torch.zeros_like(ms), torch.exp(ms - new))
                        ls.mul_(keep)
                        os_.mul_(_expand(keep, os_))
                        e = torch.exp(score - new.index_select(0, r))
                        ls.index_add_(0, r, e)
                        os_.index_add_(0, r, _expand(e, value) * value)
                        ms.copy_(new)
                        del score, value, e
                    else:
                        msg = _check_message(msg)
                        if out is None:
                            out = msg.new_zeros((n,) + tuple(msg.shape[1:]))
                        if block.scale is not None:
                            msg = msg * _expand(block.scale[rows].to(msg.dtype), msg)
                        out[lo:hi].index_add_(0, r, msg)
                    del msg
            if soft:
                out.div_(_expand(torch.where(den > 0, den, torch.ones_like(den)), out))
            elif spec.reduce == "mean":
                out.div_(_expand(spec.degree.clamp(min=1).to(out.dtype), out))
        ctx.spec = spec
        ctx.save_for_backward(*tensors, out, *(() if m is None else (m, den)))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        spec = ctx.spec
        saved = ctx.saved_tensors
        ns, nd, npar = len(spec.src_names), len(spec.dst_names), spec.num_params
        inputs, out = saved[:ns + nd + npar], saved[ns + nd + npar]
        src = dict(zip(spec.src_names, (t.detach() for t in inputs[:ns])))
        dst = dict(zip(spec.dst_names, (t.detach() for t in inputs[ns:ns + nd])))
        params = list(inputs[ns + nd:])
        trainable = [p for p in params if p.requires_grad]
        soft = spec.reduce == "softmax"
        g = grad_out.contiguous()
        if soft:
            m, den = saved[ns + nd + npar + 1:]
            safe_l = torch.where(den > 0, den, torch.ones_like(den))
            # g_i . out_i per row and head, float[n, H]: each edge of row i reads it (d score = a (g.v - g.out))
            g_out = (g * out).reshape(out.shape[0], out.shape[1], -1).sum(-1)
        if spec.reduce == "mean":
            g = g / _expand(spec.degree.clamp(min=1).to(g.dtype), g)
        grad_src = {k: torch.zeros_like(v) for k, v in src.items()}
        grad_dst = {k: torch.zeros_like(v) for k, v in dst.items()}
        grad_par: list[torch.Tensor | None] = [None] * len(trainable)
        with heap_blocks():
            _backward_blocks(spec, src, dst, grad_src, grad_dst, grad_par, trainable, g, out,
                             (m, safe_l, g_out) if soft else None)
        it = iter(grad_par)
        par = [next(it) if p.requires_grad else None for p in params]
        return (None, *[grad_src[k] for k in spec.src_names], *[grad_dst[k] for k in spec.dst_names], *par)


def _backward_blocks(spec: _Spec, src: dict, dst: dict, grad_src: dict, grad_dst: dict, grad_par: list,
                     trainable: list, g: torch.Tensor, out: torch.Tensor, soft: tuple | None) -> None:
    """Walk the sources again, recompute each chunk's messages with autograd on and add their gradients into
    ``grad_src``, ``grad_dst`` and ``grad_par`` (``soft``: the softmax's ``(max, denominator, g . out)``)."""
    if soft is not None:
        m, safe_l, g_out = soft
    for block, give in spec.sources.backward(src, grad_src):
            # a block over src itself adds straight into grad_src (give is then not called)
            own = block.rows is src
            grad_rows = grad_src if own else {k: torch.zeros_like(v) for k, v in block.rows.items()}
            for lo, hi, e0, e1 in _chunks(block.csr, spec.chunk):
                rows, cols = _edge_rows(block.csr, lo, hi, e0, e1)
                if rows.numel() == 0:
                    continue
                with torch.enable_grad():
                    src_e = {k: v.index_select(0, cols).requires_grad_() for k, v in block.rows.items()}
                    dst_e = {k: v.index_select(0, rows).requires_grad_() for k, v in dst.items()}
                    msg = spec.message(Edges(src_e, dst_e, *_edge_fields(block, e0, e1, rows, out.dtype),
                                             block.loop, spec.sources.missing))
                    g_rows = g.index_select(0, rows)
                    if soft is not None:
                        score, value = _check_softmax(msg)
                        with torch.no_grad():  # d score = a (g . v - g . out), d value = a g
                            a = torch.exp(score - m.index_select(0, rows)) / safe_l.index_select(0, rows)
                            gv = (g_rows * value).reshape(value.shape[0], value.shape[1], -1).sum(-1)
                            gv -= g_out.index_select(0, rows)
                        outs, grads = (score, value), (a * gv, _expand(a, value) * g_rows)
                    else:
                        msg = _check_message(msg)
                        if block.scale is not None:
                            g_rows = g_rows * _expand(block.scale[rows].to(g_rows.dtype), g_rows)
                        outs, grads = (msg,), (g_rows,)
                    leaves = [*src_e.values(), *dst_e.values(), *trainable]
                    got = torch.autograd.grad(outs, leaves, grads, allow_unused=True)
                del msg, outs, grads
                it = iter(got)
                for k in src_e:
                    gk = next(it)
                    if gk is not None:
                        grad_rows[k].index_add_(0, cols, gk)
                for k in dst_e:
                    gk = next(it)
                    if gk is not None:
                        grad_dst[k].index_add_(0, rows, gk)
                for i in range(len(trainable)):
                    gp = next(it)
                    if gp is not None:
                        grad_par[i] = gp if grad_par[i] is None else grad_par[i] + gp
                del got
            if not own:
                give(grad_rows)
            del grad_rows


def as_fields(what: str, tensors: torch.Tensor | Mapping[str, torch.Tensor] | None, rows: int | None
              ) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` from one tensor (named ``"x"``) or a mapping; ``ValueError`` naming ``what`` for a
    tensor that is not a floating-point tensor with ``rows`` rows."""
    if tensors is None:
        return {}
    fields = {"x": tensors} if isinstance(tensors, torch.Tensor) else dict(tensors)
    for name, t in fields.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 1:
            raise ValueError(f"message_passing: {what}[{name!r}] must be a floating-point tensor, got "
                             f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype}")
        if t.layout != torch.strided:
            raise ValueError(f"message_passing: {what}[{name!r}] is sparse; pass dense rows")
        if rows is not None and t.shape[0] != rows:
            raise ValueError(f"message_passing: {what}[{name!r}] has {t.shape[0]} rows, expected {rows}")
    return fields


def check_rows(src: dict[str, torch.Tensor], rows: int, what: str) -> None:
    """``ValueError`` unless every ``src`` tensor has ``rows`` rows (``what``: the rows expected, for the
    message)."""
    for name, t in src.items():
        if t.shape[0] != rows:
            raise ValueError(f"message_passing: src[{name!r}] has {t.shape[0]} rows, expected {rows} ({what})")


def pack_rows(src: dict[str, torch.Tensor], rows: torch.Tensor | None = None) -> torch.Tensor:
    """float[k, W]: the rows ``rows`` (default all) of every ``src`` tensor side by side, one message for all
    (``W`` the sum of their row widths). ``ValueError`` when their dtypes differ."""
    if len({v.dtype for v in src.values()}) > 1:
        raise ValueError("message_passing: the src tensors of one call must share a dtype (they travel together)")
    parts = [(v if rows is None else v.index_select(0, rows)) for v in src.values()]
    return torch.cat([p.reshape(p.shape[0], -1) for p in parts], 1)


def unpack_rows(packed: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Views ``{name: float[k, ...]}`` of a :func:`pack_rows` message, shaped as the tensors of ``like``."""
    out, at = {}, 0
    for name, v in like.items():
        w = math.prod(v.shape[1:])
        out[name] = packed[:, at:at + w].reshape(packed.shape[0], *v.shape[1:])
        at += w
    return out


def edge_types(csr: CSR, types) -> torch.Tensor | None:
    """int64 tensor of the NumPy edge types ``types`` of ``csr``'s edges (or None), on its device, made once and
    kept in its cache."""
    if types is None:
        return None
    if "edge_type_t" not in csr._cache:
        csr._cache["edge_type_t"] = torch.from_numpy(types.astype("int64")).to(csr.device)
    return csr._cache["edge_type_t"]


def message_params(message: Callable, params: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
    """The trainable tensors a message function uses: ``params`` when given, else the parameters of the module
    it is (or whose method it is), else none."""
    if params is not None:
        return list(params)
    owner = message if isinstance(message, torch.nn.Module) else getattr(message, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return list(owner.parameters())
    return []


def message_passing(sources: Sources, message: Callable[[Edges], Any], src: dict[str, torch.Tensor],
                    dst: dict[str, torch.Tensor], *, num_out: int, reduce: str = "sum",
                    degree: torch.Tensor | None = None, params: Sequence[torch.Tensor] | None = None,
                    chunk: int | None = None) -> torch.Tensor:
    """Reduce ``message`` over every in-edge of each of the ``num_out`` output rows (module docstring).

    Args:
        sources: where the source rows come from (:class:`LocalSources`, SAR's rotation).
        message: ``f(edges: Edges) -> float[E, ...]`` (``sum``/``mean``) or ``(score float[E, H], value
            float[E, H, ...])`` (``softmax``).
        src: ``{name: float[input rows, ...]}``; dst: ``{name: float[num_out, ...]}``.
        reduce: ``"sum"``, ``"mean"`` or ``"softmax"``.
        degree: float/int[num_out] the mean's divisor (``mean`` only).
        params: trainable tensors ``message`` uses (default: its module's parameters, :func:`message_params`).
        chunk: edges per chunk (default :func:`chunk_edges`).
    Returns:
        float[num_out, ...]; differentiable in ``src``, ``dst`` and ``params``.
    """
    if reduce not in REDUCES:
        raise ValueError(f"message_passing: reduce must be one of {', '.join(REDUCES)}, got {reduce!r}")
    if not callable(message):
        raise ValueError(f"message_passing: message must be callable, got {type(message).__name__}")
    if reduce == "mean" and degree is None:
        raise ValueError("message_passing: reduce='mean' needs the in-degree")
    plist = message_params(message, params)
    spec = _Spec(message, tuple(src), tuple(dst), len(plist), reduce, sources, int(num_out), degree,
                 int(chunk or chunk_edges(src, dst)))
    return _MessagePassing.apply(spec, *src.values(), *dst.values(), *plist)
