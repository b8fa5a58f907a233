"""The activation offloader: one step's life, its state, and the parts it is made of.

One :class:`ActivationOffloader` serves many steps; each ``with`` block is a
step. ``__enter__`` resets the step's state, begins the policy's step (its
decisions, the layers it recomputes) and installs the hooks; ``__exit__``
removes them and, once the worker has drained, fills in the step's
:class:`~.report.OffloadReport`. The step's phase turns from forward to
backward once (:meth:`_backward_starts`: at the first gradient hook or
unpack), back to forward only where a new forward starts after a finished
backward in the same block (gradient accumulation).

The class holds all the state (initialized in ``__init__`` and
``__enter__``); the code that works on it is in mixins, one concern a module:

- :mod:`.saved_hooks`: pack and unpack (what is stored, dedup, forwarding,
  stalls);
- :mod:`.layers`: the module hooks (groups, layer boundaries, where backward
  begins, timing, recompute) and :func:`find_layers`;
- :mod:`.copy_out`: forward's side (storing in a tier, file writes, the copies
  in flight and their bound: ``copy_window``, ``inflight_bytes``);
- :mod:`.read_ahead`: backward's side (prefetch and the credit that bounds it:
  ``prefetch_layers``, ``read_ahead_bytes``; loads);
- :mod:`.entries`: what is stored (:class:`~.entries._Entry`, one a region;
  :class:`~.entries._Saved`, one a save), the worker, and the release of
  entries;
- :mod:`.diagnosis`: ``diagnose``'s samples.

Mixins rather than objects of their own so that every part reads and writes
the one set of fields under the one lock, as it did in a single class, and so
that tests may still patch a method on the offloader (``_copy_out``,
``_finish_step``).

CUDA: device-to-host copies run on a copy stream of their own that waits for
the compute stream; host-to-device copies on another (allocations for them
are made on it, and the tensor handed to autograd is recorded on the compute
stream). The compute stream waits only for a tensor it is about to use. Files
get device memory straight through libspillfs_client's pinned pool.

Threading: a worker thread waits for file writes to complete (then drops the
original tensor, or keeps it where the write failed) and releases what
autograd dropped; all state is under ``self._lock``.
"""

import collections
import os
import threading
import time
import warnings

import torch

from . import policy as _policy
from .copy_out import _CopyOut
from .diagnosis import _Diagnosis
from .entries import _EntryRelease, _Worker
from .layers import _LayerHooks, find_layers
from .read_ahead import _ReadAhead
from .report import OffloadReport
from .saved_hooks import _SavedTensorHooks

__all__ = ["ActivationOffloader", "find_layers"]

_MiB = 1 << 20


