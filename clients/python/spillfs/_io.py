"""Moving bytes between memory and one file: the one interface save and load use.

:func:`open_file` gives a :class:`NativeFile` (libspillfs_client's segment
I/O: io_uring ``O_DIRECT``, the direct path on a spillfs mount, CUDA memory
through its pinned pool, dedup) where the library is present with those
symbols, else a :class:`PosixFile` (``os.pwritev`` / ``os.preadv`` on a few
threads, host memory only), which is correct everywhere.

Both take lists of :class:`Segment` (``ptr``, ``length``, ``offset``,
``device``: -1 for host memory, else a CUDA ordinal) and return a
:class:`Request` whose ``wait()`` raises ``OSError`` (with the errno, e.g.
``ENOSPC``, and the file name) or returns a dict of what was done.
"""

import concurrent.futures
import ctypes
import errno as _errno
import os
import threading
import warnings
from collections import namedtuple

from . import _native

__all__ = ["Segment", "open_file", "NativeFile", "PosixFile", "hash_units"]

Segment = namedtuple("Segment", "ptr length offset device")

_IO_CHUNK = 8 << 20
_INLINE_BYTES = 256 << 10
_pool_lock = threading.Lock()
_pools = {}


def _pool(name):
    with _pool_lock:
        pool = _pools.get(name)
        if pool is None:
            pool = _pools[name] = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="spillfs-" + name)
        return pool


def io_pool():
    """Threads of the Python I/O (os.pwritev / os.preadv drop the GIL)."""
    return _pool("io")


def crc_pool():
    """Threads computing CRC-32s (zlib drops the GIL), apart from the I/O's."""
    return _pool("crc")


_warned = set()


def _warn_once(key, message):
    """A RuntimeWarning the first time `key` comes up in this process (no silent fallback)."""
    with _pool_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _after_fork():
    global _pool_lock
    _pools.clear()
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def host_view(ptr, length):
    """A writable memoryview of `length` bytes of host memory at `ptr`."""
    if length == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * length).from_address(ptr)).cast("B")


class Request:
    """An I/O under way; ``wait()`` returns its stats or raises."""

    def __init__(self, waiter, keepalive=None):
        self._waiter = waiter
        self._keepalive = keepalive
        self._result = None
        self._done = False

    def wait(self):
        if not self._done:
            try:
                self._result = self._waiter()
            finally:
                self._done = True
                self._keepalive = None
        return self._result


