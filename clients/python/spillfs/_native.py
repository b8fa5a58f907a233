"""Finding and loading libspillfs_client.so (ctypes), and the types of its C ABI.

The library is looked for, in order, at:

1. ``$SPILLFS_CLIENT_LIB`` (a path to the .so; when set, nothing else is tried),
2. ``libspillfs_client.so`` beside this package (``spillfs/lib/``, where
   ``cmake --install`` links the installed library),
3. ``build/lib/libspillfs_client.so`` of the source tree this package sits in,
4. the dynamic loader's search path (e.g. after ``cmake --install``).

A library that answers ``spill_version()`` with another version than this
package's :data:`spillfs.__version__` is refused (:class:`LibraryVersionError`,
naming both versions): the C ABI of the segment I/O is not versioned apart
from the package.

``SPILLFS_IO=posix`` in the environment makes :func:`segment_io` answer
``None``, so ``spillfs.save`` / ``spillfs.load`` use their pure-Python I/O even
where the library is present.
"""

import ctypes
import errno as _errno
import os
import threading

from ._version import __version__

__all__ = ["SpillError", "LibraryVersionError", "load_library", "library_path", "segment_io",
           "SpillSegment", "SpillIoStats", "check", "last_error", "SPILL_FILE_READ", "SPILL_FILE_WRITE",
           "SPILL_FILE_CREATE", "SPILL_FILE_TRUNCATE", "BACKEND_NAMES", "HASH_UNIT_BYTES"]

# spill_file_open flags and spill_file_backend answers (clients/include/spillfs/client.h).
SPILL_FILE_READ = 1
SPILL_FILE_WRITE = 2
SPILL_FILE_CREATE = 4
SPILL_FILE_TRUNCATE = 8
BACKEND_NAMES = {1: "direct_path", 2: "mount", 3: "direct_io", 4: "buffered", 5: "memory_io"}

HASH_UNIT_BYTES = 256 << 10  # the volume's dedup unit; spill_hash_units hashes whole ones

_lock = threading.Lock()
_lib = None
_lib_path = None
_segment_lib = False  # False: not probed yet; None: probed, absent


class SpillError(OSError):
    """An error of the client library: ``errno`` and the library's message."""


class LibraryVersionError(SpillError):
    """libspillfs_client.so is of another version than this Python package."""


class SpillSegment(ctypes.Structure):
    """``spill_segment``: ``length`` bytes at ``ptr`` (host when ``device`` is -1,
    else on that CUDA device) to or from ``file_offset``."""
    _fields_ = [("ptr", ctypes.c_void_p), ("length", ctypes.c_uint64), ("file_offset", ctypes.c_uint64),
                ("device", ctypes.c_int32)]


class SpillIoStats(ctypes.Structure):
    """``spill_io_stats``: what one segment request did (seconds overlap)."""
    _fields_ = ([(name, ctypes.c_uint64) for name in ("bytes", "io_bytes", "ios")]
                + [(name, ctypes.c_double) for name in ("seconds", "copy_seconds", "io_seconds", "hash_seconds",
                                                        "daemon_seconds")]
                + [("shared_bytes", ctypes.c_uint64)])


class _ClientStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "bytes_written", "bytes_read", "ios", "layouts", "layout_cache_hits", "checksum_errors")]