class ActivationOffloader(_SavedTensorHooks, _LayerHooks, _CopyOut, _ReadAhead, _EntryRelease, _Diagnosis):
    r"""Offloads the tensors autograd saves in its ``with`` blocks (one block = one step).

    Made by :func:`spillfs.torch.offload_activations`, which documents the
    arguments.

    Attributes:
        reports (list): one :class:`OffloadReport` per step; ``report``: the latest.
        policy: the policy object (:class:`AdaptivePolicy`, or the plain one of
            ``"all"`` / ``"none"``).
        staging_bytes (int): host memory (pinned on CUDA) that file writes are
            staged through, so an original goes once copied out rather than once
            on disk (512 MiB; 0: written from where the tensor is).
        copy_window (int): how many layers the device-to-host copies may lag
            behind the layer being computed before the compute stream waits for
            them (1); bounds the device memory of copies in flight.
        inflight_bytes, read_ahead_bytes: the memory-tight options of
            :func:`spillfs.torch.offload_activations` (None: off).
        diagnose (bool): record, at every hook, what the offloader holds on the
            device and the allocator's figures around the step's peak
            (``report.diagnosis``; costs host time: for one step of a benchmark).
    """

    def __init__(self, dir=None, *, host_bytes, min_bytes, prefetch_layers, policy, layers, group_bytes=64 * _MiB,
                 io_backend="auto", keep_last=True, inflight_bytes=None, read_ahead_bytes=None):
        if host_bytes is None or host_bytes < 0:
            raise ValueError(f"host_bytes must be a non-negative number of bytes, not {host_bytes!r}")
        for name, value in (("inflight_bytes", inflight_bytes), ("read_ahead_bytes", read_ahead_bytes)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be None or a non-negative number of bytes, not {value!r}")
        # memory-tight forward: originals held while their copies run, at most this many bytes; forward's
        # end and backward's start wait for every copy (the head and backward start without them)
        self.inflight_bytes = None if inflight_bytes is None else int(inflight_bytes)
        # memory-tight backward: reads only replace what backward freed, plus this many bytes
        self.read_ahead_bytes = None if read_ahead_bytes is None else int(read_ahead_bytes)
        self.diagnose = False
        if min_bytes < 0:
            raise ValueError(f"min_bytes must be >= 0, not {min_bytes!r}")
        if prefetch_layers < 0:
            raise ValueError(f"prefetch_layers must be >= 0, not {prefetch_layers!r}")
        self.dir = None if dir is None else os.fspath(dir)
        self.host_bytes = int(host_bytes)
        self.min_bytes = int(min_bytes)
        self.prefetch_layers = int(prefetch_layers)
        self.policy = _policy.make_policy(policy)
        self.group_bytes = int(group_bytes)
        self.io_backend = io_backend
        self.keep_last = keep_last
        self._model = None
        if layers is None:
            self._layers = []
        elif isinstance(layers, torch.nn.Module) and not isinstance(layers, torch.nn.ModuleList):
            self._model = layers
            self._layers = find_layers(layers)
        else:
            self._layers = list(layers)
            for m in self._layers:
                if not isinstance(m, torch.nn.Module):
                    raise TypeError(f"layers must be nn.Modules (or a model), got {type(m).__name__}")
        self.reports = []
        self.report = None
        self._lock = threading.RLock()
        self._worker = None
        self._host = None
        self._files = None
        self._cuda = None  # (d2h stream, h2d stream) once a CUDA tensor was seen
        self._step = -1
        self._active = False
        self._hooks_ctx = None
        self._handles = []
        self._entries = {}  # key -> live entry
        self._step_entries = []
        self._groups = collections.defaultdict(list)
        self._prefetched_groups = set()  # queued for reading ahead
        self._started_groups = set()  # whose backward began (what they still needed was read then)
        self._prefetch_queue = collections.deque()  # entries of earlier layers, in the order backward needs them
        self._prefetch_credit = 0
        self._read_ahead = 0
        self._freed_q = collections.deque()  # entries whose unpacked values autograd dropped; bytes of kept ones
        self._kept_refs = set()  # weak references to kept activations (tight read-ahead: their frees are credit)
        self._allowance_given = False
        self._read_bytes = 0  # this step's backward: bytes read back, and bytes of saved activations freed
        self._freed_bytes = 0
        self._diag = None
        self._layer_files = {}
        self._group_stack = []
        self._pending = None
        self._phase = "forward"
        self._outstanding = 0
        self._after_last_layer = False
        self._param_ptrs = set()
        self._seen_modules = set()
        self._cum_bytes = 0
        self._warnings = []
        self._marks = []
        self._fell_back_disk = False
        self._warned_disk = False
        self._kept_keys = set()
        self._layer_stored = collections.defaultdict(int)  # group -> bytes stored this step (the policy's quota)
        self._inflight = collections.deque()  # entries whose device-to-host copy may still run
        self._staging = None  # HostTier staging the writes to files
        # pinned bytes staging file writes (the original goes once copied out; 0: written from where it is)
        self.staging_bytes = 512 * _MiB
        # originals of groups more than this many before the current one go even where their copy still runs
        # (the compute stream waits for the copy): what bounds the device memory of copies in flight
        self.copy_window = 1
        self._cuda_marks = False
        self._t0 = 0.0
        self._trace = None  # tests: a list of (storage ptr, tier) of what was stored

    # -- public ---------------------------------------------------------------

    @property
    def layers(self):
        """The modules whose hooks tag, time and prefetch (a list)."""
        return list(self._layers)

    @property
    def _drain(self):
        return self.inflight_bytes is not None

    @property
    def _tight_reads(self):
        return self.read_ahead_bytes is not None

    @property
    def _track_frees(self):
        return self.read_ahead_bytes is not None or self.diagnose

    def in_use(self):
        """What this offloader still holds: ``{"host_bytes", "files", "entries"}``."""
        with self._lock:
            return {"host_bytes": sum(p.in_use() for p in (self._host, self._staging) if p is not None),
                    "files": self._files.leftover() if self._files is not None else [],
                    "entries": sum(1 for e in self._step_entries if not e.released)}

    def close(self):
        """Frees everything: host slabs, files, the directory, the worker thread."""
        if self._active:
            raise RuntimeError("close() inside the offloader's with block")
        self._release_all()
        with self._lock:
            if self._host is not None:
                self._host.close()
                self._host = None
            if self._staging is not None:
                self._staging.close()
                self._staging = None
            if self._files is not None:
                self._files.close()
                self._files = None
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def __del__(self):
        try:
            if self._files is not None:
                self._files.close()
            if self._worker is not None:
                self._worker.stop()
        except Exception:
            pass

    # -- the step -------------------------------------------------------------

    def __enter__(self):
        if self._active:
            raise RuntimeError("spillfs.torch.offload_activations: the offloader's with block is not reentrant")
        self._release_all()  # what autograd still held from the previous step
        self._step += 1
        self._active = True
        self._phase = "forward"
        self._entries = {}
        self._step_entries = []
        self._groups = collections.defaultdict(list)
        self._prefetched_groups = set()
        self._started_groups = set()
        self._prefetch_queue = collections.deque()
        self._prefetch_credit = 0
        self._read_ahead = 0  # bytes read back (loads started) and not yet used by backward
        self._freed_q.clear()
        self._kept_refs = set()
        self._allowance_given = False
        self._read_bytes = 0
        self._freed_bytes = 0
        self._diag = {"peak_seen": 0, "last": None} if self.diagnose else None
        self._layer_files = {}
        self._group_stack = []
        self._pending = None
        self._outstanding = 0
        self._after_last_layer = False
        self._cum_bytes = 0
        self._marks = []
        self._kept_keys = set()
        self._layer_stored = collections.defaultdict(int)
        self._fell_back_disk = False
        self._cuda_marks = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._param_ptrs = set()
        self._seen_modules = set()
        if self._worker is None:
            self._worker = _Worker("spillfs-offload")
        if self._model is not None:
            self._see_module(self._model)
        self.report = OffloadReport(self._step, self.policy.name)
        self.reports.append(self.report)
        self.policy.begin_step(self, self.report)
        if self._host is not None:
            self._host.peak = self._host.used
        self._install()
        self._wrap_recompute(self.policy.recompute_layers())
        self._t0 = time.perf_counter()
        self._mark("step_start", None)
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._unwrap_recompute()
            self._uninstall()
        finally:
            self._active = False
        if exc_type is not None:
            self._release_all(dead=True)
        else:
            self._mark("step_end", None)
            self._finish_step()
        self._flush_warnings()
        return False

    def _finish_step(self):
        if self._cuda_marks or self._cuda is not None:
            torch.cuda.current_stream().synchronize()
        seconds = time.perf_counter() - self._t0
        # a step whose backward ran inside the block has released everything; wait for the files to close
        self._worker.drain()
        with self._lock:
            self._poll()
            for pool in (self._host, self._staging):
                if pool is not None:
                    pool._reclaim()  # regions whose host-to-device copies have landed (synchronized above)
        r = self.report
        r.measured["step_seconds"] = seconds
        r.measured["memory_saved"] = r.offloaded_bytes
        if self._host is not None:
            r.host_peak_bytes = self._host.peak
        if self._files is not None:
            r.io_backend = self._files.io_backend
        self.policy.end_step(self, r, self._marks, seconds)

    def _backward_starts(self):
        if self._phase == "backward":
            return
        with self._lock:
            self._phase = "backward"
            # reads ahead beyond what backward frees: the layers past the first ahead
            ahead = max(self._layer_stored.values(), default=0)
            # memory-tight: only what backward frees (read_ahead_bytes is granted when the first layer's
            # backward begins, not here: the head's backward, often the peak, runs first)
            self._prefetch_credit = 0 if self._tight_reads else max(0, self.prefetch_layers - 1) * ahead
            if self._pending is not None:  # the last tensor saved before backward: keep it
                e, self._pending = self._pending, None
                e.tier = "keep"
                e.kept_reason = "last"
                self.report.keep("last", e.nbytes)
                self._record_layer_bytes(e)
            self._poll(bound=0 if self._drain else None)
            # offloaded originals backward starts with (copies in flight, files not yet written): forwarded
            self.report.inflight_at_backward_bytes = sum(
                e.nbytes for e in self._step_entries if e.src is not None and e.tier in ("host", "ssd"))
            if self._diag is not None:
                self._sample("backward_start", key="backward_start")

    def _flush_warnings(self):
        with self._lock:
            pending, self._warnings = self._warnings, []
        for message in pending:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
