"""Language-model co-training on text-attributed graphs (UniTG §5.3.3–5.3.4): lazy tuner, modality
collaborator, bubble interleaver.

Three parts, used by the trainer when ``lm.enabled`` (:class:`CoTraining` ties them together):

* :class:`LMTrainer` -- fine-tunes an :class:`~hpc_graph.nn.text_encoder.EarlyExitLM` on the training labels,
  data-parallel over every rank on a communicator of its own (``comm.dup()``), one *chunk* (one LM step's
  forward and backward on this rank's share of a global batch) at a time. Each global batch holds nodes of one
  exit group only (the *lazy tuner*: a node of group ``i`` leaves the LM after ``ceil(L (i+1) / E)`` layers,
  so a batch of group 0 costs about a quarter of a full-depth batch, and its step all-reduces and updates only
  the parameters that exit uses), and the epoch's loss is the mean of the exit losses (UniTG eq. 5.1). After a
  chunk, its gradient all-reduce is started (non-blocking); chunk ``k`` runs on the parameters after steps
  ``0 .. k-1-s`` (``lm.staleness`` s; 0: synchronous data parallelism, each step applied before the next chunk),
  so with s > 0 a rank can run s + 1 chunks in one bubble without waiting for the other ranks' share of the last
  step (delayed gradients, still the same on every rank and run). The LM owns its random stream (dropout), so
  running its chunks earlier or later never changes the GNN's. The LM steps are spread over the GNN epochs by a fixed
  quota (:meth:`LMTrainer.begin_epoch`): after every GNN epoch the LM has made exactly the same steps whether or not
  they ran in bubbles, so interleaving changes times, never results.
* :class:`Collaborator` -- when the GNN's input takes fresh LM encodings: every ``dt`` GNN epochs, ``dt``
  stepping down ``0.3 J, 0.2 J, 0.1 J, 0.02 J`` (``J`` = GNN epochs) each time the running average loss
  ``F_j = 0.8 F_(j-1) + 0.2 L_j`` has fallen ``patience`` (20) epochs in a row.
* :class:`BubbleInterleaver` -- a cooperative wait for a pipeline engine (``flow``): while a stage waits for a
  message it polls the receive (``Request.test``) and runs one LM chunk whenever the predicted remaining wait
  (the same wait's length in the previous epoch, measured by the polling) leaves room for it; it checks the
  message before every chunk, so a message waits at most one chunk.

The GNN's input is ``features | LM embedding | encoded flag`` (fixed width; the flag is 0 and the embedding 0
for nodes not encoded yet). With ``lm.standardize`` (default) each exit's embedding columns are standardised
over that exit's nodes at every sync: the exits (different depths) and the syncs (a fine-tuned LM moves its
embeddings) then give the GNN inputs on one scale -- without it a sync throws the GNN's loss back up and a
lazy-tuned LM costs tens of points (docs/benchmarks.md, history §13). This goes beyond UniTG, which feeds the raw
exit embeddings.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.nn import functional as F

from hpc_graph.nn.optim import AdamW

log = logging.getLogger(__name__)

GROUPINGS = ("centrality", "random", "reversed", "none")


def exit_groups(degree: np.ndarray, exits: int, grouping: str, seed: int = 0) -> np.ndarray:
    """int64[N]: the exit (0 .. exits-1) of every node. ``centrality``: nodes ranked by degree centrality, the
    lowest ``N/E`` leave first (exit 0), the highest run the whole LM; ``reversed``: the opposite; ``random``:
    a random ranking; ``none``: every node takes the last exit. Ties are broken at random (``seed``) so the
    groups have equal sizes (within one)."""
    if grouping not in GROUPINGS:
        raise ValueError(f"lm.grouping: must be one of {GROUPINGS}, got {grouping!r}")
    degree = np.asarray(degree)
    n = degree.shape[0]
    if grouping == "none" or n == 0:
        return np.full(n, exits - 1, dtype=np.int64)
    rng = np.random.default_rng([seed, 0x7A11])
    tie = rng.permutation(n)
    if grouping == "random":
        order = tie
    else:
        key = degree if grouping == "centrality" else -degree.astype(np.float64)
        order = np.lexsort((tie, key))  # ascending key, random among equals
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank * exits // n


class Collaborator:
    """UniTG's modality collaborator: decides after each GNN epoch whether the GNN takes fresh encodings.

    Args:
        epochs: J, the GNN epochs of the run; fractions: the ``dt / J`` ladder; patience: epochs of falling
        running average loss before ``dt`` steps down; momentum: 0.8 in ``F_j = m F_(j-1) + (1 - m) L_j``.
    """

    FRACTIONS = (0.3, 0.2, 0.1, 0.02)

    def __init__(self, epochs: int, fractions: tuple[float, ...] = FRACTIONS, patience: int = 20,
                 momentum: float = 0.8):
        if epochs < 1:
            raise ValueError(f"Collaborator: epochs must be >= 1, got {epochs}")
        self.epochs, self.fractions, self.patience, self.momentum = int(epochs), tuple(fractions), patience, momentum
        self.level = 0
        self.running: float | None = None
        self.streak = 0
        self.last_sync = 0

    @property
    def interval(self) -> int:
        """dt in GNN epochs (at least 1)."""
        return max(1, int(round(self.fractions[self.level] * self.epochs)))

    def observe(self, epoch: int, loss: float) -> bool:
        """Record epoch ``epoch``'s GNN loss; True when the GNN should take fresh encodings now."""
        if not math.isfinite(loss):
            self.streak = 0
        elif self.running is None:
            self.running = float(loss)
        else:
            new = self.momentum * self.running + (1.0 - self.momentum) * float(loss)
            self.streak = self.streak + 1 if new < self.running else 0
            self.running = new
            if self.streak >= self.patience and self.level + 1 < len(self.fractions):
                self.level += 1
                self.streak = 0
                log.info("collaborator: loss fell %d epochs in a row at epoch %d: sync every %d epochs now",
                         self.patience, epoch, self.interval)
        if epoch - self.last_sync >= self.interval:
            self.last_sync = epoch
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "running": self.running, "streak": self.streak, "last_sync": self.last_sync}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level, self.running = int(state["level"]), state["running"]
        self.streak, self.last_sync = int(state["streak"]), int(state["last_sync"])