class PosixFile:
    """A file moved with os.pwritev / os.preadv; host segments only."""

    native = False
    supports_device = False
    backend = "posix"

    def __init__(self, path, write, size_hint=0):
        self.stats = {}
        self.path = os.fspath(path)
        flags = (os.O_RDWR | os.O_CREAT | os.O_TRUNC) if write else os.O_RDONLY
        self.fd = os.open(self.path, flags | os.O_CLOEXEC, 0o666)
        self.size = 0 if write else os.fstat(self.fd).st_size

    def _run(self, fn, segments):
        pieces = []
        for s in segments:
            if s.device >= 0:
                raise ValueError("PosixFile moves host memory only")
            for start in range(0, s.length, _IO_CHUNK):
                n = min(_IO_CHUNK, s.length - start)
                pieces.append((s.ptr + start, n, s.offset + start))
        total = sum(p[1] for p in pieces)
        if total <= _INLINE_BYTES:  # not worth a thread
            for p in pieces:
                fn(*p)
            return Request(lambda: {"bytes": total})
        futures = [io_pool().submit(fn, *p) for p in pieces]

        def wait():
            error = None
            for f in futures:
                try:
                    f.result()
                except OSError as e:
                    error = error or e
            if error is not None:
                raise error
            return {"bytes": sum(p[1] for p in pieces)}
        return Request(wait)

    def _write_one(self, ptr, length, offset):
        view = host_view(ptr, length)
        done = 0
        while done < length:
            try:
                done += os.pwritev(self.fd, [view[done:]], offset + done)
            except OSError as e:
                raise OSError(e.errno, e.strerror, self.path) from None

    def _read_one(self, ptr, length, offset):
        view = host_view(ptr, length)
        done = 0
        while done < length:
            try:
                got = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as e:
                raise OSError(e.errno, e.strerror, self.path) from None
            if got == 0:
                raise EOFError(f"{self.path}: the file ends at {offset + done}, "
                               f"{length - done} bytes short of a record")
            done += got

    def write(self, segments, stream=0):
        return self._run(self._write_one, segments)

    def read(self, segments, stream=0):
        return self._run(self._read_one, segments)

    def pread(self, offset, length):
        return os.pread(self.fd, length, offset)

    def dedup(self, offset, hashes):
        return None

    def truncate(self, size):
        os.ftruncate(self.fd, size)

    def sync(self):
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, self.path) from None

    def close(self):
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class NativeFile:
    """A file moved by libspillfs_client's segment I/O (host and CUDA memory)."""

    native = True
    supports_device = True

    def __init__(self, lib, path, write, size_hint=0):
        self.lib = lib
        self.path = os.fspath(path)
        flags = ((_native.SPILL_FILE_WRITE | _native.SPILL_FILE_CREATE | _native.SPILL_FILE_TRUNCATE) if write
                 else _native.SPILL_FILE_READ)
        handle = lib.spill_file_open(os.fsencode(self.path), flags, int(size_hint))
        if not handle:
            code = ctypes.get_errno() or _errno.EIO
            raise _native.SpillError(code, f"open: {_native.last_error() or os.strerror(code)}", self.path)
        self.handle = handle
        self.size = 0 if write else os.stat(self.path).st_size
        self._dedup_supported = True
        backend = getattr(lib, "spill_file_backend", None)
        code = backend(handle) if backend is not None else -1
        self.backend = _native.BACKEND_NAMES.get(code, "native")
        if self.backend == "mount" and os.geteuid() != 0:
            _warn_once("not-root", f"spillfs: {self.path}: not root, so no direct path (it opens the volume's "
                                   "backing store, which is root's), and the daemon offers no memory I/O (a "
                                   "spillfs older than this library?): I/O goes through the mount, slower")
        self.stats = {}  # spill_io_stats of the requests waited for, summed
        self.dedup_requests = 0  # dedup calls answered (each one round trip, up to 65536 units)

    def _submit(self, fn, segments, stream, what):
        n = len(segments)
        array = (_native.SpillSegment * max(n, 1))()
        total = 0
        for i, s in enumerate(segments):
            array[i].ptr, array[i].length, array[i].file_offset, array[i].device = s.ptr, s.length, s.offset, s.device
            total += s.length
        request = ctypes.c_void_p()
        _native.check(fn(self.handle, array, n, int(stream or 0), ctypes.byref(request)), what, self.path)

        def wait():
            stats = _native.SpillIoStats()
            _native.check(self.lib.spill_request_wait(request, ctypes.byref(stats)), what, self.path)
            result = {name: getattr(stats, name) for name, _ in _native.SpillIoStats._fields_}
            for name, value in result.items():
                self.stats[name] = self.stats.get(name, 0) + value
            return result
        return Request(wait, keepalive=array)

    def write(self, segments, stream=0):
        return self._submit(self.lib.spill_file_write_segments, segments, stream, "write")

    def read(self, segments, stream=0):
        return self._submit(self.lib.spill_file_read_segments, segments, stream, "read")

    def pread(self, offset, length):
        """Up to `length` bytes at `offset` (short at the end of the file, as os.pread)."""
        length = max(0, min(length, self.size - offset))
        if length == 0:
            return b""
        buf = ctypes.create_string_buffer(length)
        self.read([Segment(ctypes.addressof(buf), length, offset, -1)]).wait()
        return buf.raw

    def dedup(self, offset, hashes):
        """Which of the 256 KiB units at `offset` (with XXH3-128 `hashes`, an
        array of 2 uint64 per unit) the caller must still write: a bytearray
        of 0/1, or None where the file is not on a spillfs mount."""
        if not self._dedup_supported:
            return None
        n = len(hashes) // 2
        needed = (ctypes.c_uint8 * max(n, 1))()
        rc = self.lib.spill_file_dedup(self.handle, offset, _u64_array(hashes), n, needed)
        return self._needed(rc, needed, n)

    @property
    def dedup_units_supported(self):
        """Whether :meth:`dedup_units` is one request (the library has it)."""
        return hasattr(self.lib, "spill_file_dedup_units")

    def dedup_units(self, offsets, hashes):
        """As :meth:`dedup`, for units anywhere in the file: unit i at
        ``offsets[i]`` (multiples of 256 KiB, strictly increasing; an array of
        uint64) with hash ``hashes[2i], hashes[2i + 1]``; one request to the
        daemon for all. A library without spill_file_dedup_units: a request
        per run of consecutive units."""
        if not self._dedup_supported:
            return None
        n = len(offsets)
        if 2 * n != len(hashes):
            raise ValueError(f"{n} unit offsets but {len(hashes)} hash numbers (2 a unit)")
        if not self.dedup_units_supported:
            return self._dedup_by_runs(offsets, hashes)
        needed = (ctypes.c_uint8 * max(n, 1))()
        rc = self.lib.spill_file_dedup_units(self.handle, _u64_array(offsets), _u64_array(hashes), n, needed)
        return self._needed(rc, needed, n)

    def _dedup_by_runs(self, offsets, hashes):
        import array
        out = bytearray()
        i = 0
        while i < len(offsets):
            j = i + 1
            while j < len(offsets) and offsets[j] == offsets[j - 1] + _native.HASH_UNIT_BYTES:
                j += 1
            needed = self.dedup(offsets[i], array.array("Q", hashes[2 * i:2 * j]))
            if needed is None:
                return None
            out += needed
            i = j
        return out

    def _needed(self, rc, needed, n):
        if rc in (-_errno.EOPNOTSUPP, -_errno.ENOTSUP, -_errno.ENOSYS, -_errno.EACCES, -_errno.EPERM):
            # not a spillfs mount, a volume without dedup, or its control file is root's: nothing mapped
            self._dedup_supported = False
            if rc in (-_errno.EACCES, -_errno.EPERM):
                _warn_once("dedup-denied", f"spillfs: {self.path}: dedup is off: the mount's control file "
                                           f"refused this user ({os.strerror(-rc)}); every byte is written")
            return None
        _native.check(rc, "dedup", self.path)
        self.dedup_requests += 1
        return bytearray(needed)[:n]

    def truncate(self, size):
        _native.check(self.lib.spill_file_truncate(self.handle, size), "truncate", self.path)

    def sync(self):
        _native.check(self.lib.spill_file_sync(self.handle), "sync", self.path)

    def close(self):
        if self.handle:
            handle, self.handle = self.handle, None
            _native.check(self.lib.spill_file_close(handle), "close", self.path)


