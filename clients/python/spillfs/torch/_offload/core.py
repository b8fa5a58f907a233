"""The activation offloader: one step's life, and the parts it is made of.

One :class:`ActivationOffloader` serves many steps; each ``with`` block is a
step. ``__enter__`` begins the step (a new report, the parts' state of a step
reset), begins the policy's step (its decisions, the layers it recomputes) and
installs the hooks; ``__exit__`` removes them and, once the worker has
drained, fills in the step's :class:`~.report.OffloadReport`. The step's phase
turns from forward to backward once (:meth:`_backward_starts`: at the first
gradient hook or unpack), back to forward only where a new forward starts
after a finished backward in the same block (gradient accumulation).

The offloader is made of parts, an object a concern, each passed what it
needs when it is made (the settings, the state of the step they share, the
lock, the parts it calls):

- :class:`~.entries._StepState`: what they share: the step (index, report,
  phase), its entries, the pending one, the saves not yet unpacked, the
  worker, the CUDA streams;
- :class:`~.copy_out._CopyOut`: forward's side: the tiers (host, staging,
  files), storing an entry in one, the copies in flight and their bound
  (``copy_window``, ``inflight_bytes``);
- :class:`~.read_ahead._ReadAhead`: backward's side: prefetch and the credit
  that bounds it (``prefetch_layers``, ``read_ahead_bytes``; loads);
- :class:`~.entries._EntryRelease`: the release of entries;
- :class:`~.diagnosis._Diagnosis`: ``diagnose``'s samples;
- :class:`~.layers._LayerHooks`: the module hooks (groups, layer boundaries,
  where backward begins, timing, recompute);
- :class:`~.saved_hooks._SavedTensorHooks`: pack and unpack (what is stored,
  dedup, forwarding, stalls).

They are made in that order, each from those before it; none holds the
offloader. The settings (:class:`_Options`) are the offloader's public
attributes, read by the parts as they act, so a setting changed between steps
(``staging_bytes``, ``diagnose``...) holds from the next store or step.

CUDA: device-to-host copies run on a copy stream of their own that waits for
the compute stream; host-to-device copies on another (allocations for them
are made on it, and the tensor handed to autograd is recorded on the compute
stream). The compute stream waits only for a tensor it is about to use. Files
get device memory straight through libspillfs_client's pinned pool.

Threading: a worker thread waits for file writes to complete (then drops the
original tensor, or keeps it where the write failed) and releases what
autograd dropped; all shared state is under the offloader's ``_lock``.
"""

import os
import threading
import time
import warnings

import torch

from . import policy as _policy
from .copy_out import _CopyOut
from .diagnosis import _Diagnosis
from .entries import _EntryRelease, _StepState, _Worker
from .layers import _LayerHooks, find_layers
from .read_ahead import _ReadAhead
from .report import OffloadReport
from .saved_hooks import _SavedTensorHooks

__all__ = ["ActivationOffloader", "find_layers"]

_MiB = 1 << 20


class _Options:
    """The offloader's settings (see :class:`ActivationOffloader` and
    :func:`spillfs.torch.offload_activations`), one object the parts read.
    Each of ``SETTINGS`` is also an attribute of the offloader, read and
    written here, so the parts see a change made through the offloader."""

    SETTINGS = ("dir", "host_bytes", "min_bytes", "prefetch_layers", "policy", "group_bytes", "io_backend",
                "keep_last", "inflight_bytes", "read_ahead_bytes", "diagnose", "staging_bytes", "copy_window")

    def __init__(self, dir, host_bytes, min_bytes, prefetch_layers, policy, group_bytes, io_backend, keep_last,
                 inflight_bytes, read_ahead_bytes):
        self.dir = dir
        self.host_bytes = host_bytes
        self.min_bytes = min_bytes
        self.prefetch_layers = prefetch_layers
        self.policy = policy
        self.group_bytes = group_bytes
        self.io_backend = io_backend
        self.keep_last = keep_last
        # memory-tight forward: originals held while their copies run, at most this many bytes; forward's
        # end and backward's start wait for every copy (the head and backward start without them)
        self.inflight_bytes = inflight_bytes
        # memory-tight backward: reads only replace what backward freed, plus this many bytes
        self.read_ahead_bytes = read_ahead_bytes
        self.diagnose = False
        # pinned bytes staging file writes (the original goes once copied out; 0: written from where it is)
        self.staging_bytes = 512 * _MiB
        # originals of groups more than this many before the current one go even where their copy still runs
        # (the compute stream waits for the copy): what bounds the device memory of copies in flight
        self.copy_window = 1
        self.disk_busy = _policy.IoClock()  # this step's file requests (files_keep_up)

    def observe_io(self, kind, nbytes, submitted, seconds):
        """A file request completed: to the policy (its bandwidths) and to the step's disk clock."""
        self.disk_busy.observe(kind, nbytes, submitted, seconds)
        self.policy.observe_io(kind, nbytes, submitted, seconds)

    @property
    def drain(self):
        return self.inflight_bytes is not None

    @property
    def tight_reads(self):
        return self.read_ahead_bytes is not None

    @property
    def track_frees(self):
        return self.read_ahead_bytes is not None or self.diagnose


