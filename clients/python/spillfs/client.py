"""The direct data path to a spillfs mount: :class:`Client`.

    import spillfs
    with spillfs.Client("/mnt/spill") as c:
        c.write("acts/x.bin", b"...")
        data = c.read("acts/x.bin", 3)
        rows = c.read_rows("feat.bin", 4096, [7, 3, 7])

Tensors are saved with :func:`spillfs.save` and loaded with :func:`spillfs.load`
(the ``torch.save`` format); a raw table for :meth:`Client.read_rows` is
written with :meth:`Client.write` (e.g. ``c.write("feat.bin", t.numpy())``).
The client needs the rights to open the volume's backing store (normally root).
"""

import ctypes
import errno as _errno
import os
import threading
import weakref

from ._native import SpillError, _ClientStats, load_library

__all__ = ["Client"]


def _np():
    try:
        import numpy
        return numpy
    except ImportError:
        return None


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _is_tensor(obj):
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def _writable_pointer(buf):
    """(address, nbytes, keepalive) of a writable buffer (bytearray, memoryview, numpy)."""
    mv = memoryview(buf)
    if mv.readonly:
        raise TypeError("the output buffer must be writable")
    if not mv.c_contiguous:
        raise ValueError("the output buffer must be contiguous")
    mv = mv.cast("B")
    holder = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(holder), mv.nbytes, (mv, holder)


def _readable_pointer(buf):
    """(address, nbytes, keepalive) of any contiguous buffer, read-only ones too."""
    if isinstance(buf, bytes):
        return ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value, len(buf), buf
    np = _np()
    if np is not None and isinstance(buf, np.ndarray):
        arr = np.ascontiguousarray(buf)
        return arr.ctypes.data, arr.nbytes, arr
    mv = memoryview(buf)
    if not mv.c_contiguous:
        raise ValueError("the buffer must be contiguous")
    if not mv.readonly:
        return _writable_pointer(mv)
    data = mv.tobytes()  # a read-only buffer that is not bytes: copy it once
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value, len(data), data


# Every open Client, so a fork()ed child (a DataLoader worker) can renew their
# call guards: one may have been copied held by a thread that does not exist
# in the child, and the calls it counts are the parent's. (The C library
# renews its own state in the child.)
_open_clients = weakref.WeakSet()


def _renew_guards_in_child():
    for client in list(_open_clients):
        client._guard = threading.Condition()
        client._active = 0


os.register_at_fork(after_in_child=_renew_guards_in_child)


