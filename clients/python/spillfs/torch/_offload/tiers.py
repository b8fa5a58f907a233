"""Where offloaded activations live: a bounded host tier and files under a directory.

:class:`HostTier` hands out regions of large host slabs (pinned on CUDA,
allocated once and reused from step to step: a ``cudaHostAlloc`` per tensor
costs milliseconds), never more than its capacity in all. A region freed while
a host-to-device copy may still read it carries that copy's event; the copy
stream that reuses it waits for the event (the only wait a reuse costs).

:class:`FileTier` keeps one file per layer and step in a directory of its own
under ``dir`` (``spillfs-act-<pid>-<n>``), written and read through
libspillfs_client's segment I/O (:mod:`spillfs._io`: the direct path on a
spillfs mount where the process may open the backing store, ``O_DIRECT``
elsewhere; Python's ``os.pwritev`` where the library is missing). Entries start
at 4 KiB-aligned offsets, so requests in flight at once never share a block.
A file is closed and unlinked as soon as its last entry is released; the
directory goes at :meth:`FileTier.close`, and directories of processes that
died are removed the next time a tier opens under the same ``dir``. The
directory is marked ephemeral (``user.spillfs.ephemeral``): on a spillfs
mount its files stay in the RAM tier unless memory pressure flushes them, and
an unclean stop of the daemon drops them.

Threading: both are used under the offloader's lock (``lock`` below).
"""

import ctypes
import errno as _errno
import itertools
import os
import shutil
import threading

from ... import _io, _native

__all__ = ["HostTier", "FileTier", "LayerFile", "Region", "ALIGN"]

ALIGN = 4096
_MiB = 1 << 20
_dir_counter = itertools.count()


def _align(n, a=ALIGN):
    return (n + a - 1) // a * a


class Region:
    """``nbytes`` bytes at ``offset`` of slab ``slab`` (a uint8 tensor view: ``data``)."""

    __slots__ = ("slab", "offset", "nbytes", "data")

    def __init__(self, slab, offset, nbytes, data):
        self.slab, self.offset, self.nbytes, self.data = slab, offset, nbytes, data


class _Slab:
    __slots__ = ("tensor", "size", "free")

    def __init__(self, tensor):
        self.tensor = tensor
        self.size = tensor.numel()
        self.free = [(0, self.size)]  # (offset, length), sorted, coalesced

    def take(self, n):
        for i, (off, length) in enumerate(self.free):
            if length >= n:
                if length == n:
                    del self.free[i]
                else:
                    self.free[i] = (off + n, length - n)
                return off
        return None

    def give(self, off, n):
        free = self.free
        lo, hi = 0, len(free)
        while lo < hi:
            mid = (lo + hi) // 2
            if free[mid][0] < off:
                lo = mid + 1
            else:
                hi = mid
        free.insert(lo, (off, n))
        # coalesce with the neighbours
        if lo + 1 < len(free) and free[lo][0] + free[lo][1] == free[lo + 1][0]:
            free[lo] = (free[lo][0], free[lo][1] + free[lo + 1][1])
            del free[lo + 1]
        if lo > 0 and free[lo - 1][0] + free[lo - 1][1] == free[lo][0]:
            free[lo - 1] = (free[lo - 1][0], free[lo - 1][1] + free[lo][1])
            del free[lo]


class HostTier:
    r"""A bounded pool of host memory for activations.

    Args:
        capacity (int): bytes the tier may hold at once (slabs included: it
            never allocates more than this).
        pinned (bool): page-locked slabs (for CUDA tensors).
        slab_bytes (int): size of one slab (a region larger than that gets a
            slab of its own size).
    """

    def __init__(self, capacity, pinned=False, slab_bytes=256 * _MiB):
        self.capacity = int(capacity)
        self.pinned = pinned
        self.slab_bytes = int(slab_bytes)
        self.slabs = []
        self.reserved = 0  # bytes of all slabs
        self.used = 0  # bytes of regions handed out (aligned)
        self.peak = 0
        self._pending = []  # (region, event): freed while a copy may still read it

    def _reclaim(self, wait_stream=None):
        keep = []
        for region, event in self._pending:
            if event is None or event.query():
                self._give(region)
            elif wait_stream is not None:
                wait_stream.wait_event(event)  # the copy stream waits for the reuse, not the compute stream
                self._give(region)
            else:
                keep.append((region, event))
        self._pending = keep

    def _give(self, region):
        self.slabs[region.slab].give(region.offset, _align(region.nbytes))
        self.used -= _align(region.nbytes)

    def allocate(self, nbytes, wait_stream=None):
        """A :class:`Region` of `nbytes`, or None where the tier has no room.

        `wait_stream` (a CUDA stream): where a region freed by a copy that may
        still run must be reused, that stream waits for the copy."""
        import torch
        n = _align(max(nbytes, 1))
        if self.used + n > self.capacity:
            self._reclaim()
            if self.used + n > self.capacity:
                self._reclaim(wait_stream)
                if self.used + n > self.capacity:
                    return None
        for attempt in range(2):
            for index, slab in enumerate(self.slabs):
                off = slab.take(n)
                if off is not None:
                    self.used += n
                    self.peak = max(self.peak, self.used)
                    return Region(index, off, nbytes, slab.tensor[off:off + nbytes])
            if attempt == 0 and self._pending:
                self._reclaim(wait_stream)
        # torch's pinned allocator rounds to powers of two: ask for one, and use all of it
        size = max(self.slab_bytes, 1 << (n - 1).bit_length())
        if self.reserved + size > self.capacity:
            size = self.capacity - self.reserved
            if size < n:
                return None
        try:
            tensor = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        except RuntimeError:  # out of pinned (or host) memory: the tier is full
            self.capacity = self.reserved
            return None
        self.slabs.append(_Slab(tensor))
        self.reserved += size
        off = self.slabs[-1].take(n)
        self.used += n
        self.peak = max(self.peak, self.used)
        return Region(len(self.slabs) - 1, off, nbytes, tensor[off:off + nbytes])

    def free(self, region, event=None):
        """Gives `region` back; `event`: a copy reading it that may still run."""
        region.data = None
        if event is None:
            self._give(region)
        else:
            self._pending.append((region, event))

    def in_use(self):
        """Bytes of regions not yet given back (pending frees included)."""
        return self.used

    def close(self):
        """Drops the slabs (after every region was freed)."""
        self._reclaim()
        self.slabs = []
        self.reserved = 0