class ActivationOffloader:
    r"""Offloads the tensors autograd saves in its ``with`` blocks (one block = one step).

    Made by :func:`spillfs.torch.offload_activations`, which documents the
    arguments.

    Attributes:
        reports (list): one :class:`OffloadReport` per step; ``report``: the latest.
        dir, host_bytes, min_bytes, prefetch_layers, group_bytes, io_backend,
            keep_last: the arguments, as given (settings, like those below).
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
        if min_bytes < 0:
            raise ValueError(f"min_bytes must be >= 0, not {min_bytes!r}")
        if prefetch_layers < 0:
            raise ValueError(f"prefetch_layers must be >= 0, not {prefetch_layers!r}")
        self._options = options = _Options(
            None if dir is None else os.fspath(dir), int(host_bytes), int(min_bytes), int(prefetch_layers),
            _policy.make_policy(policy), int(group_bytes), io_backend, keep_last,
            None if inflight_bytes is None else int(inflight_bytes),
            None if read_ahead_bytes is None else int(read_ahead_bytes))
        self._lock = lock = threading.RLock()
        self._state = state = _StepState()
        self._copies = copies = _CopyOut(options, state, lock)
        self._reads = reads = _ReadAhead(options, state)
        self._release = release = _EntryRelease(options, state, lock, copies, reads)
        self._diagnosis = diagnosis = _Diagnosis(state, lock, copies, reads)
        self._layer_hooks = layer_hooks = _LayerHooks(layers, options, state, lock, copies, reads, diagnosis,
                                                      self._backward_starts)
        self._saved_hooks = _SavedTensorHooks(options, state, lock, layer_hooks, copies, reads, release, diagnosis,
                                              self._backward_starts)
        self.reports = []
        self._t0 = 0.0
        self._step_peak = None  # (allocator, bytes allocated as the step began) where it is measured
        self._warned_files = False

    def __getattr__(self, name):  # what normal lookup did not find: a setting
        if name in _Options.SETTINGS and "_options" in self.__dict__:
            return getattr(self._options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in _Options.SETTINGS:
            setattr(self._options, name, value)
        else:
            super().__setattr__(name, value)

    # -- public ---------------------------------------------------------------

    @property
    def layers(self):
        """The modules whose hooks tag, time and prefetch (a list)."""
        return list(self._layer_hooks.layers)

    @property
    def report(self):
        """The :class:`OffloadReport` of the latest step (None before the first)."""
        return self._state.report

    def in_use(self):
        """What this offloader still holds: ``{"host_bytes", "files", "entries"}``."""
        with self._lock:
            files = self._copies.files
            return {"host_bytes": self._copies.host_bytes_in_use(),
                    "files": files.leftover() if files is not None else [],
                    "entries": sum(1 for e in self._state.step_entries if not e.released)}

    def close(self):
        """Frees everything: host slabs, files, the directory, the worker thread."""
        if self._state.active:
            raise RuntimeError("close() inside the offloader's with block")
        self._release.release_all()
        with self._lock:
            self._copies.close()
        state = self._state
        if state.worker is not None:
            state.worker.stop()
            state.worker = None

    def __del__(self):
        try:
            if self._copies.files is not None:
                self._copies.files.close()
            if self._state.worker is not None:
                self._state.worker.stop()
        except Exception:
            pass

    # -- what the policy asks (its bandwidth probe) --------------------------------

    def _start_step_peak(self, wanted):
        """Where the policy asks and there are allocator figures (CUDA, or a test's probe), the step's
        peak above its start is measured (CUDA's peak statistics reset now)."""
        allocator = self._layer_hooks.memory_probe or (torch.cuda if wanted and self._on_cuda() else None)
        self._step_peak = None
        if wanted and allocator is not None:
            self._step_peak = (allocator, allocator.memory_allocated())
            allocator.reset_peak_memory_stats()

    def _on_cuda(self):
        """Whether the step's tensors are on CUDA: one was saved, or the layers' parameters are."""
        hooks = self._layer_hooks
        modules = [hooks.model] if hooks.model is not None else hooks.layers
        return self._state.cuda is not None or any(p.is_cuda for m in modules for p in m.parameters())

    def _file_tier(self):
        """The files under ``dir`` the offloader writes (made at the first use)."""
        return self._copies.file_tier()

    # -- the step -------------------------------------------------------------

    def __enter__(self):
        state = self._state
        if state.active:
            raise RuntimeError("spillfs.torch.offload_activations: the offloader's with block is not reentrant")
        self._release.release_all()  # what autograd still held from the previous step
        report = OffloadReport(state.index + 1, self.policy.name)
        state.begin(report)
        self._reads.begin_step()
        self._diagnosis.begin_step(self.diagnose)
        self._copies.begin_step()
        self._options.disk_busy = _policy.IoClock()
        self._saved_hooks.begin_step()
        self._layer_hooks.begin_step()
        if state.worker is None:
            state.worker = _Worker("spillfs-offload")
        self.reports.append(report)
        policy = self.policy
        policy.begin_step(self, report)
        hooked = policy.hooked_layers() if self._layer_hooks.layers else None
        if hooked is not None and (self._options.drain or self._options.tight_reads):
            hooked = None  # the memory-tight options count every kept activation: every layer hooked
        report.saved_hooks = policy.saves_tensors() and (hooked is None or len(hooked) > 0)
        self._layer_hooks.record_inputs = policy.wants_timing()
        self._layer_hooks.install(self._saved_hooks.pack, self._saved_hooks.unpack, saved=report.saved_hooks,
                                  hooked=hooked, timed=policy.wants_timing(), memory=policy.wants_memory())
        self._layer_hooks.wrap_recompute(policy.recompute_layers(), policy.selective_layers())
        self._start_step_peak(policy.wants_step_peak())
        self._t0 = time.perf_counter()
        self._layer_hooks.mark("step_start", None)
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._layer_hooks.unwrap_recompute()
            self._layer_hooks.uninstall()
        finally:
            self._state.active = False
        if exc_type is not None:
            self._release.release_all(dead=True)
        else:
            self._layer_hooks.mark("step_end", None)
            self._finish_step()
        self._flush_warnings()
        return False

    def _finish_step(self):
        state = self._state
        if self._layer_hooks.cuda_marks or state.cuda is not None:
            torch.cuda.current_stream().synchronize()
        seconds = time.perf_counter() - self._t0
        # a step whose backward ran inside the block has released everything; wait for the files to close
        state.worker.drain()
        with self._lock:
            self._copies.poll()
            self._copies.reclaim()  # regions whose host-to-device copies have landed (synchronized above)
        r = state.report
        r.measured["step_seconds"] = seconds
        r.measured["memory_saved"] = r.offloaded_bytes
        r.layer_input_bytes = dict(self._layer_hooks.input_bytes)
        r.memory_phases = list(self._layer_hooks.memory_marks)
        if self._step_peak is not None:
            allocator, base = self._step_peak
            r.measured["peak_bytes"] = allocator.max_memory_allocated() - base
        if self._copies.host is not None:
            r.host_peak_bytes = self._copies.host.peak
        if self._copies.files is not None:
            r.io_backend = self._copies.files.io_backend
        self.policy.end_step(self, r, self._layer_hooks.marks, seconds)
        self._check_files_keep_up(r, seconds)

    def _check_files_keep_up(self, r, seconds):
        """Says (``report.files_keep_up``, and a warning once) where the files could not keep up with
        the step: the disk busy for over half of it, or backward waiting for reads for over a tenth.
        Files only hide behind compute where a layer's compute outlasts its write and read; where
        they do not (the H100's Llama at hidden 2048, files only: 37x the keep step), the step runs
        at the disk's speed. :class:`~.policy.MixedPolicy` puts on files only what its model hides."""
        if r.ssd_bytes == 0:
            return
        busy = self._options.disk_busy.busy_seconds()
        r.measured["disk_busy_seconds"] = busy
        r.files_keep_up = not (busy > 0.5 * seconds or r.stall_seconds > 0.1 * seconds)
        if not r.files_keep_up and not self._warned_files:
            self._warned_files = True
            warnings.warn(
                f"spillfs.torch.offload_activations: the files under {self.dir!r} could not keep up with the step "
                f"(disk busy {busy * 1e3:.0f} ms, backward waited {r.stall_seconds * 1e3:.0f} ms, step "
                f"{seconds * 1e3:.0f} ms): give the host tier room (host_bytes), or use "
                f"spillfs.torch.MixedPolicy, which puts on files only what their copies hide behind",
                RuntimeWarning, stacklevel=4)

    def _backward_starts(self):
        state = self._state
        if state.phase == "backward":
            return
        with self._lock:
            state.phase = "backward"
            # reads ahead beyond what backward frees: the layers past the first ahead
            self._reads.backward_starts(max(state.layer_stored.values(), default=0))
            if state.pending is not None:  # the last tensor saved before backward: keep it
                e, state.pending = state.pending, None
                e.tier = "keep"
                e.kept_reason = "last"
                state.report.keep("last", e.nbytes)
                self._copies.record_layer_bytes(e)
            self._copies.poll(bound=0 if self._options.drain else None)
            # offloaded originals backward starts with (copies in flight, files not yet written): forwarded
            state.report.inflight_at_backward_bytes = sum(
                e.nbytes for e in state.step_entries if e.src is not None and e.tier in ("host", "ssd"))
            if self._diagnosis.on:
                self._diagnosis.sample("backward_start", key="backward_start")

    def _flush_warnings(self):
        with self._lock:
            pending, self._state.warnings = self._state.warnings, []
        for message in pending:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
