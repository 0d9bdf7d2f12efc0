"""``GraphContext``: everything a layer may ask of the graph it runs on.

Layers in :mod:`hpc_graph.nn` receive a ``GraphContext`` and call its methods;
they never know which engine implements it (``single`` holds the whole graph,
``dp`` exchanges halo rows, ``sar`` aggregates one remote partition at a time,
``minibatch`` runs on sampled blocks). On a full graph, all row-indexed
tensors hold the rows of the nodes this process *owns*, in local id order:
shape ``[num_nodes, ...]``.

Sampled training runs each layer on its own bipartite *block*: the layer
reads the rows of the block's source nodes and writes the rows of its
destination nodes, which are the first ``num_nodes`` sources. A model with
several message-passing layers therefore, for layer ``l``:

1. takes ``g = graph.layer(l)`` (a full graph returns itself);
2. lets ``h = g.layer_input(h)`` complete its input rows (a block may append
   rows that did not come from the previous layer, e.g. cached embeddings of
   remote nodes; a full graph returns ``h``);
3. uses ``g.dst(t)`` wherever it needs the rows of the output nodes of a
   tensor over the input rows (self terms, residuals; identity on a full graph),
   and ``g.in_degree()`` for the degrees of the input rows.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch.nn import functional as F


class UnsupportedOperation(NotImplementedError):
    """A ``GraphContext`` primitive the engine running the model does not provide (``hpc-graph train`` reports it
    in one line naming the engine and the model)."""


class GraphContext(ABC):
    """Engine-neutral view of (this rank's part of) a graph.

    Attributes:
        num_nodes: rows owned by this process (inputs/outputs of every layer).
        global_num_nodes: nodes of the whole graph.
        num_relations: edge types R of the whole graph (``/graph/edge_type``; 1 for an untyped graph).
        num_graphs: 0 for one graph (node-level tasks); G for a batch of G small graphs (graph-level
            tasks, a dataset with ``/graphs/ptr``): models then return one row per graph, through the
            graphs' global tokens (graph transformers) or :meth:`readout`.
    """

    num_nodes: int
    global_num_nodes: int
    num_relations: int = 1
    num_graphs: int = 0

    def to(self, device: torch.device | str) -> "GraphContext":
        """This context on ``device``: the trainer moves a sampled batch's graph (built on the CPU) to the model's
        device. Contexts that can move override it; the others say so."""
        raise NotImplementedError(f"{type(self).__name__} cannot be moved to {device}: build it on that device")

    @abstractmethod
    def aggregate(self, x: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
        """Aggregate source rows over each owned node's in-edges.

        Args:
            x: float[num_nodes, F], rows of owned nodes (the engine fetches halo rows).
            reduce: ``"sum"`` or ``"mean"`` (mean over in-edges, 0 for none).
        Returns:
            float[num_nodes, F]; differentiable with respect to ``x``.
        """

    def aggregate_combine(self, x: torch.Tensor, reduce: str = "sum", *, scale: torch.Tensor | None = None,
                          self_loop: bool = False, self_rows: torch.Tensor | None = None,
                          self_scale: torch.Tensor | None = None,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
        """A layer's output in one step: ``scale * aggregate(x, reduce) + self_scale * S + bias``.

        ``S`` is ``dst(x)`` (``self_loop``: the output node's own input row, GCN's self loop) or
        ``self_rows`` (e.g. SAGE's root projection). Engines whose aggregation is one local SpMM
        (``single``, ``dp``) run it as one fused kernel pass (:func:`hpc_graph.ops.spmm_fused`): no
        aggregate temporary, no separate scaling/add/bias passes in forward or backward. This default
        composes the same value from :meth:`aggregate` (every other engine).

        Args:
            x: float[input rows, F] (or [input rows, H, D]).
            reduce: ``"sum"`` or ``"mean"``.
            scale, self_scale: float[num_nodes] constants (no gradient), or None.
            self_loop / self_rows: the self term (at most one), float[num_nodes, ...] for ``self_rows``.
            bias: float[F] (or [H, D]) or None.
        Returns:
            float[num_nodes, ...]; differentiable w.r.t. ``x``, ``self_rows`` and ``bias``.
        """
        if self_loop and self_rows is not None:
            raise ValueError("aggregate_combine: give self_loop or self_rows, not both")
        out = self.aggregate(x, reduce)
        col = (-1,) + (1,) * (out.dim() - 1)
        if scale is not None:
            out = out * scale.view(col)
        s = self.dst(x) if self_loop else self_rows
        if s is not None:
            out = out + (s if self_scale is None else s * self_scale.view(col))
        if bias is not None:
            out = out + bias.reshape(out.shape[1:])
        return out

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: torch.Tensor | None = None,
                  mode: str = "sparse", global_token: bool = False, far_prior: bool = True) -> torch.Tensor:
        """Graph-transformer attention of the node tokens (one softmax per token and head).

        ``sparse``: each token attends to its entries of the graph's
        :class:`~hpc_graph.graph.attention_pattern.AttentionPattern` (itself, its in-neighbours,
        its two neighbours in the sequence order, the global token); ``dense``: to every node
        token as well (exactly, without an S x S tensor). Same scale ``1/sqrt(d_k)`` and the same
        max-subtracted softmax in both modes. Engines holding part of the graph (``dp``, ``sar``,
        ``sylvie``) run the sparse mode over self loops and in-edges only, through a K/V halo
        exchange (``single``/``seqpar`` with ``engine.attention_chain: false`` give the same).

        Args:
            q, k: float[T, H, Dk]; v: float[T, H, Dv]; T = ``num_nodes`` (+ 1 with ``global_token``:
                the last row is the global token's; + ``num_graphs`` for a graph batch, whose graphs
                each have a global token, rows ``num_nodes + g``, and attend only inside themselves:
                dense mode there is every pair inside each graph).
            bias: float[max_dist + 4, H] per-head score bias of each structural bucket (self, 1 ..
                max_dist hops, farther, global, unreachable; ``attention_pattern.num_codes``); in dense
                mode pairs outside the pattern get the farther row. None: no bias.
            mode: ``"sparse"`` or ``"dense"``.
            global_token: whether the last row(s) of q/k/v are global tokens (always for a graph batch).
            far_prior: dense mode: subtract ``ln((n - e) / e)`` (n node tokens, e pattern entries per token)
                from the scores of the pairs outside the pattern, so that a model trained mostly sparse is
                not swamped by the n far tokens when it attends densely (:func:`~hpc_graph.graph.
                attention_pattern.far_count_prior`); False: plain dense attention.
        Returns:
            float[T, H, Dv]; differentiable in q, k, v and bias.
        """
        raise UnsupportedOperation(f"{type(self).__name__}: graph-transformer attention runs on the 'single' and "
                                  f"'seqpar' engines (sparse layers also on dp, sar, sylvie)")

    def node_field(self, name: str) -> torch.Tensor:
        """The owned rows of an extra per-node dataset field, e.g. ``"lap_pe"`` (float[num_nodes, k]).

        Engines that load such fields keep them in a ``node_fields`` dict (``single``, ``seqpar``).
        Raises ``ValueError`` naming the field when the dataset lacks it or the engine cannot load it.
        """
        fields = getattr(self, "node_fields", None)
        if fields is None:
            raise ValueError(f"{type(self).__name__}: node field {name!r} is not available on this engine "
                             f"(the graph transformers run on engine.name: single or seqpar)")
        if name not in fields:
            hint = " (hpc-graph preprocess lap-pe FILE adds it)" if name == "lap_pe" else ""
            raise ValueError(f"node field /node/{name}: not in the dataset{hint}")
        return fields[name]

    def readout(self, h: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
        """Graph-level pooling of a graph batch: float[num_nodes, ...] -> float[num_graphs, ...] (``mean`` or
        ``sum`` of each graph's node rows; a batch of no graphs gives no rows). Raises ``ValueError`` on a single
        graph (no ``graph_ptr``)."""
        ptr = getattr(self, "graph_ptr", None)
        if ptr is None:
            raise ValueError(f"{type(self).__name__}: readout needs a graph-level dataset (/graphs/ptr)")
        if reduce not in ("sum", "mean"):
            raise ValueError(f"readout: reduce must be 'sum' or 'mean', got {reduce!r}")
        sizes = ptr[1:] - ptr[:-1]
        seg = torch.repeat_interleave(torch.arange(self.num_graphs, device=h.device), sizes.to(h.device))
        out = h.new_zeros((self.num_graphs,) + tuple(h.shape[1:])).index_add_(0, seg, h)
        if reduce == "mean":
            out = out / sizes.to(device=h.device, dtype=h.dtype).view((-1,) + (1,) * (h.dim() - 1))
        return out

    def out_degree(self) -> torch.Tensor:
        """int64[num_nodes]: out-degree of each owned node in the whole graph."""
        raise UnsupportedOperation(f"{type(self).__name__}: out_degree is not available on this engine")

    def aggregate_relations(self, x: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
        """Aggregate source rows over each owned node's in-edges, one result per edge type.

        ``out[i, r] = reduce_{j -r-> i} x_j`` (R-GCN's relation-wise neighbourhoods); ``mean``
        divides by the number of in-edges of type ``r`` in the whole graph (0 rows for none).
        One exchange of ``x``'s halo rows serves all relations. This default serves an untyped
        graph (R = 1); engines that load edge types override it.

        Args:
            x: float[num_nodes, F], rows of owned nodes (the engine fetches halo rows).
            reduce: ``"sum"`` or ``"mean"``.
        Returns:
            float[num_nodes, num_relations, F]; differentiable with respect to ``x``.
        """
        if self.num_relations == 1:
            return self.aggregate(x, reduce).unsqueeze(1)
        raise UnsupportedOperation(f"{type(self).__name__}: relation-wise aggregation is not supported here")

    @abstractmethod
    def gat(self, z: torch.Tensor, s_src: torch.Tensor, s_dst: torch.Tensor, *,
            negative_slope: float = 0.2, attn_dropout: float = 0.0, seed: int = 0,
            add_self_loops: bool = True) -> torch.Tensor:
        """GATv1 attention aggregation, never storing an E x H attention tensor.

        ``out_i = sum_j softmax_j(LeakyReLU(s_dst_i + s_src_j)) * z_j`` over the
        in-edges of ``i`` (plus ``i`` itself when ``add_self_loops``).

        Args:
            z: float[num_nodes, H, D] projected features of owned nodes.
            s_src: float[num_nodes, H] source scores ``a_src . z_j``.
            s_dst: float[num_nodes, H] destination scores ``a_dst . z_i``.
            attn_dropout: probability of dropping an attention coefficient
                (drawn from a hash of ``seed`` and the edge's global end points,
                so every engine drops the same edges).
        Returns:
            float[num_nodes, H, D]; differentiable in ``z``, ``s_src``, ``s_dst``.
        """

    def gat_projected(self, x: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor,
                      att_dst: torch.Tensor, *, act: str | None = None, p: float = 0.0,
                      negative_slope: float = 0.2, attn_dropout: float = 0.0,
                      seed: int = 0, add_self_loops: bool = True) -> torch.Tensor:
        """Activate, drop, project, score and attend in one call: a GAT layer without its bias.

        ``a = dropout(act(x), p)``, ``z = (a W^T).view(N, H, D)``, ``s_src = (z * att_src).sum(-1)``,
        ``s_dst = (z * att_dst).sum(-1)``, then :meth:`gat`. This default runs
        those steps with autograd; an engine may fuse them to keep less for the
        backward pass (``single`` and ``sar`` keep ``x`` only and recompute ``a`` and ``z``;
        every engine draws the same dropout masks: :func:`hpc_graph.ops.dropout.act_dropout`).

        Args:
            x: float[input rows, F_in] dense (the layer's input rows, :meth:`layer_input`).
            weight: float[H*D, F_in]; att_src, att_dst: float[1, H, D].
            act: None, ``"relu"`` or ``"elu"``; p: feature dropout probability in [0, 1).
            negative_slope, attn_dropout, seed, add_self_loops: as for :meth:`gat`.
        Returns:
            float[num_nodes, H, D]; differentiable in ``x``, ``weight``, ``att_src``, ``att_dst``.
        """
        if act is not None or p > 0:
            from hpc_graph.ops.dropout import act_dropout

            x = act_dropout(x, act, p, self.row_ids())
        heads, dim = int(att_src.shape[1]), int(att_src.shape[2])
        z = F.linear(x, weight).view(-1, heads, dim)
        return self.gat(z, (z * att_src).sum(-1), (self.dst(z) * att_dst).sum(-1), negative_slope=negative_slope,
                        attn_dropout=attn_dropout, seed=seed, add_self_loops=add_self_loops)

    def message_passing(self, message, src, dst=None, *, reduce: str = "sum", self_loops: bool = False,
                        params=None) -> torch.Tensor:
        """Reduce a message function of one's own over each output node's in-edges (DGL's ``update_all``,
        PyG's ``MessagePassing``): the seam for layers the built-in primitives do not cover (GATv2, edge-weighted
        or relational messages, ...). Runs on every engine that holds edges: ``single``, ``dp``, ``sylvie``,
        ``sar`` (remote partitions one at a time, fetched again in backward) and the sampled blocks of
        ``minibatch``; the messages are never kept for the backward pass but recomputed
        (:mod:`hpc_graph.ops.message`).

        Args:
            message: ``f(edges) -> float[E, ...]`` for ``sum``/``mean``, or ``(score float[E, H], value
                float[E, H, ...])`` for ``softmax``; ``edges`` (:class:`~hpc_graph.ops.message.Edges`) has
                ``src[name]``/``dst[name]`` float[E, ...] (the rows of both ends), ``weight`` float[E]
                (``/graph/edge_weight``), ``type`` int64[E] (``/graph/edge_type``) and ``loop``. It must be
                deterministic (it runs again in backward) and its trainable tensors must be the parameters of
                the module it belongs to (a module or a bound method) or be given in ``params``.
            src: float[input rows, ...] (:meth:`layer_input`'s rows), or ``{name: tensor}`` of such; a single
                tensor is named ``"x"``.
            dst: float[num_nodes, ...] or ``{name: tensor}`` for the destination ends; None: ``dst(t)`` of each
                ``src`` tensor, under the same names.
            reduce: ``"sum"``, ``"mean"`` (over the in-edges in the whole graph, the self loop counted) or
                ``"softmax"`` (``sum_j softmax_j(score_ij) value_ij``). On a sampled block ``sum`` is scaled by
                ``degree / sampled`` and ``mean``/``softmax`` run over the sampled edges, as :meth:`aggregate`.
            self_loops: add the edge ``i -> i`` to every output node (``edges.loop`` is True on that batch).
            params: the trainable tensors ``message`` uses, when it is not a module's method.
        Returns:
            float[num_nodes, ...] (``softmax``: float[num_nodes, H, ...]); differentiable in ``src``, ``dst``
            and the parameters.
        """
        from hpc_graph.ops.message import REDUCES, as_fields, message_passing

        if reduce not in REDUCES:
            raise ValueError(f"message_passing: reduce must be one of {', '.join(REDUCES)}, got {reduce!r}")
        src_f = as_fields("src", src, None)
        if not src_f:
            raise ValueError("message_passing: src needs at least one tensor")
        dst_f = {k: self.dst(v) for k, v in src_f.items()} if dst is None else as_fields("dst", dst, self.num_nodes)
        sources, rows, degree = self.message_sources(src_f, reduce, bool(self_loops))
        return message_passing(sources, message, rows, dst_f, num_out=self.num_nodes, reduce=reduce,
                               degree=degree, params=params)

    def message_sources(self, src: dict, reduce: str, self_loops: bool):
        """The engine's side of :meth:`message_passing`: ``(sources, src rows, degree)``, where ``sources``
        (:class:`~hpc_graph.ops.message.Sources`) yields the blocks of edges and the source rows they index,
        ``src rows`` are the tensors the op differentiates (``src`` itself, or with halo rows appended) and
        ``degree`` float[num_nodes] the mean's divisor. Contexts that hold edges override it."""
        raise UnsupportedOperation(f"{type(self).__name__}: message_passing (a layer's own message function) is not "
                                  "available on this engine; it runs on single, dp, sylvie, sar and minibatch")

    def layer(self, index: int) -> "GraphContext":
        """The context of message-passing layer ``index`` (0 = the input layer); a full graph is every layer's."""
        return self

    def layer_input(self, h: torch.Tensor) -> torch.Tensor:
        """The input rows of this layer given the previous layer's output rows ``h`` (identity here)."""
        return h

    def dst(self, t: torch.Tensor) -> torch.Tensor:
        """The rows of the output (destination) nodes of a tensor over the input rows (identity here)."""
        return t

    @abstractmethod
    def in_degree(self) -> torch.Tensor:
        """int64[input rows]: in-degree of each input node in the whole graph (owned nodes on a full graph)."""

    @abstractmethod
    def global_ids(self) -> torch.Tensor:
        """int64[num_nodes]: global (relabelled) id of each owned node."""

    def dataset_ids(self) -> torch.Tensor:
        """int64[num_nodes]: each owned node's id in the source dataset (recipes that read per-node data
        from it use these). A partition relabels nodes, so graphs over one override this; elsewhere the
        global ids are the dataset's."""
        return self.global_ids()

    def row_ids(self, output: bool = False) -> torch.Tensor | None:
        """The source-dataset id of each input row of this layer (the rows :meth:`layer_input` returns), or
        with ``output`` of each output row (the rows :meth:`dst` keeps): int64[rows], or None.

        Feature dropout keys its mask on these (:func:`hpc_graph.ops.dropout.dropout`), so every engine
        holding a node drops the same features of it as ``single`` does, and ``dp``/``sar``/``sylvie`` stay
        exact against one process with dropout on. None: the mask is keyed on the rows' positions (a whole
        graph in dataset order, where that is the same thing, or a context whose rows have no such ids).
        """
        return None

    @abstractmethod
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Differentiable sum of ``t`` over all ranks (identity on one process).

        The backward pass all-reduces the gradient, so statistics such as
        DistBatchNorm's global mean get correctly scaled gradients.
        """
