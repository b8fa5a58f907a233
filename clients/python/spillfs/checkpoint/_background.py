"""``spillfs.save(obj, path, background=True)``: checkpoints that do not stop training.

Split as CheckFreq (Mohan et al., FAST'21) splits a checkpoint:

1. *snapshot*, in the caller's thread, before ``save`` returns: ``obj`` is
   pickled (``data.pkl`` is final then) and every storage it refers to is
   copied into one host buffer (pinned where CUDA is available). CUDA
   storages are copied device -> pinned host on a side stream of their
   device, ordered after the caller's current stream (``wait_stream``), and
   ``save`` waits for those copies before it returns. That is the rule that
   makes the file hold the values at the call whatever the caller does next
   (an optimizer step updates parameters in place on the current stream, or
   on another one): the cost is the device-to-host copy, tens of
   milliseconds a GB at PCIe speed, not the disk write;
2. *persist*, on one writer thread: the archive written from the snapshot
   as :func:`spillfs.save` writes it (temporary name, fsync, rename; hashing
   and dedup on a spillfs mount), then the snapshot is freed.

One writer thread, so background saves are persisted in call order (two
saves to the same path end with the later one's file). The snapshots of the
saves not yet persisted are bounded by ``max_host_bytes``: a save whose
snapshot would pass the bound waits, before taking it, for earlier saves to
finish (a snapshot bigger than the bound alone waits for all of them).
:func:`wait` waits for every pending save; at interpreter exit pending
saves are finished first (the writer is a ``concurrent.futures`` worker,
which Python joins at exit). A forked child starts with a writer of its own
and nothing pending (``os.register_at_fork``); like any torch code after a
fork, it should run with ``torch.set_num_threads(1)``.
"""

import concurrent.futures
import os
import threading
import traceback

from .._report import _publish
from . import _writer

__all__ = ["wait", "default_max_host_bytes"]

_ALIGN = 4096  # big storages' copies start on a page: what O_DIRECT wants of host memory

_cond = threading.Condition()
_pending_bytes = 0  # the snapshots of saves not yet persisted
_pending = []  # their futures, in call order
_executor = None
_side_streams = {}  # device index -> the side stream of snapshot copies
# The buffer of the latest persisted snapshot, kept for the next one: in a
# training loop the next snapshot has the same size, and a buffer's first
# touch (page faults: about 3x the copy here) or its pinning (cudaHostAlloc)
# is most of what a fresh one costs. Host memory beyond max_host_bytes: one
# snapshot at most.
_spare = None


def _after_fork_in_child():
    """A forked child (a DataLoader worker, a multiprocessing pool) inherits
    this module's state but not the writer thread, and maybe a lock some
    other thread held: it starts with no writer and nothing pending (the
    parent's pending saves are the parent's to finish)."""
    global _cond, _pending_bytes, _pending, _executor, _side_streams, _spare
    _cond = threading.Condition()
    _pending_bytes, _pending, _executor = 0, [], None
    _side_streams, _spare = {}, None  # CUDA state does not survive a fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def _torch():
    import torch
    return torch


def default_max_host_bytes():
    """The bound of snapshots in host memory when ``max_host_bytes`` is None: a
    quarter of this machine's physical memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError):
        return 8 << 30


def _writer_pool():
    global _executor
    with _cond:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spillfs-save")
        return _executor


def _layout(storages):
    """{key: (offset, nbytes)} in one buffer, big copies page-aligned,
    small ones at 64 bytes; and the buffer's size."""
    layout, at = {}, 0
    for key in sorted(storages):
        n = storages[key].nbytes()
        align = _ALIGN if n >= _ALIGN else 64
        at = (at + align - 1) // align * align
        layout[key] = (at, n)
        at += n
    return layout, at


def _byte_tensor(storage):
    torch = _torch()
    t = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return t.set_(storage, 0, (storage.nbytes(),), (1,))