@contextlib.contextmanager
def _own_rng(holder: dict[str, torch.Tensor]):
    """Run with the CPU random state kept in ``holder["state"]`` and restore the caller's afterwards."""
    outer = torch.get_rng_state()
    torch.set_rng_state(holder["state"])
    try:
        yield
    finally:
        holder["state"] = torch.get_rng_state()
        torch.set_rng_state(outer)


class LMTrainer:
    """Data-parallel fine-tuning of an early-exit LM in chunks (see the module docstring).

    Args:
        lm: the :class:`~hpc_graph.nn.text_encoder.EarlyExitLM` (equal on every rank).
        ids, mask: int64[N, S] token ids and attention mask of every node's text (dataset order).
        groups: int64[N] exit of every node; label: int64[N]; train: int64[T] dataset ids of the training nodes.
        comm: the LM's own communicator (every rank of the job).
        epochs: LM epochs over the training nodes in the whole run; batch_size: texts per step and rank.
        head_lr: learning rate of the exit heads and the classifier (0: ``lr``).
    """

    def __init__(self, lm: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, groups: np.ndarray,
                 label: torch.Tensor, train: np.ndarray, comm: Any, *, epochs: float, batch_size: int, lr: float,
                 weight_decay: float = 0.0, freeze_embeddings: bool = True, seed: int = 0,
                 encode_batch: int = 128, staleness: int = 0, head_lr: float = 0.0):
        self.lm, self.ids, self.mask, self.comm = lm, ids, mask, comm
        self.groups = np.asarray(groups, dtype=np.int64)
        self.label = label
        self.train = np.asarray(train, dtype=np.int64)
        self.rank, self.size = int(comm.rank), int(comm.size)
        self.batch_size, self.seed, self.encode_batch = int(batch_size), int(seed), int(encode_batch)
        self.staleness = int(staleness)
        if freeze_embeddings:
            lm.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
        self.params = [p for p in lm.parameters() if p.requires_grad]
        head_ids = {id(p) for mod in (lm.heads, lm.classifier) for p in mod.parameters()}
        groups = [{"params": [p for p in self.params if id(p) not in head_ids], "lr": lr},
                  {"params": [p for p in self.params if id(p) in head_ids], "lr": head_lr or lr}]
        self.optimizer = AdamW([g for g in groups if g["params"]], weight_decay=weight_decay)
        self._dtype = self.params[0].dtype if self.params else torch.float32
        # a step of exit e touches only the parameters e depends on: only their gradients are all-reduced and
        # only they are stepped (AdamW skips a parameter without a gradient: no momentum drift, no decay)
        trainable = {id(p) for p in self.params}
        self._active = [[p for p in lm.exit_parameters(e) if id(p) in trainable] for e in range(len(lm.heads))]
        self._free: dict[int, list[torch.Tensor]] = {}  # gradient buffers not in flight, by exit
        gen = torch.Generator().manual_seed(seed + 7919 + 1_000_003 * self.rank)  # dropout: a stream per rank
        self._rng = {"state": torch.empty(0, dtype=torch.uint8)}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
            self._rng["state"] = torch.get_rng_state()
        self.steps_per_lm_epoch = len(self._epoch_batches(0))
        self.total_steps = int(round(float(epochs) * self.steps_per_lm_epoch))
        self.quota = 0       # steps allowed by the end of the current GNN epoch
        self.started = 0     # steps whose chunk ran (its all-reduce may be pending)
        self.applied = 0     # steps applied by the optimiser
        self._per_epoch = 0
        self._pending: list[tuple[Any, torch.Tensor, int]] = []  # (all-reduce request, buffer, exit), oldest first
        self._batches: list[tuple[int, np.ndarray]] = []
        self._batches_epoch = -1
        self._chunk_est: dict[int, float] = {}
        self.reset_stats()

    # -- schedule ----------------------------------------------------------------------------------
    def _epoch_batches(self, lm_epoch: int) -> list[tuple[int, np.ndarray]]:
        """``[(exit, dataset ids)]`` of LM epoch ``lm_epoch``: the training nodes of each exit group shuffled and
        cut into global batches of ``batch_size * ranks``, then the batches shuffled (the same on every rank)."""
        rng = np.random.default_rng([self.seed, 0x1A7, lm_epoch])
        width = self.batch_size * self.size
        out = []
        for g in np.unique(self.groups[self.train]):
            nodes = self.train[self.groups[self.train] == g]
            nodes = nodes[rng.permutation(len(nodes))]
            out += [(int(g), nodes[i:i + width]) for i in range(0, len(nodes), width)]
        return [out[i] for i in rng.permutation(len(out))]

    def _batch(self, step: int) -> tuple[int, np.ndarray]:
        lm_epoch, k = divmod(step, max(self.steps_per_lm_epoch, 1))
        if lm_epoch != self._batches_epoch:
            self._batches, self._batches_epoch = self._epoch_batches(lm_epoch), lm_epoch
        return self._batches[k]

    def plan(self, gnn_epochs: int, done_epochs: int = 0) -> None:
        """Spread the run's LM steps evenly over ``gnn_epochs`` GNN epochs (``done_epochs`` already behind)."""
        self._per_epoch = int(math.ceil(self.total_steps / max(gnn_epochs, 1)))
        self.quota = min(self.total_steps, self._per_epoch * done_epochs)

    def begin_epoch(self) -> None:
        """A GNN epoch starts: its share of LM steps becomes available."""
        self.quota = min(self.total_steps, self.quota + self._per_epoch)

    def has_work(self) -> bool:
        return self.started < self.quota

    def _needed(self) -> int:
        """Pending steps the next chunk needs applied: chunk ``k`` runs on the parameters after steps
        ``0 .. k-1-staleness`` (0 staleness: synchronous data parallelism)."""
        return max(0, self.started - self.staleness - self.applied)

    def ready(self) -> bool:
        """Whether the next chunk can start without blocking (the all-reduces it needs have completed)."""
        return all(req.test() is not None for req, _, _ in self._pending[:self._needed()])

    def next_chunk_estimate(self) -> float:
        """Predicted seconds of the next chunk (by its exit; the slowest one measured when unseen)."""
        if not self._chunk_est:
            return math.inf
        g = self._batch(self.started)[0]
        return self._chunk_est.get(g, max(self._chunk_est.values()))

    # -- work ----------------------------------------------------------------------------------------
    def _apply_pending(self, count: int | None = None) -> None:
        """Apply the oldest ``count`` (default all) pending steps, waiting for their all-reduces."""
        for _ in range(len(self._pending) if count is None else count):
            req, flat, exit_ = self._pending.pop(0)
            req.wait()
            off = 0  # every gradient is None here (chunk() clears them after flattening)
            for p in self._active[exit_]:
                n = p.numel()
                p.grad = flat[off:off + n].view_as(p)  # a view: the buffer is reused only after this step
                off += n
            self.optimizer.step()
            for p in self._active[exit_]:
                p.grad = None
            self.applied += 1
            self._free.setdefault(exit_, []).append(flat)

    def chunk(self) -> float:
        """Run the next step's chunk on this rank (applying the previous step first); returns its seconds."""
        t0 = time.perf_counter()
        self._apply_pending(self._needed())
        step = self.started
        exit_, nodes = self._batch(step)
        mine = np.array_split(nodes, self.size)[self.rank]
        self.lm.train()
        for p in self.params:
            p.grad = None
        loss_value = 0.0
        with _own_rng(self._rng):
            if len(mine):
                ids, mask = _trim(self.ids[mine], self.mask[mine])
                logits = self.lm(ids, mask, exit_)
                loss = F.cross_entropy(logits, self.label[mine], reduction="sum") / len(nodes)
                loss.backward()
                loss_value = float(loss.detach())
        active = self._active[exit_]
        free = self._free.get(exit_)
        flat = free.pop() if free else torch.zeros(sum(p.numel() for p in active), dtype=self._dtype)
        if active:
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in active], out=flat)
        for p in self.params:
            p.grad = None
        self._pending.append((self.comm.allreduce_start(flat), flat, exit_))
        self.started += 1
        self.stats["loss"] += loss_value
        dt = time.perf_counter() - t0
        prev = self._chunk_est.get(exit_)
        self._chunk_est[exit_] = dt if prev is None else 0.7 * prev + 0.3 * dt
        self.stats["chunks"] += 1
        self.stats["seconds"] += dt
        return dt

    def finish_epoch(self) -> float:
        """Run the chunks left in this GNN epoch's quota and apply the last step; returns the seconds spent."""
        t0 = time.perf_counter()
        while self.has_work():
            self.chunk()
        self._apply_pending()
        dt = time.perf_counter() - t0
        self.stats["after_seconds"] += dt
        return dt

    @torch.no_grad()
    def encode(self) -> torch.Tensor:
        """float[N, D]: every node's embedding at its own exit (evaluation mode). Each rank encodes a
        contiguous ``1/P`` of the nodes (shortest texts together); one sum all-reduce assembles them."""
        t0 = time.perf_counter()
        self._apply_pending()
        self.lm.eval()
        n = self.ids.shape[0]
        lo, hi = (int(v) for v in np.linspace(0, n, self.size + 1)[self.rank:self.rank + 2].round())
        out = torch.zeros((n, self.lm.emb_dim), dtype=self._dtype)
        lengths = self.mask[lo:hi].sum(1).numpy()
        for g in np.unique(self.groups[lo:hi]):
            nodes = lo + np.nonzero(self.groups[lo:hi] == g)[0]
            nodes = nodes[np.argsort(lengths[nodes - lo], kind="stable")]
            for i in range(0, len(nodes), self.encode_batch):
                part = nodes[i:i + self.encode_batch]
                ids, mask = _trim(self.ids[part], self.mask[part])
                out[part] = self.lm.embed(ids, mask, int(g)).to(out.dtype)
        self.comm.allreduce_(out)
        self.stats["encode_seconds"] += time.perf_counter() - t0
        return out

    def reset_stats(self) -> None:
        self.stats = {"chunks": 0, "loss": 0.0, "seconds": 0.0, "after_seconds": 0.0, "encode_seconds": 0.0,
                      "bubble_chunks": 0, "bubble_seconds": 0.0, "max_delay_seconds": 0.0}

    def state_dict(self) -> dict[str, Any]:
        self._apply_pending()
        return {"lm": self.lm.state_dict(), "optimizer": self.optimizer.state_dict(), "started": self.started,
                "applied": self.applied, "quota": self.quota, "rng": self._rng["state"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lm.load_state_dict(state["lm"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.started, self.applied, self.quota = int(state["started"]), int(state["applied"]), int(state["quota"])
        self._rng["state"] = state["rng"]


def _trim(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the padding columns no row of the batch uses."""
    width = max(int(mask.sum(1).max()), 1) if mask.shape[0] else 1
    return ids[:, :width], mask[:, :width]


class BubbleInterleaver:
    """Cooperative waits that fill a pipeline's bubbles with LM chunks (see the module docstring).

    ``wait(test, key)`` is called by the engine before it blocks on a message: ``test()`` says (without
    blocking) whether the message is there, ``key`` names the wait (direction, micro-batch) so that the same
    wait of the next epoch is predicted from this one. ``clock`` is injectable for tests; ``floor``: the
    smallest predicted wait (default 0: a wait never seen runs no chunk; tests set it high to run chunks in
    every wait).
    """

    def __init__(self, lm: Any, clock: Callable[[], float] = time.perf_counter, floor: float = 0.0):
        self.lm = lm
        self.clock = clock
        self.floor = float(floor)
        self.predicted: dict[Any, float] = {}
        self.max_delay = 0.0

    def wait(self, test: Callable[[], bool], key: Any) -> None:
        """Poll ``test`` until the message is there, running LM chunks while the predicted wait has room."""
        t0 = self.clock()
        budget = max(self.predicted.get(key, 0.0), self.floor)
        last_missing = t0
        while True:
            now = self.clock()
            if test():
                break
            last_missing = now
            if not (self.lm.has_work() and self.lm.ready()):
                continue  # nothing to run, or the LM's all-reduce is in flight: keep polling
            if now - t0 + self.lm.next_chunk_estimate() > budget:
                continue  # the predicted bubble has no room for another chunk
            c0 = self.clock()
            self.lm.chunk()
            dt = self.clock() - c0
            self.lm.stats["bubble_chunks"] += 1
            self.lm.stats["bubble_seconds"] += dt
            if test():  # the message came during the chunk: it waited at most this chunk
                self.max_delay = max(self.max_delay, dt)
                self.lm.stats["max_delay_seconds"] = self.max_delay
                break
        # the bubble ended no earlier than the last poll that found no message (a lower bound: conservative)
        self.predicted[key] = last_missing - t0


class CoTraining:
    """The trainer's side of LM co-training: builds the LM from ``lm.*``, keeps the GNN's extra input columns.

    Args:
        lm_config: the ``lm`` section; data_path: the dataset file (with ``/node/text``); node_ids: int64[n]
        dataset ids of the engine's rows; comm: the job's communicator (duplicated for the LM); epochs: GNN
        epochs J; seed (the same on every rank: LM initialisation, exit groups, batch order; the LM's dropout
        stream is keyed by seed and rank); dtype of the GNN input.
    """

    def __init__(self, lm_config: Any, data_path: str, node_ids: torch.Tensor, comm: Any, epochs: int, seed: int,
                 dtype: torch.dtype):
        from data_io.dataset import open_dataset
        from hpc_graph.nn.text_encoder import EarlyExitLM, load_text_encoder

        c = self.config = lm_config
        t0 = time.perf_counter()
        with open_dataset(data_path) as ds:
            texts = ds.text()
            degree = np.diff(np.asarray(ds.indptr(), dtype=np.int64))
            label = ds.node_labels()
            train = ds.split_masks()["train"] & (label >= 0)
            num_classes = int(ds.num_classes) or int(label.max()) + 1
        encoder, tok = load_text_encoder(c.model, texts, dropout=c.dropout, seed=seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 104729)
            lm = EarlyExitLM(encoder, min(c.exits, encoder.num_layers), num_classes, c.emb_dim or None)
        ids, mask = tok.encode(texts, c.max_length)
        self.node_ids = node_ids.to(torch.int64).cpu()
        self.groups = exit_groups(degree, len(lm.exit_layers), c.grouping, seed)
        self.comm = comm.dup() if int(comm.size) > 1 else comm
        self.trainer = LMTrainer(lm, ids, mask, self.groups, torch.from_numpy(label), np.nonzero(train)[0],
                                 self.comm, epochs=c.epochs, batch_size=c.batch_size, lr=c.lr,
                                 weight_decay=c.weight_decay, freeze_embeddings=c.freeze_embeddings, seed=seed,
                                 encode_batch=c.encode_batch, staleness=c.staleness, head_lr=c.head_lr)
        self.trainer_epochs = epochs
        self.trainer.plan(epochs)
        self.collaborator = Collaborator(epochs) if c.sync == "adaptive" else None
        self.interleaver = BubbleInterleaver(self.trainer) if c.interleave else None
        self.dtype = dtype
        self.emb_dim = lm.emb_dim
        self.embedding = torch.zeros((len(texts), self.emb_dim), dtype=dtype)
        self.encoded = torch.zeros(len(texts), dtype=dtype)
        self.syncs: list[int] = []
        log.info("lm co-training: %s, %d layers (exits after %s), %d texts (%d tokens at most), %d LM steps over "
                 "%d GNN epochs, grouping %s, sync %s%s; set up in %.1f s", c.model, encoder.num_layers,
                 lm.exit_layers, len(texts), ids.shape[1], self.trainer.total_steps, epochs, c.grouping, c.sync,
                 ", interleaved" if c.interleave else "", time.perf_counter() - t0)
        if c.encode_at_start:
            self._sync(0)

    @property
    def extra_dim(self) -> int:
        """Columns the GNN input gains: the embedding and the encoded flag."""
        return self.emb_dim + 1

    def inputs(self, feat: torch.Tensor) -> torch.Tensor:
        """``[feat | embedding | flag]`` of the engine's rows: float[n, F + D + 1]."""
        emb = self.embedding[self.node_ids].to(device=feat.device, dtype=feat.dtype)
        flag = self.encoded[self.node_ids].to(device=feat.device, dtype=feat.dtype).unsqueeze(1)
        return torch.cat([feat if feat.layout == torch.strided else feat.to_dense(), emb, flag], 1)

    def _sync(self, epoch: int) -> None:
        emb = self.trainer.encode()
        if self.config.standardize:  # each exit's columns to mean 0, variance 1 over its nodes
            for g in np.unique(self.groups):
                rows = torch.from_numpy(np.nonzero(self.groups == g)[0])
                part = emb[rows]
                emb[rows] = (part - part.mean(0)) / part.std(0, unbiased=False).clamp_min(1e-6)
        self.embedding = emb.to(self.dtype)
        self.encoded.fill_(1.0)
        self.syncs.append(epoch)
        log.info("lm co-training: GNN input takes fresh encodings after epoch %d (LM step %d)", epoch,
                 self.trainer.applied)

    def begin_epoch(self) -> None:
        self.trainer.reset_stats()
        self.trainer.begin_epoch()

    def end_epoch(self, epoch: int, loss: float) -> bool:
        """After GNN epoch ``epoch``: finish its LM quota; True when the GNN input changed (fresh encodings)."""
        self.trainer.finish_epoch()
        if self.config.sync == "start" or self.trainer.total_steps == 0:
            due = False
        elif self.collaborator is not None:
            due = self.collaborator.observe(epoch, loss)
        else:
            due = epoch % self.config.sync_every == 0
        if due:
            self._sync(epoch)
        return due

    def state_dict(self) -> dict[str, Any]:
        """The LM, its optimiser and schedule, the collaborator and the GNN's current encodings; ``rng``: this
        rank's LM random state (the caller gathers them)."""
        t = self.trainer.state_dict()
        return {"trainer": {k: v for k, v in t.items() if k != "rng"}, "rng": t["rng"],
                "collaborator": None if self.collaborator is None else self.collaborator.state_dict(),
                "embedding": self.embedding.clone(), "encoded": self.encoded.clone(), "syncs": list(self.syncs)}

    def load_state_dict(self, state: dict[str, Any], rank: int, epoch: int) -> None:
        """Resume after GNN epoch ``epoch`` (``state["rng"]``: one LM random state per rank)."""
        self.trainer.load_state_dict({**state["trainer"], "rng": state["rng"][rank]})
        self.trainer.plan(self.trainer_epochs, epoch)
        if self.collaborator is not None and state.get("collaborator") is not None:
            self.collaborator.load_state_dict(state["collaborator"])
        self.embedding = state["embedding"].to(self.dtype)
        self.encoded = state["encoded"].to(self.dtype)
        self.syncs = list(state["syncs"])

    def stats(self) -> dict[str, float]:
        s = self.trainer.stats
        out = {"lm_chunks": float(s["chunks"]), "lm_seconds": s["seconds"], "lm_after_seconds": s["after_seconds"],
               "lm_bubble_chunks": float(s["bubble_chunks"]), "lm_bubble_seconds": s["bubble_seconds"],
               "lm_encode_seconds": s["encode_seconds"], "lm_max_delay_seconds": s["max_delay_seconds"],
               "lm_steps": float(self.trainer.applied)}
        if s["chunks"]:
            out["lm_loss"] = s["loss"] / s["chunks"]
        if self.collaborator is not None:
            out["lm_sync_interval"] = float(self.collaborator.interval)
        return out