def _u64_array(values):
    """`values` (an array.array("Q")) as a ctypes uint64 pointer (a dummy when empty)."""
    if len(values) == 0:
        return (ctypes.c_uint64 * 1)()
    return (ctypes.c_uint64 * len(values)).from_buffer(values)


def check_backend(backend):
    """ValueError unless `backend` is one open_file takes."""
    if backend not in ("auto", "native", "posix"):
        raise ValueError(f"backend must be 'auto', 'native' or 'posix', not {backend!r}")


def open_file(path, write, size_hint=0, backend="auto"):
    """A file for save/load: native where `backend` allows and the library
    has the segment I/O ("auto", "native"), else Python ("posix")."""
    check_backend(backend)
    lib = None if backend == "posix" else _native.segment_io()
    if lib is None:
        if backend == "native":
            raise _native.SpillError(_errno.ENOSYS, "libspillfs_client with the segment I/O is not available "
                                     "(set SPILLFS_CLIENT_LIB)")
        return PosixFile(path, write, size_hint)
    return NativeFile(lib, path, write, size_hint)


def hash_units_many(buffers, device, stream=0):
    """hash_units of each (ptr, length) of `buffers`, all on `device` (-1:
    host), as one array per buffer; on a GPU one kernel launch a buffer and
    one synchronisation for all. Needs the native library."""
    import array
    lib = _native.segment_io()
    if lib is None:
        raise _native.SpillError(_errno.ENOSYS, "hash_units needs libspillfs_client")
    if not hasattr(lib, "spill_hash_units_many"):
        return [hash_units(ptr, length, device, stream) for ptr, length in buffers]
    counts = [length // _native.HASH_UNIT_BYTES for _, length in buffers]
    total = sum(counts)
    out = array.array("Q", bytes(16 * total))
    if total:
        n = len(buffers)
        ptrs = (ctypes.c_void_p * n)(*[ptr for ptr, _ in buffers])
        lengths = (ctypes.c_uint64 * n)(*[length for _, length in buffers])
        buf = (ctypes.c_uint64 * (2 * total)).from_buffer(out)
        _native.check(lib.spill_hash_units_many(ptrs, lengths, n, device, int(stream or 0), buf), "hash_units")
    result, at = [], 0
    for count in counts:
        result.append(out[2 * at:2 * (at + count)])
        at += count
    return result


def hash_units(ptr, length, device, stream=0):
    """XXH3-128 of each whole 256 KiB unit of `length` bytes at `ptr` (host
    when device is -1, else CUDA memory, hashed on the GPU), as an array of
    2 uint64 (low, high) per unit. Needs the native library."""
    import array
    lib = _native.segment_io()
    if lib is None:
        raise _native.SpillError(_errno.ENOSYS, "hash_units needs libspillfs_client")
    n = length // _native.HASH_UNIT_BYTES
    out = array.array("Q", bytes(16 * n))
    if n:
        buf = (ctypes.c_uint64 * (2 * n)).from_buffer(out)
        _native.check(lib.spill_hash_units(ptr, length, device, int(stream or 0), buf), "hash_units")
    return out