def _snapshot(storages, layout, total):
    """Copies `storages` into a new host buffer at `layout`; returns its
    untyped storage and where in it the layout starts. CUDA copies done."""
    global _spare
    torch = _torch()
    pin = torch.cuda.is_available()
    with _cond:
        buf, _spare = _spare, None
    if buf is None or buf.numel() < total + _ALIGN or buf.numel() > 2 * (total + _ALIGN) or buf.is_pinned() != pin:
        buf = None  # (freed before the new one is made)
        buf = torch.empty(total + _ALIGN, dtype=torch.uint8, pin_memory=pin)
    base = -buf.data_ptr() % _ALIGN
    by_device = {}
    for key, (offset, n) in layout.items():
        storage = storages[key]
        if storage.device.type not in ("cpu", "cuda"):
            storage = storage.cpu()  # as torch.save does (and _writer.Source): meta raises here
        if n == 0:
            continue
        dst = buf[base + offset:base + offset + n]
        if storage.device.type == "cuda":
            by_device.setdefault(storage.device.index, []).append((dst, storage))
        else:
            dst.copy_(_byte_tensor(storage))
    events = []
    for device, copies in by_device.items():
        side = _side_streams.get(device)
        if side is None:
            side = _side_streams[device] = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))  # after what the caller queued
        with torch.cuda.stream(side):
            for dst, storage in copies:
                dst.copy_(_byte_tensor(storage), non_blocking=True)
            events.append(torch.cuda.Event())
            events[-1].record(side)
    for event in events:
        event.synchronize()  # before save returns: the caller may change the tensors now
    return buf, base


def _release(nbytes):
    global _pending_bytes
    with _cond:
        _pending_bytes -= nbytes
        _cond.notify_all()


def _failed(error):
    future = concurrent.futures.Future()
    future.set_exception(error)
    return future


def submit(obj, f, pickle_module, pickle_protocol, byteorder, opts, backend, report, max_host_bytes):
    """The background half of :func:`spillfs.save`: the snapshot taken here,
    the write queued; a Future of the report. Errors of the save (what
    a synchronous save raises) are the Future's."""
    global _pending_bytes
    from . import _serialization as ser
    path = os.fspath(f)  # report.op and .path: set by save
    target = os.path.abspath(path)  # resolved now: the caller may chdir before the write
    limit = default_max_host_bytes() if max_host_bytes is None else int(max_host_bytes)
    try:
        with report.stage("pickle"):
            pkl, storages = ser._pickle(obj, pickle_module, pickle_protocol)
        layout, total = _layout(storages)
    except Exception as e:  # noqa: B902 - the save's error, as .result() raises it
        return _failed(e)
    with report.stage("host_wait"), _cond:
        while _pending_bytes and _pending_bytes + total > limit:
            _cond.wait()
        _pending_bytes += total
    try:
        with report.stage("snapshot"):
            buf, base = _snapshot(storages, layout, total)
    except Exception as e:  # noqa: B902
        _release(total)
        return _failed(e)
    del storages  # the caller's tensors are not touched again
    sources = {key: (base + offset, n) for key, (offset, n) in layout.items()}
    try:
        future = _writer_pool().submit(_persist, path, target, pkl, buf, sources, byteorder, opts, backend,
                                       report, total)
    except BaseException:
        _release(total)
        raise
    with _cond:
        _pending.append(future)
    future.add_done_callback(_forget)
    return future


def _forget(future):
    with _cond:
        try:
            _pending.remove(future)
        except ValueError:
            pass


def _persist(path, target, pkl, buf, layout, byteorder, opts, backend, report, total):
    global _spare
    from . import _serialization as ser
    flat = buf.untyped_storage()
    try:
        with report.stage("total"):
            sources = {key: _writer.Source(flat, None, begin, n) for key, (begin, n) in layout.items()}
            try:
                ser._write_archive(target, target, pkl, sources, byteorder, opts, backend, report)
            except BaseException as e:
                # The future keeps the error: its frames' locals (records holding the
                # snapshot) would keep the snapshot's memory after the bound is given back.
                traceback.clear_frames(e.__traceback__)
                if isinstance(e, OSError) and e.filename == target:
                    raise ser._named(e, path) from None
                raise
            finally:
                sources = flat = None  # no I/O reads the buffer any more: kept for the next snapshot
                with _cond:
                    _spare, buf = buf, None
        report.path = path
        _publish(report)
        return report
    finally:
        _release(total)


def wait(timeout=None):
    r"""wait(timeout=None)

    Waits for every :func:`spillfs.save` with ``background=True`` started
    before the call to be persisted (e.g. before the process exits, or before
    reading a checkpoint back).

    Args:
        timeout (float, optional): seconds to wait at most.

    Raises:
        TimeoutError: the saves were not done within `timeout`.
        Exception: the first error of those saves, as their ``.result()``
            raises it (the others were still waited for).

    Example:
        >>> fut = spillfs.save(model.state_dict(), "/mnt/spill/step1000.pt", background=True)
        >>> spillfs.checkpoint.wait()
    """
    with _cond:
        futures = list(_pending)
    done, not_done = concurrent.futures.wait(futures, timeout)
    if not_done:
        raise TimeoutError(f"{len(not_done)} background save(s) still pending after {timeout} s")
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