class _RWNativeFile(_io.NativeFile):
    """A segment file opened for reading and writing (created, truncated)."""

    def __init__(self, lib, path, size_hint=0):
        self.lib = lib
        self.path = os.fspath(path)
        flags = (_native.SPILL_FILE_READ | _native.SPILL_FILE_WRITE | _native.SPILL_FILE_CREATE
                 | _native.SPILL_FILE_TRUNCATE)
        handle = lib.spill_file_open(os.fsencode(self.path), flags, int(size_hint))
        if not handle:
            code = ctypes.get_errno() or _errno.EIO
            raise _native.SpillError(code, f"open: {_native.last_error() or os.strerror(code)}", self.path)
        self.handle = handle
        self.size = 0
        self._dedup_supported = False
        code = lib.spill_file_backend(handle)
        self.backend = _native.BACKEND_NAMES.get(code, "native")
        self.stats = {}


class LayerFile:
    """The file of one layer in one step: entries appended at aligned offsets."""

    def __init__(self, tier, path, size_hint):
        self.tier = tier
        self.path = path
        lib = None if tier.backend == "posix" else _native.segment_io()
        if lib is not None:
            self.io = _RWNativeFile(lib, path, size_hint)
        else:
            self.io = _io.PosixFile(path, write=True)
        self.native = self.io.native
        self.backend = self.io.backend
        self.end = 0
        self.live = 0  # entries not yet released
        self.inflight = 0  # requests not yet waited for
        self.closed = False

    def reserve(self, nbytes):
        off = self.end
        self.end = _align(off + nbytes)
        self.live += 1
        return off

    def write(self, ptr, nbytes, offset, device, stream=0):
        return self._submit(self.io.write, ptr, nbytes, offset, device, stream)

    def read(self, ptr, nbytes, offset, device, stream=0):
        return self._submit(self.io.read, ptr, nbytes, offset, device, stream)

    def _submit(self, submit, ptr, nbytes, offset, device, stream):
        """One request by ``submit`` (the file's write or read), in flight
        until :meth:`done` (or its submission failed)."""
        self.inflight += 1
        try:
            return submit([_io.Segment(ptr, nbytes, offset, device)], stream)
        except BaseException:
            self.inflight -= 1
            raise

    def done(self):
        """A request of this file was waited for."""
        self.inflight -= 1

    def close(self):
        """Closes and unlinks the file (no request may be in flight)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.io.close()
        finally:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.tier.files.discard(self)


EPHEMERAL_XATTR = "user.spillfs.ephemeral"


def _mark_ephemeral(path):
    """Marks the directory `path` ephemeral (spillfs's ``user.spillfs.ephemeral``, which files
    created below inherit: close and age leave them in the mount's RAM tier, their batches skip
    the data sync, and an unclean stop drops them; docs/design.md, "Ephemeral files"). Whether
    the filesystem took the attribute (False where it has no user attributes); elsewhere than on
    a spillfs mount it is an attribute nothing reads, on a directory the tier removes."""
    try:
        os.setxattr(path, EPHEMERAL_XATTR, b"1")
        return True
    except (OSError, AttributeError):  # ENOTSUP, EPERM...; no os.setxattr off Linux
        return False


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FileTier:
    r"""Files for activations under `dir`, in a directory of this process.

    Args:
        dir (str or os.PathLike): an existing directory, or one to create.
        backend (str): ``"auto"`` (libspillfs_client where present, else
            Python's I/O) or ``"posix"``.

    Attributes:
        path (str): this tier's directory (``spillfs-act-<pid>-<n>`` under `dir`).
        ephemeral (bool): whether the filesystem took the ephemeral mark.
    """

    PREFIX = "spillfs-act-"

    def __init__(self, dir, backend="auto"):
        self.root = os.path.abspath(os.fspath(dir))
        os.makedirs(self.root, exist_ok=True)
        self.backend = backend
        self._reclaim_stale()
        self.path = os.path.join(self.root, f"{self.PREFIX}{os.getpid()}-{next(_dir_counter)}")
        os.makedirs(self.path, exist_ok=True)
        self.ephemeral = _mark_ephemeral(self.path)
        self.files = set()
        self.io_backend = None  # "direct_path", "mount", "direct_io", "buffered", "posix" once a file opened
        self.lock = threading.Lock()

    def _reclaim_stale(self):
        """Removes the directories of processes that no longer run."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            if not name.startswith(self.PREFIX):
                continue
            try:
                pid = int(name[len(self.PREFIX):].split("-", 1)[0])
            except ValueError:
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def open(self, name, size_hint=0):
        """A new :class:`LayerFile` named `name` in this tier's directory."""
        f = LayerFile(self, os.path.join(self.path, name), size_hint)
        self.io_backend = f.backend
        self.files.add(f)
        return f

    def leftover(self):
        """Names of the files still in the directory."""
        try:
            return sorted(os.listdir(self.path))
        except FileNotFoundError:
            return []

    def close(self):
        """Closes every file and removes the directory."""
        for f in list(self.files):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.path, ignore_errors=True)