class Client:
    """A direct-path handle on the spillfs mount at `mountpoint`."""

    def __init__(self, mountpoint, **settings):
        self._guard = threading.Condition()
        self._active = 0  # calls under way (see _call)
        self._handle = None
        self._lib = load_library()
        self.mountpoint = os.path.realpath(mountpoint)
        handle = self._lib.spill_client_open(os.fsencode(mountpoint))
        if not handle:
            self._raise(ctypes.get_errno() or _errno.EIO, "open " + mountpoint)
        self._handle = handle
        _open_clients.add(self)
        for key, value in settings.items():
            self.set(key, value)

    # -- plumbing --

    def _raise(self, code, what):
        message = (self._lib.spill_last_error() or b"").decode(errors="replace")
        raise SpillError(code, f"{what}: {message or os.strerror(code)}")

    def _check(self, rc, what):
        if rc < 0:
            self._raise(-rc, what)
        return rc

    def _call(self, fn, *args):
        """fn(handle, *args), the handle kept open until fn returns: close()
        from another thread waits for calls under way instead of freeing
        the handle under them."""
        with self._guard:
            if not self._handle:
                raise ValueError("the spillfs client is closed")
            self._active += 1
        try:
            return fn(self._handle, *args)
        finally:
            with self._guard:
                self._active -= 1
                if not self._active:
                    self._guard.notify_all()

    def close(self):
        """Closes the handle once the calls under way in other threads return;
        later calls raise ValueError."""
        guard = getattr(self, "_guard", None)
        if guard is None:
            return
        with guard:
            handle, self._handle = self._handle, None
            while self._active:
                guard.wait()
        if handle:
            self._lib.spill_client_close(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def set(self, key, value):
        """A tunable of the library (see spill_client_set in spillfs/client.h)."""
        self._check(self._call(self._lib.spill_client_set, key.encode(), int(value)), "set " + key)

    def stats(self):
        s = _ClientStats()
        self._check(self._call(self._lib.spill_client_get_stats, ctypes.byref(s)), "stats")
        return {name: getattr(s, name) for name, _ in _ClientStats._fields_}

    def forget(self, path=None):
        """Drops the kept layout (and lease) of `path`, or of every path."""
        self._check(self._call(self._lib.spill_forget, None if path is None else os.fsencode(path)),
                    "forget")

    def _full(self, path):
        path = os.fspath(path)
        if path.startswith(self.mountpoint + "/"):
            return path
        return os.path.join(self.mountpoint, path.lstrip("/"))

    # -- bytes --

    def write(self, path, data):
        """Creates or replaces `path` (relative to the mount) with `data`
        (bytes, bytearray, memoryview, numpy array or any contiguous buffer)."""
        addr, n, keep = _readable_pointer(data)
        self._write_ptr(path, addr, n)
        del keep

    def _write_ptr(self, path, addr, nbytes):
        self._check(self._call(self._lib.spill_write, os.fsencode(path), addr, nbytes), "write " + str(path))

    def read_into(self, path, buf, offset=0):
        """Reads into the writable buffer `buf`; returns the bytes read."""
        addr, n, keep = _writable_pointer(buf)
        got = self._read_ptr(path, addr, n, offset)
        del keep
        return got

    def _read_ptr(self, path, addr, nbytes, offset=0):
        rc = self._call(self._lib.spill_read, os.fsencode(path), addr, nbytes, int(offset))
        return self._check(rc, "read " + str(path))

    def read(self, path, nbytes, offset=0):
        """Up to `nbytes` bytes of `path` at `offset` (short at the end of file)."""
        buf = bytearray(nbytes)
        got = self.read_into(path, buf, offset)
        return bytes(buf[:got]) if got < nbytes else bytes(buf)

    def read_rows(self, path, row_bytes, rows, out=None):
        """Rows `rows` (indices) of `row_bytes` bytes each from `path`.

        Returns `out` (any writable buffer of len(rows) * row_bytes bytes), or
        a new bytearray. `rows` may be a list, a numpy array or a tensor."""
        np = _np()
        if _is_tensor(rows):
            rows = rows.detach().cpu().numpy()
        if np is not None:
            idx = np.ascontiguousarray(np.asarray(rows, dtype=np.uint64).reshape(-1))
            rows_addr, count, keep_rows = idx.ctypes.data, idx.size, idx
        else:
            seq = list(rows)
            arr = (ctypes.c_uint64 * len(seq))(*seq)
            rows_addr, count, keep_rows = ctypes.addressof(arr), len(seq), arr
        if out is None:
            out = bytearray(count * row_bytes)
        if _is_tensor(out):
            if out.device.type != "cpu" or not out.is_contiguous():
                raise ValueError("read_rows: `out` must be a contiguous CPU tensor")
            addr, n, keep_out = out.data_ptr(), out.numel() * out.element_size(), out
        else:
            addr, n, keep_out = _writable_pointer(out)
        if n < count * row_bytes:
            raise ValueError(f"read_rows: out holds {n} bytes, {count * row_bytes} needed")
        rc = self._call(self._lib.spill_read_rows, os.fsencode(path), int(row_bytes), rows_addr,
                                       count, addr)
        del keep_rows, keep_out
        self._check(rc, "read_rows " + str(path))
        return out
