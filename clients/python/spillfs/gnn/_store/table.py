"""Feature tables as ordinary files: a ``.npy`` (header parsed) or a raw row-major
file with its shape and dtype given, and batched random row reads from them.

:func:`open_table` describes the file (:class:`TableInfo`: rows, row bytes, the
offset of row 0, the dtype); :class:`RowReader` reads rows by index through
``spill_file_read_rows`` of libspillfs_client (on a spillfs mount the direct
path with its block checksums; elsewhere io_uring ``O_DIRECT``, rows sharing
4 KiB blocks read once), or with ``os.pread`` where the library is missing or
``SPILLFS_IO=posix``.

Why parse the header: offsets guessed for ``.npy`` files (128 bytes "usually")
are how feature loaders ship wrong rows; version 2/3 headers and long dtype
descriptions move the data. Malformed files raise ``ValueError`` naming the
file (what ``np.load`` raises for them); missing ones ``FileNotFoundError``.

Threading: a :class:`RowReader` may be used from several threads at once.
"""

import ast
import ctypes
import os
import struct
import threading

import numpy as np

from ... import _native

__all__ = ["TableInfo", "open_table", "RowReader", "torch_dtype"]

_MAGIC = b"\x93NUMPY"


class TableInfo:
    """Where a table's rows lie: ``rows`` rows of ``row_bytes`` bytes from byte
    ``offset`` of ``path``, each ``width`` elements of ``dtype`` (a numpy
    dtype, or ``None`` for a torch-only dtype such as bfloat16, then
    ``torch_dtype`` says it)."""

    def __init__(self, path, rows, width, dtype, offset, torch_dtype=None):
        self.path = os.fspath(path)
        self.rows = int(rows)
        self.width = int(width)
        self.dtype = dtype
        self.torch_dtype = torch_dtype
        self.itemsize = dtype.itemsize if dtype is not None else _torch_itemsize(torch_dtype)
        self.row_bytes = self.width * self.itemsize
        self.offset = int(offset)

    @property
    def shape(self):
        return (self.rows, self.width)

    def __repr__(self):
        return (f"TableInfo({self.path!r}, shape={self.shape}, dtype={self.dtype or self.torch_dtype}, "
                f"offset={self.offset})")


def _torch_itemsize(dtype):
    import torch
    return torch.empty((), dtype=dtype).element_size()


def torch_dtype(info):
    """The torch dtype of the table's elements (TypeError where torch has none)."""
    import torch
    if info.torch_dtype is not None:
        return info.torch_dtype
    try:
        return torch.from_numpy(np.empty(0, dtype=info.dtype)).dtype
    except TypeError:
        raise TypeError(f"{info.path}: torch has no dtype for numpy {info.dtype}") from None


def _parse_npy_header(path, f):
    head = f.read(len(_MAGIC) + 2)
    if len(head) < len(_MAGIC) + 2 or not head.startswith(_MAGIC):
        raise ValueError(f"{path}: not a .npy file (no \\x93NUMPY magic)")
    major = head[len(_MAGIC)]
    if major == 1:
        raw = f.read(2)
        fmt = "<H"
    elif major in (2, 3):
        raw = f.read(4)
        fmt = "<I"
    else:
        raise ValueError(f"{path}: .npy format version {major}.{head[-1]} is not supported")
    if len(raw) != struct.calcsize(fmt):
        raise ValueError(f"{path}: truncated .npy header")
    (length,) = struct.unpack(fmt, raw)
    text = f.read(length)
    if len(text) != length:
        raise ValueError(f"{path}: truncated .npy header ({len(text)} of {length} bytes)")
    offset = len(head) + len(raw) + length
    try:
        header = ast.literal_eval(text.decode("utf-8" if major == 3 else "latin1"))
    except (SyntaxError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: malformed .npy header: {e}") from None
    if not isinstance(header, dict) or not {"descr", "fortran_order", "shape"} <= header.keys():
        raise ValueError(f"{path}: malformed .npy header (needs descr, fortran_order and shape): {header!r}")
    return header, offset


def _check_dtype(path, dtype):
    if dtype.hasobject:
        raise ValueError(f"{path}: dtype {dtype} holds Python objects, which cannot be read as rows")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"{path}: structured dtype {dtype} is not supported (use a plain numeric dtype)")
    if dtype.itemsize == 0:
        raise ValueError(f"{path}: dtype {dtype} has no size")


