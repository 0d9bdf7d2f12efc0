"""``Communicator``: the one interface every engine talks to (its factory: :mod:`hpc_graph.comm.factory`).

A communicator moves torch tensors between the ranks of a job. Backends
(:mod:`~hpc_graph.comm.mpi` over mpi4py, :mod:`~hpc_graph.comm.torch_dist`
over torch.distributed, :mod:`~hpc_graph.comm.local` for one process) only
implement byte- and element-level primitives; this base class does the rest
in one place, so every backend behaves the same:

* **chunking**: no single message, broadcast or reduction is larger than
  ``max_message_bytes`` (default ``2**31 - 1``, the limit of a C ``int``
  count); larger payloads go as consecutive chunks.
* **staging**: a CUDA tensor the backend cannot send from device memory is
  copied to host memory, communicated and copied back.
* **counters**: ``bytes_sent`` and ``comm_seconds`` (see below).

Counting (``bytes_sent``, per operation in ``bytes_by_op``):

* ``exchange`` / ``exchange_start``: exactly the payload bytes of the tensors
  sent to *other* ranks (a rank's message to itself is a local copy and does
  not count). Engines compare this with their halo sizes.
  ``exchange_start_bounded``: the payload plus each message's 8-byte length.
* ``alltoallv``: exactly the payload bytes of the rows sent to other ranks;
  the exchange of the counts (8 bytes per rank) is not counted.
* ``allreduce_`` (and ``allreduce_bucketed_``, which calls it): ``t.nbytes``
  per call, the payload this rank contributes, whatever algorithm the library
  uses internally (a ring all-reduce really moves about twice that).
* ``bcast``: ``t.nbytes`` on the root only; ``bcast_object``: the pickled
  size on the root; ``allgather_object``: the pickled size of this rank's
  object; ``barrier``: nothing.
* Nothing is counted when ``size == 1``.

``comm_seconds`` is the wall time spent inside these calls (for
``exchange_start`` the time in the call plus the time in ``Request.wait``).
Counters are per communicator and not thread-safe.

**Modelled link** (:meth:`Communicator.set_link`, :mod:`hpc_graph.comm.link`):
with a :class:`~hpc_graph.comm.link.LinkModel` set, ``exchange``/
``exchange_start``, ``allreduce_`` and ``alltoallv`` last at least as long as
the model says (the rest is slept; for ``exchange_start`` in ``wait()``, so
overlapped work hides it). ``modeled_seconds`` adds up the modelled time of
every such operation, ``modeled_wait_seconds`` the part that was slept;
``modeled_by_op`` and ``modeled_wait_by_op`` split both by operation
(``exchange``, ``allreduce``, ``alltoallv``).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Any, Callable, Iterator, NoReturn, Sequence

import numpy as np
import torch

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 2**31 - 1
"""Largest single message (bytes) sent by default; larger payloads are chunked."""

_REDUCE_OPS = ("sum", "prod", "max", "min", "mean")
_TAG_EXCHANGE = 1000
_TAG_ALLTOALLV = 3000
_TAG_SPAN = 1000  # chunk c of a message uses tag base + c % _TAG_SPAN
_TAG_CHANNELS = 10000  # exchange channel k >= 1 uses tag base _TAG_CHANNELS + (k - 1) * _TAG_SPAN
MAX_CHANNEL = 16


def _chunk_ranges(total: int, limit: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(total)`` in pieces of at most ``limit``.

    Empty for ``total == 0`` (zero-byte messages are never sent).
    """
    if limit < 1:
        raise ValueError(f"max_message_bytes must be >= 1, got {limit}")
    return [(start, min(start + limit, total)) for start in range(0, total, limit)]


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """1-D ``uint8`` view of the bytes of a contiguous tensor (no copy)."""
    if t.numel() == 0:  # empty tensors may carry strides that forbid a dtype view
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    flat = t.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


_HUGE_BYTES = 4 << 20
_NUMPY_OF = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64, torch.uint8: np.uint8,
             torch.int32: np.int32}


def _receive_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised receive buffer; a large CPU one comes from NumPy, which asks the kernel for
    transparent huge pages: MPI's first write into it then takes ~1/500 of the page faults."""
    np_dtype = _NUMPY_OF.get(dtype)
    if device.type == "cpu" and np_dtype is not None and math.prod(shape) * np.dtype(np_dtype).itemsize >= _HUGE_BYTES:
        return torch.from_numpy(np.empty(shape, dtype=np_dtype))
    return torch.empty(shape, dtype=dtype, device=device)


def _as_device(device: torch.device | str | None) -> torch.device | None:
    return None if device is None else torch.device(device)