def _candidates():
    env = os.environ.get("SPILLFS_CLIENT_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "lib", "libspillfs_client.so")
    # clients/python/spillfs -> repository root -> build/lib
    yield os.path.normpath(os.path.join(here, "..", "..", "..", "build", "lib", "libspillfs_client.so"))
    yield "libspillfs_client.so"


def _declare_core(lib):
    vp, cp, sz, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64
    lib.spill_client_open.argtypes = [cp]
    lib.spill_client_open.restype = vp
    lib.spill_client_close.argtypes = [vp]
    lib.spill_client_close.restype = ctypes.c_int
    lib.spill_client_set.argtypes = [vp, cp, u64]
    lib.spill_client_set.restype = ctypes.c_int
    lib.spill_write.argtypes = [vp, cp, vp, sz]
    lib.spill_write.restype = ctypes.c_int
    lib.spill_read.argtypes = [vp, cp, vp, sz, u64]
    lib.spill_read.restype = ctypes.c_int64
    lib.spill_read_rows.argtypes = [vp, cp, u64, vp, sz, vp]
    lib.spill_read_rows.restype = ctypes.c_int
    lib.spill_forget.argtypes = [vp, cp]
    lib.spill_forget.restype = ctypes.c_int
    lib.spill_client_get_stats.argtypes = [vp, ctypes.POINTER(_ClientStats)]
    lib.spill_client_get_stats.restype = ctypes.c_int
    lib.spill_last_error.argtypes = []
    lib.spill_last_error.restype = cp


_SEGMENT_SYMBOLS = ("spill_version", "spill_file_open", "spill_file_backend", "spill_file_write_segments",
                    "spill_file_read_segments",
                    "spill_request_wait", "spill_file_sync", "spill_file_close", "spill_file_truncate",
                    "spill_hash_units", "spill_file_dedup", "spill_config_set")


def _declare_segments(lib):
    vp, cp, sz, u64, i32, ip = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64,
                                ctypes.c_int32, ctypes.c_int)
    lib.spill_file_open.argtypes = [cp, ip, u64]
    lib.spill_file_open.restype = vp
    lib.spill_file_backend.argtypes = [vp]
    lib.spill_file_backend.restype = ip
    for name in ("spill_file_write_segments", "spill_file_read_segments"):
        fn = getattr(lib, name)
        fn.argtypes = [vp, ctypes.POINTER(SpillSegment), sz, ctypes.c_size_t, ctypes.POINTER(vp)]
        fn.restype = ip
    lib.spill_request_wait.argtypes = [vp, ctypes.POINTER(SpillIoStats)]
    lib.spill_request_wait.restype = ip
    lib.spill_file_sync.argtypes = [vp]
    lib.spill_file_sync.restype = ip
    lib.spill_file_close.argtypes = [vp]
    lib.spill_file_close.restype = ip
    lib.spill_file_truncate.argtypes = [vp, u64]
    lib.spill_file_truncate.restype = ip
    lib.spill_hash_units.argtypes = [vp, u64, i32, ctypes.c_size_t, ctypes.POINTER(u64)]
    lib.spill_hash_units.restype = ip
    lib.spill_file_dedup.argtypes = [vp, u64, ctypes.POINTER(u64), sz, ctypes.POINTER(ctypes.c_uint8)]
    lib.spill_file_dedup.restype = ip
    lib.spill_config_set.argtypes = [cp, u64]
    lib.spill_config_set.restype = ip
    if hasattr(lib, "spill_hash_units_many"):  # optional: without it, a call (and a sync) per buffer
        lib.spill_hash_units_many.argtypes = [ctypes.POINTER(vp), ctypes.POINTER(u64), sz, i32, ctypes.c_size_t,
                                              ctypes.POINTER(u64)]
        lib.spill_hash_units_many.restype = ip
    if hasattr(lib, "spill_file_dedup_units"):  # optional: without it, a dedup request per storage
        lib.spill_file_dedup_units.argtypes = [vp, ctypes.POINTER(u64), ctypes.POINTER(u64), sz,
                                               ctypes.POINTER(ctypes.c_uint8)]
        lib.spill_file_dedup_units.restype = ip


def load_library():
    """Loads (once) and returns the ctypes handle of libspillfs_client.so.

    Raises :class:`SpillError` (``ENOENT``) naming every place tried when it is
    found nowhere, and :class:`LibraryVersionError` when the library found is
    of another version than this package."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            if os.path.sep in path and not os.path.exists(path):
                errors.append(f"{path}: no such file")
                continue
            try:
                lib = ctypes.CDLL(path, use_errno=True)
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        else:
            raise SpillError(_errno.ENOENT, "cannot load libspillfs_client.so (set SPILLFS_CLIENT_LIB): "
                             + "; ".join(errors))
        if hasattr(lib, "spill_version"):
            lib.spill_version.argtypes = []
            lib.spill_version.restype = ctypes.c_char_p
            found = (lib.spill_version() or b"?").decode(errors="replace")
            if found != __version__:
                raise LibraryVersionError(
                    _errno.ELIBBAD, f"{path} is libspillfs_client version {found}, but this spillfs Python "
                    f"package is version {__version__}: use the library built from the same source "
                    "(set SPILLFS_CLIENT_LIB)")
        _declare_core(lib)
        _lib, _lib_path = lib, path
        return lib


def library_path():
    """Where the loaded library came from (None before :func:`load_library`)."""
    return _lib_path


def segment_io():
    """The library when it has the segment I/O (``spill_file_*``), else None.

    None too where the library is found nowhere, or ``SPILLFS_IO=posix``. A
    library of another version raises :class:`LibraryVersionError`."""
    global _segment_lib
    if os.environ.get("SPILLFS_IO", "").lower() == "posix":
        return None
    if _segment_lib is False:
        try:
            lib = load_library()
        except LibraryVersionError:
            raise
        except SpillError:
            lib = None
        if lib is not None and all(hasattr(lib, s) for s in _SEGMENT_SYMBOLS):
            _declare_segments(lib)
            _segment_lib = lib
        else:
            _segment_lib = None
    return _segment_lib


def last_error():
    """The library's message for the last failed call on this thread."""
    lib = _lib
    if lib is None:
        return ""
    return (lib.spill_last_error() or b"").decode(errors="replace")


def check(rc, what, filename=None):
    """Returns ``rc``, or raises :class:`SpillError` where it is a negative errno
    (``ENOSPC`` and friends keep their errno; ``filename`` names the file)."""
    if rc < 0:
        code = -rc
        message = last_error() or os.strerror(code)
        if filename is not None:
            raise SpillError(code, f"{what}: {message}", os.fspath(filename))
        raise SpillError(code, f"{what}: {message}")
    return rc