def open_table(path, shape=None, dtype=None, offset=0, raw=False):
    """Describes the table at ``path``.

    ``.npy`` files (found by their magic) need nothing more: the header says
    dtype and shape, which must be 2-D and C order (``shape``/``dtype``, when
    also given, must agree). Any other file is a raw row-major table: give
    ``dtype`` (numpy or torch) and ``shape`` (``(rows, width)``; ``rows`` may be
    ``-1`` to take all whole rows after ``offset``); ``raw=True`` reads a
    ``.npy`` that way too (its header as bytes before ``offset``)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        magic = f.read(len(_MAGIC))
        size = os.fstat(f.fileno()).st_size
        if magic == _MAGIC and not raw:
            f.seek(0)
            header, data_offset = _parse_npy_header(path, f)
            try:
                npdt = np.dtype(header["descr"]) if not isinstance(header["descr"], list) else None
            except TypeError as e:
                raise ValueError(f"{path}: unknown dtype {header['descr']!r} in the .npy header: {e}") from None
            if npdt is None:
                raise ValueError(f"{path}: structured dtype {header['descr']!r} is not supported")
            _check_dtype(path, npdt)
            if npdt.byteorder == ">" or (npdt.byteorder == "=" and np.little_endian is False):
                raise ValueError(f"{path}: big-endian dtype {npdt.str} is not supported")
            if header["fortran_order"]:
                raise ValueError(f"{path}: Fortran-order (column-major) .npy arrays are not supported: rows must "
                                 "be contiguous (save np.ascontiguousarray(a))")
            npy_shape = header["shape"]
            if not isinstance(npy_shape, tuple) or len(npy_shape) != 2:
                ndim = len(npy_shape) if isinstance(npy_shape, tuple) else "?"
                raise ValueError(f"{path}: a feature table must be 2-D (rows, width); this .npy has shape "
                                 f"{npy_shape} ({ndim}-D)")
            rows, width = (int(v) for v in npy_shape)
            if dtype is not None and _as_numpy(dtype) != npdt:
                raise ValueError(f"{path}: dtype {dtype} given, but the .npy header says {npdt}")
            if shape is not None and tuple(shape) != (rows, width):
                raise ValueError(f"{path}: shape {tuple(shape)} given, but the .npy header says {(rows, width)}")
            info = TableInfo(path, rows, width, npdt, data_offset)
        else:
            if dtype is None or shape is None:
                raise ValueError(f"{path}: not a .npy file, so give shape=(rows, width) and dtype= for it "
                                 "as a raw row-major table")
            shape = tuple(int(v) for v in shape)
            if len(shape) != 2:
                raise ValueError(f"{path}: shape must be (rows, width), not {shape}")
            npdt, tdt = _as_numpy(dtype), None
            if npdt is None:
                tdt = dtype
            else:
                _check_dtype(path, npdt)
            rows, width = shape
            info = TableInfo(path, 0, width, npdt, offset, tdt)
            if width <= 0:
                raise ValueError(f"{path}: width must be positive, not {width}")
            if rows < 0:
                rows = max(0, size - offset) // info.row_bytes
            info.rows = rows
    need = info.offset + info.rows * info.row_bytes
    if size < need:
        raise ValueError(f"{path}: holds {size} bytes, but {info.rows} rows of {info.row_bytes} bytes from offset "
                         f"{info.offset} need {need} (truncated?)")
    return info


def _as_numpy(dtype):
    """numpy dtype of a numpy or torch dtype (None for torch dtypes numpy lacks)."""
    try:
        import torch
        if isinstance(dtype, torch.dtype):
            try:
                return torch.empty(0, dtype=dtype).numpy().dtype
            except TypeError:
                return None
    except ImportError:
        pass
    return np.dtype(dtype)


class RowReader:
    """Reads rows of one table by index into host memory.

    ``read(rows, out)``: ``rows`` an int64 numpy array (already in range),
    ``out`` a C-contiguous uint8 array of ``len(rows) * row_bytes`` bytes (or
    None for a fresh one); returns ``out``. Counts ``ios`` and ``io_bytes``."""

    def __init__(self, info, posix=None):
        self.info = info
        self.ios = 0
        self.io_bytes = 0
        self._lock = threading.Lock()
        self._lib = None
        self._file = None
        self._fd = None
        if posix is None:
            posix = os.environ.get("SPILLFS_IO", "").lower() == "posix"
        lib = None if posix else _native.segment_io()
        if lib is not None and hasattr(lib, "spill_file_read_rows"):
            lib.spill_file_read_rows.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
                                                 ctypes.c_size_t, ctypes.c_void_p,
                                                 ctypes.POINTER(_native.SpillIoStats)]
            lib.spill_file_read_rows.restype = ctypes.c_int
            handle = lib.spill_file_open(os.fsencode(info.path), _native.SPILL_FILE_READ, 0)
            if not handle:
                err = ctypes.get_errno() or 5
                raise _native.SpillError(err, f"cannot open the table: {_native.last_error()}", info.path)
            self._lib, self._file = lib, handle
            self.backend = _native.BACKEND_NAMES.get(lib.spill_file_backend(handle), "?")
        else:
            self._fd = os.open(info.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self.backend = "posix"

    def read(self, rows, out=None):
        info = self.info
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        n = len(rows)
        if out is None:
            out = np.empty(n * info.row_bytes, dtype=np.uint8)
        if n == 0:
            return out
        if self._lib is not None:
            stats = _native.SpillIoStats()
            rc = self._lib.spill_file_read_rows(self._file, info.offset, info.row_bytes, rows.ctypes.data, n,
                                                out.ctypes.data, ctypes.byref(stats))
            if rc < 0:
                if rc == -34:  # ERANGE: a row outside the file (it shrank, or a caller's bug)
                    raise IndexError(_native.last_error())
                _native.check(rc, "reading rows", info.path)
            with self._lock:
                self.ios += stats.ios
                self.io_bytes += stats.io_bytes
            return out
        return self._read_posix(rows, out)

    def _read_posix(self, rows, out):
        info = self.info
        rb = info.row_bytes
        view = out.reshape(len(rows), rb)
        order = np.argsort(rows, kind="stable")
        ios = io_bytes = 0
        i = 0
        n = len(rows)
        while i < n:  # runs of consecutive rows, one pread each
            j = i + 1
            while j < n and rows[order[j]] - rows[order[j - 1]] in (0, 1) and (
                    rows[order[j]] - rows[order[i]] + 1) * rb <= (128 << 10):
                j += 1
            first, last = int(rows[order[i]]), int(rows[order[j - 1]])
            data = os.pread(self._fd, (last - first + 1) * rb, info.offset + first * rb)
            if len(data) != (last - first + 1) * rb:
                raise OSError(5, "short read (did the file shrink?)", info.path)
            block = np.frombuffer(data, dtype=np.uint8).reshape(-1, rb)
            view[order[i:j]] = block[rows[order[i:j]] - first]
            ios += 1
            io_bytes += len(data)
            i = j
        with self._lock:
            self.ios += ios
            self.io_bytes += io_bytes
        return out

    def close(self):
        if self._file is not None:
            self._lib.spill_file_close(self._file)
            self._file = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