class Request:
    """Handle of a started :meth:`Communicator.exchange_start`.

    ``wait()`` blocks until every message of the exchange has arrived and
    returns ``{peer: tensor}`` with the shapes and dtypes of ``recv_specs``.
    Calling ``wait()`` again returns the same dict.
    """

    def __init__(self, comm: "Communicator", handles: list[Any], results: dict[int, torch.Tensor],
                 staged: list[tuple[torch.Tensor, torch.Tensor]], keep_alive: list[torch.Tensor],
                 deadline: float = 0.0):
        self._comm = comm
        self._deadline = deadline  # perf_counter time before which a modelled link is still busy
        self._handles = handles
        self._results = results
        self._staged = staged
        self._keep_alive = keep_alive  # send buffers must live until the sends complete
        self._done = False

    @property
    def done(self) -> bool:
        """Whether :meth:`wait` has completed."""
        return self._done

    def test(self) -> bool:
        """Whether every message has arrived, without blocking (``MPI_Testall``); once true, :meth:`wait`
        returns at once. Polling this drives the library's progress (a cooperative wait)."""
        if self._done:
            return True
        if self._comm._testall(self._handles):
            self._handles = []
            return True
        return False

    def wait(self) -> dict[int, torch.Tensor]:
        """Block until all sends and receives finished; ``{peer: received tensor}``."""
        if self._done:
            return self._results
        with self._comm._timed("exchange_wait"):
            self._comm._waitall(self._handles)
            for out, host in self._staged:
                out.copy_(host, non_blocking=False)
            self._comm._sleep_until(self._deadline, "exchange")
        self._handles, self._staged, self._keep_alive = [], [], []
        self._done = True
        return self._results


class BoundedRequest:
    """Handle of a started :meth:`Communicator.exchange_start_bounded`: ``test()`` drives the transfer without
    blocking (and says whether it finished); ``wait()`` returns ``{peer: uint8 tensor}`` of what each peer sent."""

    def __init__(self, comm: "Communicator", tag: int, start: float, bounds: dict[int, int],
                 recv: dict[int, torch.Tensor], handles: list[Any], later: list[Any], keep_alive: list[torch.Tensor],
                 bytes_out: int, peers: int, two_phase: bool):
        self._comm, self._tag, self._start, self._bounds = comm, tag, start, bounds
        # two phases: the lengths (sent and received) first; the payload sends (``later``) complete only once
        # the peer has posted its payload receive, so they are waited for with those
        self._recv, self._handles, self._later, self._keep_alive = recv, handles, later, keep_alive
        self._bytes_out, self._peers = bytes_out, peers
        self._payload_posted = not two_phase
        self._results: dict[int, torch.Tensor] = {}
        self.done = False

    def _length(self, peer: int) -> int:
        n = int(self._recv[peer][:8].view(torch.int64)[0])
        if not 0 <= n <= self._bounds[peer]:
            raise RuntimeError(f"exchange_start_bounded: rank {peer} sent {n} bytes, more than the bound "
                               f"{self._bounds[peer]} rank {self._comm.rank} posted")
        return n

    def _post_payloads(self) -> None:
        """Two-phase backends: the lengths have arrived; post the payload receives."""
        handles = []
        for p in sorted(self._recv):
            n = self._length(p)
            body = torch.empty(8 + n, dtype=torch.uint8)
            body[:8] = self._recv[p][:8]
            self._recv[p] = body
            if n:
                handles.append(self._comm._irecv(body[8:], p, self._tag + 1))
        self._handles = self._later + self._comm._launch(handles)
        self._later = []
        self._payload_posted = True

    def test(self) -> bool:
        """Whether every message has arrived (non-blocking; call it while computing to drive the transfer)."""
        if self.done:
            return True
        if not self._comm._testall(self._handles):
            return False
        self._handles = []
        if not self._payload_posted:
            self._post_payloads()
            if not self._comm._testall(self._handles):
                return False
            self._handles = []
        return True

    def wait(self) -> dict[int, torch.Tensor]:
        """Block until every message has arrived; ``{peer: uint8[bytes it sent]}``."""
        if self.done:
            return self._results
        comm = self._comm
        with comm._timed("exchange_wait"):
            comm._waitall(self._handles)
            if not self._payload_posted:
                self._post_payloads()
                comm._waitall(self._handles)
            self._results = {p: buf[8:8 + self._length(p)] for p, buf in self._recv.items()}
            if comm.link is not None:
                into = sum(int(t.numel()) for t in self._results.values())
                cost = comm.link.cost(self._bytes_out, into, self._peers)
                comm.modeled_seconds += cost
                comm.modeled_by_op["exchange"] += cost
                comm._sleep_until(self._start + cost, "exchange")
        self._handles, self._keep_alive, self.done = [], [], True
        return self._results


class ReduceRequest:
    """Handle of a started :meth:`Communicator.allreduce_start`: ``test()`` (non-blocking) and ``wait()``
    (blocking) return the reduced tensor once complete (``test`` returns None before)."""

    def __init__(self, comm: "Communicator", handles: list[Any], t: torch.Tensor):
        self._comm, self._handles, self._t = comm, handles, t
        self.done = not handles

    def test(self) -> torch.Tensor | None:
        if not self.done and self._comm._testall(self._handles):
            self._handles, self.done = [], True
        return self._t if self.done else None

    def wait(self) -> torch.Tensor:
        if not self.done:
            with self._comm._timed("allreduce_wait"):
                self._comm._waitall(self._handles)
            self._handles, self.done = [], True
        return self._t


