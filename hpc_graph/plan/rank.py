"""One rank's training step, run on shapes: the memory it needs and the work it does, from the engines' and
models' own code.

:func:`plan_rank` builds what the rank would hold from its sizes alone -- the engine's graph context
(:meth:`Engine.plan_graph <hpc_graph.engines.base.Engine.plan_graph>`), the features, labels and masks, the
model and its optimiser -- on the ``meta`` device, then runs the trainer's step on it: the model's forward pass,
the loss over the training rows, the backward pass, the gradient all-reduce and the optimiser step, twice (the
first step builds the caches a graph keeps: transposes, blocked copies), and the evaluation pass. The ops run
through the kernels' shape twins (:mod:`numba_kernels.work`), the messages go to a
:class:`~hpc_graph.plan.comm.PlanCommunicator`, and a :class:`~hpc_graph.plan.tracker.StepTracker` follows
every tensor's life: the high-water mark and what was live then are the engine's and the model's real ones,
not a second description of them. Nothing is allocated, so a rank of ogbn-papers100M on 256 ranks plans in
well under a second.

What the trainer keeps beside the engine is made here as the trainer makes it (:func:`trainer_inputs`, shared
with :class:`~hpc_graph.train.trainer.Trainer`): the features (a second copy when ``data.feature_norm: row``),
the labels, the masks, the training ids, and a CPU copy of the parameters at the best validation epoch.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch.nn import functional as F

from hpc_graph.ops._bridge import set_work_hook
from hpc_graph.plan.comm import PlanCommunicator
from hpc_graph.plan.tracker import COMPONENTS, StepTracker, Work

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclasses.dataclass
class RankPlan:
    """A planned rank (bytes and work; the process floor not included).

    ``peak``: the high-water mark over the set-up, two training steps and the evaluation pass; ``components``:
    what was live at that moment, by :data:`~hpc_graph.plan.tracker.COMPONENTS`; ``where``: the moment.
    ``saved``: what the training forward pass left for the backward pass (live activations at its end).
    ``held``: what stays between steps (graph, features, parameters and optimiser state, caches), by component.
    ``work``: the second training step's work (``forward``, ``backward``, ``optimizer``) and the evaluation
    pass's (``evaluation``). ``bytes_sent``: what the training step sends (exchanges and all-reduces).
    ``load_held``: what the rank holds once loaded (graph, features), by component. ``share``: the fraction of
    the model's units this rank runs (a pipeline stage's; 1 otherwise). ``halo_recv_max``: the largest receive of
    one exchange in the training step.
    """

    rank: int
    peak: int
    components: dict[str, int]
    where: str
    saved: int
    held: dict[str, int]
    work: dict[str, Work]
    bytes_sent: int
    load_held: dict[str, int] = dataclasses.field(default_factory=dict)
    share: float = 1.0
    halo_recv_max: int = 0


@contextlib.contextmanager
def _tracking(tracker: StepTracker):
    previous = set_work_hook(tracker.kernel)
    try:
        with tracker:
            yield tracker
    finally:
        set_work_hook(previous)


def plan_rank(engine_cls: Any, options: dict[str, Any], model: Any, graph: Any, rank: Any, ranks: int, *,
              dtype: str = "float32", optimizer: str = "adam", momentum: float = 0.0, feature_norm: str = "none",
              label_aug: float = 0.0, link: Any = None, hints: dict[str, Any] | None = None) -> RankPlan:
    """Plan rank ``rank`` (a :class:`~hpc_graph.plan.shapes.RankShape`) of a ``ranks``-rank job of engine class
    ``engine_cls`` (with ``options``, as :meth:`Engine.options_from_config` gives them) training ``model`` (the
    config's ``model`` section) on ``graph`` (a :class:`~hpc_graph.plan.shapes.GraphShape`).

    Raises:
        NotImplementedError: the engine cannot be planned (no ``plan_graph``), or an op of the model has no
            shape path (a kernel without a shape twin).
    """
    tdtype = _DTYPES[dtype]
    tracker = StepTracker()
    comm = PlanCommunicator(rank.rank, ranks, tracker, link)
    with _tracking(tracker):
        with tracker.phase("load"):
            with tracker.component("graph"):
                eng = engine_cls.plan_instance(graph, rank, ranks, comm, tdtype, options, hints)
            if eng is None:
                raise NotImplementedError(f"engine {engine_cls.name!r} cannot be planned (no plan_graph)")
            n = int(eng.graph.num_nodes)
            with tracker.component("features"):
                if getattr(eng, "feat", None) is None:
                    eng.feat = torch.empty(n, int(graph.features), dtype=tdtype, device="meta")
                if getattr(eng, "label", None) is None:
                    eng.label = torch.empty(n, dtype=torch.int64, device="meta")
                if getattr(eng, "masks", None) is None:
                    eng.masks = {k: torch.empty(n, dtype=torch.bool, device="meta") for k in ("train", "val", "test")}
        return run_steps(tracker, comm, eng, model, graph, ranks, dtype=tdtype, optimizer=optimizer,
                         momentum=momentum, feature_norm=feature_norm, label_aug=label_aug,
                         train_rows=max(int(rank.train), 0))


def run_steps(tracker: StepTracker, comm: Any, engine: Any, model: Any, graph: Any, ranks: int, *,
              dtype: torch.dtype, optimizer: str = "adam", momentum: float = 0.0, feature_norm: str = "none",
              label_aug: float = 0.0, train_rows: int | None = None, device: str = "meta") -> RankPlan:
    """The trainer's training step on ``engine`` (its ``graph``, ``feat``, ``label``, ``masks``, and the hooks the
    trainer calls around a step), twice, then its evaluation pass, inside ``tracker`` (already active): what
    :func:`plan_rank` runs on shapes, and what a check runs on real data (``device="cpu"``) to compare."""
    from hpc_graph.nn import optim
    from hpc_graph.nn.models import build_from_config
    from hpc_graph.train.trainer import trainer_inputs

    classes = max(int(graph.classes), 1)
    ctx = engine.graph
    n = int(ctx.num_nodes)
    with tracker.phase("load"):
        with tracker.component("features"):
            x, label, masks, train_idx = trainer_inputs(engine.feat, engine.label, engine.masks, feature_norm,
                                                        "dense", train_rows=train_rows)
            if label_aug > 0:
                x = torch.cat([x, torch.zeros(n, classes, dtype=dtype, device=device)], 1)
        load_held = {c: int(v) for c, v in tracker.live.items()}
        in_dim = int(graph.features) + (classes if label_aug > 0 else 0)
        with tracker.component("params"):
            net = build_from_config(model, in_dim, classes).to(device=device, dtype=dtype)
            for p in net.parameters():
                tracker.adopt(p, "params")
            before = {id(p): p.untyped_storage()._cdata for p in net.parameters()}
            with tracker.component("graph"):  # what its probes cache stays with the graph
                engine.attach_model(net, x)  # a pipeline stage releases the other stages' parameters
            # the trainer's parameters: those the engine kept (a released one got new, empty data)
            params = []
            for p in net.parameters():
                if before.get(id(p)) == p.untyped_storage()._cdata and (device == "meta" or not p.is_meta):
                    params.append(p)
                else:
                    tracker.forget(p)  # released: no memory in a real run
            params = [p for p in params if p.requires_grad]
            best = [torch.empty_like(p) for p in params]  # the trainer's copy at the best validation epoch
            opt = (optim.Adam(params, lr=1e-3) if optimizer == "adam"
                   else optim.SGD(params, lr=1e-3, momentum=momentum))
    count = float(max(int(graph.train_nodes), 1))
    pipeline = engine.kind == "pipeline"
    if pipeline:
        from hpc_graph.train.pipeline import predict, train_pass

        loss_mask = masks["train"]
        if loss_mask.is_meta:
            loss_mask.planned_rows = int(train_rows or 0)
    saved = 0
    for step in (1, 2):
        if step == 2:  # the step that is timed: the first one built the graph's caches, which stay
            tracker.work = {k: Work() for k in tracker.work}
            comm.reset_counters()
            for c in ("activations", "workspace", "halo"):
                tracker.relabel_all(c, "graph")
        net.train()
        engine.begin_epoch(step)
        opt.zero_grad(set_to_none=False)
        if pipeline:  # forward and backward of every micro-batch, the stage's share of the loss
            with tracker.phase("forward"), tracker.component("activations"):
                train_pass(engine, net, x, label, loss_mask, count)
        else:
            kept: dict[int, int] = {}
            held_keys = {t.untyped_storage()._cdata for t in (*params, x, label, train_idx)}

            def pack(t: torch.Tensor) -> torch.Tensor:  # what autograd saves for the backward pass
                st = t.untyped_storage()
                if t.numel() > 1 and st._cdata not in held_keys:
                    kept.setdefault(st._cdata, int(st.nbytes()))
                return t

            with tracker.phase("forward"), tracker.component("activations"), \
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                logits = net(ctx, x)
                loss = F.cross_entropy(logits[train_idx], label[train_idx], reduction="sum") / count
            saved = max(saved, sum(kept.values()))
        with tracker.phase("backward"), tracker.component("workspace"):
            if not pipeline:
                loss.backward()
                del logits, loss
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                tracker.relabel(p.grad, "params")
            flags = torch.empty(2 + 2 * ranks, dtype=dtype, device=device)
            if ranks > 1:  # a pipeline's stages hold disjoint parameters: only the flags travel
                comm.allreduce_bucketed_(([] if pipeline else [p.grad for p in params]) + [flags])
            del flags
        with tracker.phase("optimizer"), tracker.component("params"):
            opt.step()
        engine.end_epoch(step, float("nan"), 0.0)
        if hasattr(comm, "end_step"):
            comm.end_step()
    share = 1.0
    if pipeline:
        saved = int(engine.stats().get("saved_bytes", 0))
        start, stop = engine.units
        share = (stop - start) / max(len(net.pipeline_units()), 1)
    sent, recv_max = comm.bytes_sent, getattr(comm, "recv_max", 0)
    held = dict(tracker.live)
    with tracker.phase("evaluation"), tracker.component("workspace"), torch.no_grad():
        net.eval()
        with engine.evaluation():
            pred = predict(engine, net, x) if pipeline else net(ctx, x).argmax(1)
        del pred
    if hasattr(comm, "end_step"):
        comm.end_step()
    del best
    return RankPlan(rank=int(getattr(comm, "rank", 0)), peak=int(tracker.peak),
                    components={c: int(tracker.peak_parts.get(c, 0)) for c in COMPONENTS},
                    where=tracker.peak_where, saved=int(saved), held={c: int(v) for c, v in held.items()},
                    work=tracker.work, bytes_sent=int(sent), load_held=load_held, share=share,
                    halo_recv_max=int(recv_max))