class Communicator(ABC):
    """Collective and point-to-point communication between the ranks of a job.

    Attributes:
        rank, size: this process's rank and the number of ranks.
        local_rank, local_size: rank among, and number of, the ranks on this node.
        backend: ``"mpi"``, ``"torch"`` or ``"local"``.
        bytes_sent: payload bytes this rank sent since the last :meth:`reset_counters`
            (rules in the module docstring); ``bytes_by_op`` splits it by operation.
        comm_seconds: wall seconds spent inside communication calls.
        max_message_bytes: largest single message; larger ones are chunked.
    """

    backend: str = ""

    def __init__(self, rank: int, size: int, local_rank: int, local_size: int,
                 max_message_bytes: int = MAX_MESSAGE_BYTES):
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes}")
        self.rank = int(rank)
        self.size = int(size)
        self.local_rank = int(local_rank)
        self.local_size = int(local_size)
        self.max_message_bytes = int(max_message_bytes)
        self._timer_depth = 0
        self.link: Any = None  # a hpc_graph.comm.link.LinkModel, or None (no modelled link)
        self._blocked: tuple[str, float] | None = None  # (operation, monotonic start) of the call in progress
        self._watchdog: threading.Thread | None = None
        self._timeout = 0.0
        self._stall_status: Callable[[], int] = lambda: 1
        self.reset_counters()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(backend={self.backend!r}, rank={self.rank}, "
                f"size={self.size}, local_rank={self.local_rank}, local_size={self.local_size})")

    # ------------------------------------------------------------------ counters
    def set_link(self, link: Any) -> None:
        """Model every later exchange, all-reduce and all-to-all-v on ``link`` (a LinkModel; None: off)."""
        self.link = link

    def _sleep_until(self, deadline: float, op: str) -> None:
        """Sleep until ``deadline`` (perf_counter seconds) if it has not passed; count the sleep."""
        left = deadline - time.perf_counter()
        if left > 0:
            time.sleep(left)
            self.modeled_wait_seconds += left
            self.modeled_wait_by_op[op] += left

    def _modeled(self, seconds: float, op: str) -> float:
        """Count ``seconds`` of modelled link time; the perf_counter deadline they end at."""
        self.modeled_seconds += seconds
        self.modeled_by_op[op] += seconds
        return time.perf_counter() + seconds

    def reset_counters(self) -> None:
        """Zero ``bytes_sent``, ``bytes_by_op``, ``calls``, ``comm_seconds`` and the modelled-link times."""
        self.bytes_sent = 0
        self.comm_seconds = 0.0
        self.modeled_seconds = 0.0
        self.modeled_wait_seconds = 0.0
        self.modeled_by_op: dict[str, float] = defaultdict(float)
        self.modeled_wait_by_op: dict[str, float] = defaultdict(float)
        self.bytes_by_op: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    def counters(self) -> dict[str, Any]:
        """Snapshot: ``bytes_sent``, ``comm_seconds``, ``bytes_by_op``, ``calls``, ``modeled_seconds``,
        ``modeled_wait_seconds``."""
        return {"bytes_sent": self.bytes_sent, "comm_seconds": self.comm_seconds,
                "bytes_by_op": dict(self.bytes_by_op), "calls": dict(self.calls),
                "modeled_seconds": self.modeled_seconds, "modeled_wait_seconds": self.modeled_wait_seconds,
                "modeled_by_op": dict(self.modeled_by_op), "modeled_wait_by_op": dict(self.modeled_wait_by_op)}

    def _count(self, op: str, nbytes: int) -> None:
        if self.size > 1 and nbytes:
            self.bytes_sent += int(nbytes)
            self.bytes_by_op[op] += int(nbytes)

    @contextlib.contextmanager
    def _timed(self, op: str) -> Iterator[None]:
        """Add the wall time of the outermost timed call to ``comm_seconds`` (and show it to the watchdog)."""
        if self._timer_depth == 0:
            self.calls[op] += 1
            self._blocked = (op, time.monotonic())
        self._timer_depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._timer_depth -= 1
            if self._timer_depth == 0:
                self.comm_seconds += time.perf_counter() - start
                self._blocked = None

    @contextlib.contextmanager
    def watched(self, op: str) -> Iterator[None]:
        """A wait the caller polls itself (a request's ``test()`` in a loop that may compute between polls, as a
        pipeline stage filling its bubble does): shown to the stall watchdog as a blocking ``op`` would be, so
        that a frozen peer ends the job there too; not added to ``comm_seconds`` (the loop may compute). Inside a
        blocking call already: nothing changes."""
        if self._blocked is not None:
            yield
            return
        self._blocked = (op, time.monotonic())
        try:
            yield
        finally:
            self._blocked = None

    # ------------------------------------------------------------------ watchdog
    def set_timeout(self, seconds: float, status: Callable[[], int] | None = None) -> None:
        """Abort the whole job when one blocking call (a collective, an exchange's wait) makes no progress for
        ``seconds``: a peer rank is stopped, frozen or gone, and the job would otherwise wait for ever. A
        watchdog thread logs one line naming this rank, the operation and the wait, then calls
        :meth:`abort` with ``status()`` (default 1). ``seconds`` <= 0 turns it off. One process of one rank:
        nothing to wait for, no watchdog."""
        self._timeout = float(seconds)
        if status is not None:
            self._stall_status = status
        if self._timeout <= 0 or self.size == 1 or self._watchdog is not None:
            return
        self._watchdog = threading.Thread(target=self._watch, name="hpc-graph-comm-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while True:
            timeout = self._timeout
            time.sleep(min(1.0, timeout / 4) if timeout > 0 else 1.0)
            blocked = self._blocked
            if timeout <= 0 or blocked is None:
                continue
            waited = time.monotonic() - blocked[1]
            if waited >= timeout:
                log.critical("rank %d: %s made no progress for %.0f s (comm.timeout %g s): a peer rank is "
                             "stopped, frozen or gone; aborting all %d ranks", self.rank, blocked[0], waited,
                             timeout, self.size)
                self.abort(self._stall_status())

    # ------------------------------------------------------- backend primitives
    @abstractmethod
    def _device_capable(self, device: torch.device) -> bool:
        """Whether tensors on ``device`` can be handed to the backend without staging."""

    @abstractmethod
    def _isend(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        """Start sending the 1-D uint8 tensor ``buf`` (<= max_message_bytes) to ``peer``."""

    @abstractmethod
    def _irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        """Start receiving into the 1-D uint8 tensor ``buf`` from ``peer``."""

    def _launch(self, handles: list[Any]) -> list[Any]:
        """Start posted operations that a backend batches (torch.distributed); default: no-op."""
        return handles

    @abstractmethod
    def _waitall(self, handles: list[Any]) -> None:
        """Complete every handle returned by :meth:`_launch`."""

    def _testall(self, handles: list[Any]) -> bool:
        """Whether every started handle completed (non-blocking); backends without a test wait instead."""
        self._waitall(handles)
        return True

    def _iallreduce_flat(self, t: torch.Tensor) -> list[Any]:
        """Start a sum all-reduce of a contiguous flat ``t`` in place; handles for :meth:`_testall`. Backends
        without a non-blocking all-reduce reduce at once and return no handles."""
        self._allreduce_flat(t, "sum")
        return []

    def dup(self) -> "Communicator":
        """A new communicator over the same ranks whose messages never match this one's (``MPI_Comm_dup``):
        a second job in the same processes (the language model of LM co-training) communicates on it."""
        raise NotImplementedError(f"the {self.backend!r} communicator cannot be duplicated; use the mpi backend")

    @abstractmethod
    def _allreduce_flat(self, t: torch.Tensor, op: str) -> None:
        """In-place all-reduce of a contiguous 1-D tensor (<= max_message_bytes); ``op`` != mean."""

    @abstractmethod
    def _bcast_flat(self, buf: torch.Tensor, root: int) -> None:
        """In-place broadcast of a 1-D uint8 tensor (<= max_message_bytes)."""

    @abstractmethod
    def _alltoall_int64(self, values: np.ndarray) -> np.ndarray:
        """``out[p]`` = ``values[rank]`` of rank ``p``: int64[size] -> int64[size]."""

    @abstractmethod
    def _alltoallv_bytes(self, send: torch.Tensor, send_bytes: np.ndarray, send_displs: np.ndarray,
                         recv: torch.Tensor, recv_bytes: np.ndarray, recv_displs: np.ndarray) -> None:
        """One all-to-all-v over 1-D uint8 tensors; every count and displacement fits the limit."""

    @abstractmethod
    def allgather_object(self, obj: Any) -> list:
        """Gather one picklable object per rank; every rank returns the list in rank order."""

    @abstractmethod
    def barrier(self) -> None:
        """Block until every rank reached the barrier."""

    @abstractmethod
    def abort(self, code: int = 1) -> NoReturn:
        """Terminate every rank of the job with exit status ``code`` (never returns)."""

    # --------------------------------------------------------------- helpers
    def _check_peer(self, peer: Any, what: str) -> int:
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)):
            raise ValueError(f"{what}: peer {peer!r} is not an integer rank")
        if not 0 <= int(peer) < self.size:
            raise ValueError(f"{what}: peer {int(peer)} out of range [0, {self.size})")
        return int(peer)

    def _comm_device(self, device: torch.device) -> torch.device:
        """Where buffers for ``device`` live while communicating (host when staging)."""
        return device if self._device_capable(device) else torch.device("cpu")

    @staticmethod
    def _sync(device: torch.device) -> None:
        """Make queued GPU work visible to a library reading device memory directly."""
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()

    def _post_chunks(self, post, buf: torch.Tensor, peer: int, tag_base: int) -> list[Any]:
        return [post(buf[start:stop], peer, tag_base + i % _TAG_SPAN)
                for i, (start, stop) in enumerate(_chunk_ranges(buf.numel(), self.max_message_bytes))]

    # -------------------------------------------------------------- collectives
    def allreduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduce ``t`` in place over all ranks and return it.

        ``op``: ``"sum"``, ``"prod"``, ``"max"``, ``"min"`` or ``"mean"`` (sum
        divided by ``size``; floating tensors only). Any shape; non-contiguous
        and CUDA tensors are handled (through a contiguous/host copy).
        """
        if op not in _REDUCE_OPS:
            raise ValueError(f"allreduce_: op must be one of {_REDUCE_OPS}, got {op!r}")
        if op == "mean" and not (t.is_floating_point() or t.is_complex()):
            raise ValueError(f"allreduce_: op 'mean' needs a floating tensor, got {t.dtype}")
        if self.size == 1:
            return t
        with self._timed("allreduce"), torch.no_grad():
            deadline = (0.0 if self.link is None else
                        self._modeled(self.link.allreduce_cost(t.numel() * t.element_size(), self.size), "allreduce"))
            comm_dev = self._comm_device(t.device)
            work = t if (t.is_contiguous() and t.device == comm_dev) else t.detach().contiguous().to(comm_dev)
            self._sync(t.device)
            flat = work.reshape(-1)
            itemsize = 4 if flat.dtype in (torch.float16, torch.bfloat16) else flat.element_size()
            step = max(1, self.max_message_bytes // itemsize)  # halves are reduced as float32
            for start, stop in _chunk_ranges(flat.numel(), step):
                self._allreduce_flat(flat[start:stop], "sum" if op == "mean" else op)
            if op == "mean":
                flat.div_(self.size)
            if work is not t:
                t.copy_(work)
            self._count("allreduce", t.numel() * t.element_size())
            self._sleep_until(deadline, "allreduce")
        return t

    def allreduce_start(self, t: torch.Tensor) -> "ReduceRequest":
        """Start a sum all-reduce of ``t`` (contiguous, on CPU or a device MPI reads) in place; returns a
        :class:`ReduceRequest` to :meth:`~ReduceRequest.test` or :meth:`~ReduceRequest.wait`. ``t`` must not be
        touched until then. Every rank must start the same all-reduces in the same order."""
        if not t.is_contiguous() or t.device != self._comm_device(t.device):
            raise ValueError("allreduce_start: needs a contiguous tensor on a device this communicator reads")
        handles: list[Any] = []
        if self.size > 1:
            with self._timed("allreduce"), torch.no_grad():
                self._sync(t.device)
                flat = t.reshape(-1)
                step = max(1, self.max_message_bytes // flat.element_size())
                for start, stop in _chunk_ranges(flat.numel(), step):
                    handles += self._iallreduce_flat(flat[start:stop])
                self._count("allreduce", t.numel() * t.element_size())
        return ReduceRequest(self, handles, t)

    def allreduce_bucketed_(self, tensors: Sequence[torch.Tensor], bucket_bytes: int = 25 << 20,
                            op: str = "sum") -> None:
        """All-reduce many tensors in place with few calls (gradient all-reduce).

        Tensors of the same dtype and device are flattened, in order, into
        buckets of at most ``bucket_bytes`` (a bigger tensor is a bucket by
        itself); one all-reduce per bucket, then the results are copied back.
        """
        if bucket_bytes < 1:
            raise ValueError(f"allreduce_bucketed_: bucket_bytes must be >= 1, got {bucket_bytes}")
        if self.size == 1:
            if op not in _REDUCE_OPS:
                raise ValueError(f"allreduce_bucketed_: op must be one of {_REDUCE_OPS}, got {op!r}")
            return
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        with self._timed("allreduce"), torch.no_grad():
            for group in groups.values():
                bucket: list[torch.Tensor] = []
                filled = 0
                for t in group:
                    nbytes = t.numel() * t.element_size()
                    if bucket and filled + nbytes > bucket_bytes:
                        self._reduce_bucket(bucket, op)
                        bucket, filled = [], 0
                    bucket.append(t)
                    filled += nbytes
                if bucket:
                    self._reduce_bucket(bucket, op)

    def _reduce_bucket(self, bucket: list[torch.Tensor], op: str) -> None:
        if len(bucket) == 1:
            self.allreduce_(bucket[0], op)
            return
        flat = torch.cat([t.detach().reshape(-1) for t in bucket])
        self.allreduce_(flat, op)
        offset = 0
        for t in bucket:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view(t.shape))
            offset += n

    def bcast(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Broadcast ``t`` from ``root`` in place (same shape and dtype on every rank); returns ``t``."""
        root = self._check_peer(root, "bcast root")
        if self.size == 1:
            return t
        with self._timed("bcast"), torch.no_grad():
            comm_dev = self._comm_device(t.device)
            work = t if (t.is_contiguous() and t.device == comm_dev) else t.detach().contiguous().to(comm_dev)
            self._sync(t.device)
            buf = _byte_view(work)
            for start, stop in _chunk_ranges(buf.numel(), self.max_message_bytes):
                self._bcast_flat(buf[start:stop], root)
            if work is not t:
                t.copy_(work)
            if self.rank == root:
                self._count("bcast", buf.numel())
        return t

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        """Broadcast a picklable object from ``root``; every rank returns the root's object.

        The pickle travels as a byte tensor (chunked like any message), so
        objects above 2 GiB are fine.
        """
        root = self._check_peer(root, "bcast_object root")
        if self.size == 1:
            return obj
        with self._timed("bcast_object"):
            length = torch.zeros(1, dtype=torch.int64)
            if self.rank == root:
                data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
                length[0] = len(data)
            self._bcast_flat(_byte_view(length), root)
            if self.rank == root:
                buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
                    torch.empty(0, dtype=torch.uint8)
            else:
                buf = torch.empty(int(length[0]), dtype=torch.uint8)
            for start, stop in _chunk_ranges(buf.numel(), self.max_message_bytes):
                self._bcast_flat(buf[start:stop], root)
            if self.rank == root:
                self._count("bcast_object", buf.numel())
                return obj
            return pickle.loads(buf.numpy().tobytes())

    def alltoallv(self, send: torch.Tensor, send_counts: Sequence[int] | np.ndarray
                  ) -> tuple[torch.Tensor, np.ndarray]:
        """Personalised all-to-all of rows.

        Args:
            send: [sum(send_counts), *row_shape]; rows for rank 0 first, then rank 1, ...
            send_counts: int[size], rows sent to each rank (zeros allowed).
        Returns:
            ``(recv, recv_counts)``: recv [sum(recv_counts), *row_shape] (same dtype and
            device as ``send``), rows from rank 0 first; recv_counts int64[size].
            Messages above ``max_message_bytes`` go as chunked point-to-point messages.
        """
        counts = np.asarray(send_counts, dtype=np.int64).reshape(-1)
        if counts.shape[0] != self.size:
            raise ValueError(f"alltoallv: send_counts has {counts.shape[0]} entries, need size={self.size}")
        if (counts < 0).any():
            raise ValueError("alltoallv: send_counts must be non-negative")
        if send.dim() == 0 or int(counts.sum()) != send.shape[0]:
            raise ValueError(f"alltoallv: sum(send_counts)={int(counts.sum())} does not match "
                             f"send.shape[0]={send.shape[0] if send.dim() else 'scalar'}")
        with self._timed("alltoallv"), torch.no_grad():
            t_start = time.perf_counter()
            recv_counts = self._alltoall_int64(counts) if self.size > 1 else counts.copy()
            row_shape = tuple(send.shape[1:])
            device = send.device
            recv = torch.empty((int(recv_counts.sum()),) + row_shape, dtype=send.dtype, device=device)
            if self.size == 1:
                recv.copy_(send)
                return recv, recv_counts
            comm_dev = self._comm_device(device)
            sbuf_t = send.detach().contiguous().to(comm_dev)
            rbuf_t = recv if comm_dev == device else torch.empty_like(recv, device=comm_dev)
            row_bytes = math.prod(row_shape) * send.element_size()
            sbytes, rbytes = counts * row_bytes, recv_counts * row_bytes
            sdispl = np.concatenate(([0], np.cumsum(sbytes)[:-1])).astype(np.int64)
            rdispl = np.concatenate(([0], np.cumsum(rbytes)[:-1])).astype(np.int64)
            sbuf, rbuf = _byte_view(sbuf_t), _byte_view(rbuf_t)
            self._sync(device)
            limit = self.max_message_bytes
            too_big = int(max(int(sbytes.sum()), int(rbytes.sum())) > limit)
            flag = torch.tensor([too_big], dtype=torch.int64)
            self._allreduce_flat(flag, "max")
            if int(flag[0]) == 0:
                self._alltoallv_bytes(sbuf, sbytes, sdispl, rbuf, rbytes, rdispl)
            else:
                handles: list[Any] = []
                for p in range(self.size):
                    if p != self.rank:
                        handles += self._post_chunks(self._irecv, rbuf[rdispl[p]:rdispl[p] + rbytes[p]],
                                                     p, _TAG_ALLTOALLV)
                for p in range(self.size):
                    if p != self.rank:
                        handles += self._post_chunks(self._isend, sbuf[sdispl[p]:sdispl[p] + sbytes[p]],
                                                     p, _TAG_ALLTOALLV)
                me = self.rank
                handles = self._launch(handles)
                rbuf[rdispl[me]:rdispl[me] + rbytes[me]].copy_(sbuf[sdispl[me]:sdispl[me] + sbytes[me]])
                self._waitall(handles)
            if rbuf_t is not recv:
                recv.copy_(rbuf_t)
            self._count("alltoallv", int(sbytes.sum() - sbytes[self.rank]))
            if self.link is not None:
                me = self.rank
                peers = int(sum(1 for p in range(self.size) if p != me and (sbytes[p] or rbytes[p])))
                cost = self.link.cost(int(sbytes.sum() - sbytes[me]), int(rbytes.sum() - rbytes[me]), peers)
                self._modeled(cost, "alltoallv")
                self._sleep_until(t_start + cost, "alltoallv")
        return recv, recv_counts

    # ----------------------------------------------------------- point to point
    def exchange(self, sends: dict[int, torch.Tensor],
                 recv_specs: dict[int, tuple[tuple[int, ...], torch.dtype]], *,
                 device: torch.device | str | None = None) -> dict[int, torch.Tensor]:
        """Send ``sends[p]`` to each listed peer ``p`` and receive from each peer in ``recv_specs``.

        Non-blocking point-to-point with only the listed peers, then waits for all.
        ``recv_specs[p] = (shape, dtype)`` of what ``p`` sends here; a send to
        ``p`` must be matched by a spec on ``p`` with the same byte size
        (zero-size messages are skipped on both sides). A rank may list itself
        (local copy). Received tensors live on ``device`` (default: the device
        of the first send tensor, else CPU). Returns ``{peer: tensor}``.
        """
        return self.exchange_start(sends, recv_specs, device=device).wait()

    def exchange_start(self, sends: dict[int, torch.Tensor],
                       recv_specs: dict[int, tuple[tuple[int, ...], torch.dtype]], *,
                       device: torch.device | str | None = None, channel: int = 0) -> Request:
        """Start :meth:`exchange` and return a :class:`Request`; ``request.wait()`` gives the dict.

        ``channel`` (0..``MAX_CHANNEL``) separates independent streams of messages between the
        same ranks: within a channel, messages from one peer are received in the order they were
        sent; a send may be posted long before the matching receive (e.g. sends of one call and
        receives of a later one), as long as both sides post in the same order per channel.

        Sends are posted from copies only where needed (non-contiguous or staged
        tensors); otherwise the caller must not modify ``sends`` before ``wait()``.
        """
        if isinstance(channel, bool) or not isinstance(channel, int) or not 0 <= channel <= MAX_CHANNEL:
            raise ValueError(f"exchange: channel must be an integer in [0, {MAX_CHANNEL}], got {channel!r}")
        tag = _TAG_EXCHANGE if channel == 0 else _TAG_CHANNELS + (channel - 1) * _TAG_SPAN
        with self._timed("exchange"), torch.no_grad():
            sends = {self._check_peer(p, "exchange sends"): t for p, t in sends.items()}
            specs = {self._check_peer(p, "exchange recv_specs"): self._check_spec(p, spec)
                     for p, spec in recv_specs.items()}
            if (self.rank in specs) != (self.rank in sends):
                raise ValueError(f"exchange: this rank ({self.rank}) must be in both sends and "
                                 f"recv_specs or in neither")
            if self.rank in sends:
                shape, dtype = specs[self.rank]
                mine = sends[self.rank]
                if mine.dtype != dtype or mine.numel() != math.prod(shape):
                    raise ValueError(f"exchange: self message {tuple(mine.shape)} {mine.dtype} does "
                                     f"not match recv_specs[{self.rank}] {shape} {dtype}")
            dev = _as_device(device)
            if dev is None:
                dev = next(iter(sends.values())).device if sends else torch.device("cpu")
            comm_dev = self._comm_device(dev)
            results: dict[int, torch.Tensor] = {}
            staged: list[tuple[torch.Tensor, torch.Tensor]] = []
            handles: list[Any] = []
            for p in sorted(specs):
                shape, dtype = specs[p]
                out = _receive_buffer(shape, dtype, dev)
                results[p] = out
                if p == self.rank:
                    out.copy_(sends[p].detach().reshape(shape))
                    continue
                buf = out if comm_dev == dev else torch.empty(shape, dtype=dtype, device=comm_dev)
                if buf is not out:
                    staged.append((out, buf))
                handles += self._post_chunks(self._irecv, _byte_view(buf), p, tag)
            for cuda_dev in {t.device for t in sends.values() if t.is_cuda}:
                self._sync(cuda_dev)
            keep: list[torch.Tensor] = []
            for p in sorted(sends):
                if p == self.rank:
                    continue
                src = sends[p].detach()
                target = self._comm_device(src.device)
                if not src.is_contiguous() or src.device != target:
                    src = src.contiguous().to(target)
                keep.append(src)
                buf = _byte_view(src)
                handles += self._post_chunks(self._isend, buf, p, tag)
                self._count("exchange", buf.numel())
            deadline = 0.0
            if self.link is not None:
                out = {p: sends[p].numel() * sends[p].element_size() for p in sends if p != self.rank}
                into = {p: results[p].numel() * results[p].element_size() for p in specs if p != self.rank}
                peers = sum(1 for p in set(out) | set(into) if out.get(p, 0) or into.get(p, 0))
                deadline = self._modeled(self.link.cost(sum(out.values()), sum(into.values()), peers), "exchange")
            return Request(self, self._launch(handles), results, staged, keep, deadline)

    #: whether a receive may be posted larger than the message that fills it (MPI: yes); backends that cannot
    #: (torch.distributed) send a bounded message in two phases, its length first
    shorter_receives = False

    def exchange_start_bounded(self, sends: dict[int, torch.Tensor], recv_bounds: dict[int, int], *,
                               channel: int = 0) -> BoundedRequest:
        """Start an exchange of byte messages whose receivers know only the most bytes each peer may send.

        ``sends[p]``: a 1-D ``uint8`` CPU tensor for peer ``p`` (possibly empty); ``recv_bounds[p]``: the most
        bytes ``p`` sends here. Every receive is posted now, with room for its bound, so a transfer
        progresses while the caller computes instead of inside a later wait (poll ``request.test()`` at
        natural points: libraries like MPICH move data only inside MPI calls). Each message carries its
        length (8 bytes, counted in ``bytes_sent`` with the payload); ``wait()`` returns exactly what each
        peer sent. A message travels whole: ``bound + 8 <= max_message_bytes``. Backends without
        :attr:`shorter_receives` send the length first and post the payload receive when it has arrived (a test
        or the wait).
        Ordering: as :meth:`exchange_start`, per ``channel``, which must not also carry :meth:`exchange_start`
        messages. Modelled link: the bytes sent and received, from this call on; the wait sleeps what is left.
        """
        if isinstance(channel, bool) or not isinstance(channel, int) or not 0 <= channel <= MAX_CHANNEL:
            raise ValueError(f"exchange_start_bounded: channel must be an integer in [0, {MAX_CHANNEL}], "
                             f"got {channel!r}")
        tag = _TAG_EXCHANGE if channel == 0 else _TAG_CHANNELS + (channel - 1) * _TAG_SPAN
        start = time.perf_counter()
        with self._timed("exchange"), torch.no_grad():
            bounds = {self._check_peer(p, "exchange_start_bounded recv_bounds"): int(b)
                      for p, b in recv_bounds.items()}
            sends = {self._check_peer(p, "exchange_start_bounded sends"): t for p, t in sends.items()}
            if self.rank in bounds or self.rank in sends:
                raise ValueError(f"exchange_start_bounded: rank {self.rank} cannot send to itself")
            for p, b in bounds.items():
                if b < 0 or b + 8 > self.max_message_bytes:
                    raise ValueError(f"exchange_start_bounded: bound {b} for rank {p} must be in [0, "
                                     f"max_message_bytes - 8 = {self.max_message_bytes - 8}]")
            two_phase = not self.shorter_receives
            recv: dict[int, torch.Tensor] = {}
            handles: list[Any] = []
            later: list[Any] = []
            for p in sorted(bounds):
                recv[p] = torch.empty(8 if two_phase else 8 + bounds[p], dtype=torch.uint8)
                handles.append(self._irecv(recv[p], p, tag))
            keep: list[torch.Tensor] = []
            bytes_out = 0
            for p in sorted(sends):
                t = sends[p]
                if t.dtype != torch.uint8 or t.dim() != 1 or t.device.type != "cpu":
                    raise ValueError(f"exchange_start_bounded: sends[{p}] must be a 1-D uint8 CPU tensor, got "
                                     f"{tuple(t.shape)} {t.dtype} on {t.device}")
                n = int(t.numel())
                if n + 8 > self.max_message_bytes:
                    raise ValueError(f"exchange_start_bounded: {n} bytes for rank {p} exceed max_message_bytes - 8")
                head = torch.tensor([n], dtype=torch.int64).view(torch.uint8)
                if two_phase:
                    keep += [head, t.contiguous()]
                    handles.append(self._isend(head, p, tag))
                    if n:
                        later.append(self._isend(keep[-1], p, tag + 1))
                else:
                    msg = torch.cat([head, t])
                    keep.append(msg)
                    handles.append(self._isend(msg, p, tag))
                self._count("exchange", n + 8)
                bytes_out += n + 8
            peers = len(set(bounds) | set(sends))
            return BoundedRequest(self, tag, start, bounds, recv, self._launch(handles),
                                  self._launch(later) if later else [], keep, bytes_out, peers, two_phase)

    @staticmethod
    def _check_spec(peer: int, spec: Any) -> tuple[tuple[int, ...], torch.dtype]:
        try:
            shape, dtype = spec
            shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise ValueError(f"exchange recv_specs[{peer}]: expected (shape, dtype), got {spec!r}") from None
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"exchange recv_specs[{peer}]: {dtype!r} is not a torch.dtype")
        if any(s < 0 for s in shape):
            raise ValueError(f"exchange recv_specs[{peer}]: negative size in shape {shape}")
        return shape, dtype


def _flush_streams(grace: float = 0.0) -> None:
    """Flush logging handlers, stdout and stderr; then wait ``grace`` seconds.

    Before ``MPI_Abort`` the wait matters: the launcher forwards a rank's
    output through pipes, and MPICH's Hydra kills the job as soon as the abort
    arrives, dropping what it had not forwarded yet (the error message that
    says why the job died). One second is negligible next to a dead job.
    """
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if grace > 0:
        time.sleep(grace)


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")
