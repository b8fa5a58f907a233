"""``save_file``, ``load_file`` and ``safe_open``: safetensors files written and
read by spillfs's checkpoint machinery (:mod:`spillfs.checkpoint`'s writer by
offsets and storage loader), with the safetensors library's signatures and
errors."""

import os

from .. import _io
from .._report import IOReport, _publish
from ..checkpoint import _reader, _writer, _zipfile
from ..checkpoint._serialization import _named, save_records
from ..checkpoint._zipfile import BIG_ALIGN, SMALL_ALIGN, align_up
from . import _format
from ._format import SafetensorError

__all__ = ["save_file", "load_file", "safe_open", "SafetensorError"]


def _torch():
    import torch
    return torch


class SafetensorIOError(SafetensorError, OSError):
    """An I/O error of a save or load: a :class:`SafetensorError`, as the
    library raises, and an :class:`OSError` with the errno (``ENOSPC``...)
    and the file's name."""


# -- save ---------------------------------------------------------------------

def _check_tensors(tensors):
    """What the library's torch binding refuses, refused with its exceptions
    and messages (safetensors 0.8: _evaluate_tensors_for_save, _flatten_as_ptr,
    the Rust argument checks), before anything is written."""
    torch = _torch()
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            sparse.append(k)
    if sparse:
        raise ValueError(f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
                         " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
                         " make a much larger file than needed.")
    failing = [names for names in _shared(tensors) if len(names) > 1]
    if failing:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential differences when "
            f"loading them again: {failing}.\nA potential way to correctly save your model is to use `save_model`.\n"
            f"More information at https://huggingface.co/docs/safetensors/torch_shared_tensors")
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. It either means you"
                " are trying to save tensors which are reference of each other in which case it's recommended to save"
                " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
                " pack it before saving.")
        _format.dtype_name(v.dtype)  # KeyError, as the binding's size table raises
        if v.device.type == "meta":
            raise NotImplementedError("Cannot copy out of meta tensor; no data!")
    for k in tensors:
        if not isinstance(k, str):
            raise TypeError(f"argument 'tensor_dict': '{type(k).__name__}' object is not an instance of 'str'")


def _check_metadata(metadata):
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise TypeError(f"argument 'metadata': '{type(metadata).__name__}' object is not an instance of 'dict'")
    for k, v in metadata.items():
        for x in (k, v):
            if not isinstance(x, str):
                raise TypeError(f"argument 'metadata': '{type(x).__name__}' object is not an instance of 'str'")


def _shared(tensors):
    """Names of tensors whose bytes overlap, in groups (the library's
    _find_shared_tensors: by storage, then by overlapping ranges)."""
    by_storage = {}
    for k, v in tensors.items():
        if v.device.type == "meta":
            continue
        storage = v.untyped_storage()
        if storage.data_ptr() != 0 and storage.nbytes() != 0:
            by_storage.setdefault((v.device, storage.data_ptr(), storage.nbytes()), []).append(k)
    groups = []
    for names in by_storage.values():
        areas = sorted((tensors[n].data_ptr(), tensors[n].data_ptr() + tensors[n].numel() * tensors[n].itemsize, n)
                       for n in names)
        _, last_stop, first = areas[0]
        groups.append({first})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                groups.append({name})
            else:
                groups[-1].add(name)
            last_stop = stop
    return groups


class _Framing:
    """What a safetensors file adds around its tensors, for the writer by
    offsets: the header, at offset 0 (no checksums in this format)."""

    checksums = False

    def __init__(self, header, file_size):
        self.header = header
        self.file_size = file_size

    def pieces(self, records):
        return [(0, memoryview(self.header))], self.file_size


# Memory a save may copy units over several tensors into (on their device): a
# state_dict of thousands of tensors of odd sizes would otherwise copy about
# all of itself. Past it, those units are written as small records.
_GATHER_LIMIT = 256 << 20


def _records(tensors, entries, data_start, unit_aligned):
    """The writer's records of the tensors laid out by `entries`, the data at
    `data_start`. Unit-aligned, every whole 256 KiB unit of the data is a big
    record (hashed, shared where the volume holds it, the direct path): a run
    of units inside one tensor is a view of its memory; a unit over several
    tensors (one's end, the next one's start, small ones between) is their
    bytes gathered into a unit-sized buffer on their device (up to
    _GATHER_LIMIT bytes of them a save; past it such units are written every
    time). Only the last, partial unit and the header are written every time.
    Otherwise (small files) each tensor is a small record."""
    streams = {}
    pieces = []  # (file offset, Source) of each tensor with bytes, in file order
    for e in entries:
        if e.nbytes:
            t = tensors[e.name]
            src = _writer.Source(t.untyped_storage(), streams, t.storage_offset() * t.itemsize, e.nbytes)
            pieces.append((data_start + e.begin, src))
    if not unit_aligned:
        return [_record(at, src, SMALL_ALIGN) for at, src in pieces]
    records, partial, gathered = [], [], 0  # partial: (offset, Source) of the unit being gathered
    for at, src in pieces:
        a, b = at, at + src.nbytes
        while a < b:
            unit_end = a // BIG_ALIGN * BIG_ALIGN + BIG_ALIGN
            if a % BIG_ALIGN == 0 and b >= unit_end:  # whole units of this tensor alone
                n = (b - a) // BIG_ALIGN * BIG_ALIGN
                records.append(_record(a, _view(src, a - at, n, streams), BIG_ALIGN))
                a += n
                continue
            end = min(b, unit_end)
            partial.append((a, _view(src, a - at, end - a, streams)))
            a = end
            if a == unit_end:
                if gathered < _GATHER_LIMIT:
                    records.append(_record(partial[0][0], _gathered([p for _, p in partial], streams), BIG_ALIGN))
                    gathered += BIG_ALIGN
                else:
                    records += [_record(at, p, SMALL_ALIGN) for at, p in partial]
                partial = []
    records += [_record(at, src, SMALL_ALIGN) for at, src in partial]  # the end of the data, less than a unit
    return records


def _record(offset, src, align):
    r = _zipfile.Record("", src.nbytes, align, payload=src)
    r.offset = r.data_offset = offset
    return r


def _view(src, begin, nbytes, streams):
    """Bytes [begin, begin + nbytes) of `src`, a Source of its own."""
    if begin == 0 and nbytes == src.nbytes:
        return src
    return _writer.Source(src.storage, streams, src.begin + begin, nbytes)


def _gathered(sources, streams):
    """A Source over the bytes of `sources` copied one after the other into
    a buffer on their device (the CPU where they are on several)."""
    torch = _torch()
    parts = [s.byte_tensor() for s in sources]
    if len({p.device for p in parts}) > 1:
        parts = [p.cpu() for p in parts]
    return _writer.Source(torch.cat(parts).untyped_storage(), streams)


def save_file(tensors, filename, metadata=None, *, dedup=True, backend="auto", report=None):
    r"""save_file(tensors, filename, metadata=None, *, dedup=True, backend="auto", report=None)

    Saves a dict of tensors to `filename` in the safetensors format, as
    :func:`safetensors.torch.save_file` does, at the disk's speed.

    The file is a safetensors file (the library reads it; ``load_file`` and
    ``safe_open`` here read the library's). Its layout is chosen for the
    volume's dedup (see :mod:`spillfs.safetensors._format`): with a tensor of
    256 KiB or more, the header is padded with spaces to a 256 KiB unit and
    tensors of whole units come first, so the units of tensors saved again
    unchanged are shared, not written: a second save writes the units of the
    tensors that changed, the header's and the last one's. The bytes go as
    :func:`spillfs.save`'s: from the
    tensors' memory (CUDA: GPU -> pinned pool -> disk, the units hashed on the
    GPU) by libspillfs_client's segment I/O, or ``os.pwritev`` without it;
    under a temporary name, fsync'ed and renamed over `filename`.

    Args:
        tensors (dict[str, torch.Tensor]): contiguous, dense tensors, none
            sharing memory with another (as the library requires, with its
            exceptions: ``ValueError``, ``RuntimeError``, ``TypeError``).
        filename (str or os.PathLike): the file.
        metadata (dict[str, str], optional): the header's ``__metadata__``.
        dedup (bool): share the units the volume holds (spillfs mounts).
        backend (str): ``"auto"``, ``"native"`` or ``"posix"`` (see :func:`spillfs.save`).
        report (IOReport, optional): filled in and returned.

    Returns:
        :class:`spillfs.IOReport` (the library's returns None).

    Raises:
        SafetensorIOError: an I/O error (a :class:`SafetensorError` and an
            :class:`OSError` with its errno, naming `filename`).

    Example:
        >>> spillfs.safetensors.save_file(model.state_dict(), "/mnt/spill/model.safetensors")
    """
    _check_tensors(tensors)
    _check_metadata(metadata)
    path = os.fspath(filename)
    report = report if report is not None else IOReport()
    report.op, report.path, report.dedup = "save", path, False
    with report.stage("total"):
        specs = []
        for name, t in tensors.items():
            dtype = _format.dtype_name(t.dtype)
            specs.append((name, dtype, _format.header_shape(dtype, t.shape), t.numel() * t.itemsize))
        entries, unit_aligned = _format.plan(specs)
        header = _format.encode_header(entries, metadata, unit_aligned)
        file_size = len(header) + (entries[-1].end if entries else 0)
        records = _records(tensors, entries, len(header), unit_aligned)
        report.storages = len(tensors)
        report.storage_bytes = sum(e.nbytes for e in entries)
        opts = _writer.Options(dedup=dedup, crc32=False)
        try:
            save_records(path, records, _Framing(header, file_size), file_size, opts, backend, report)
        except OSError as e:
            raise SafetensorIOError(e.errno, f"Error while serializing: I/O error: {e.strerror}", path) from e
        report.crc32_skipped = 0  # the format has no checksums: none is missing
    _publish(report)
    return report


# -- load ---------------------------------------------------------------------

_FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}
_READ_BACKENDS = {"mmap": "auto", "pread": "auto", "auto": "auto", "native": "native", "posix": "posix"}


def _device(device):
    """`device` (the library's forms: "cpu", "cuda", "cuda:1", 1, a torch.device) as a map_location."""
    torch = _torch()
    if isinstance(device, bool):
        raise SafetensorError(f"device {device} is invalid")
    if isinstance(device, int):
        return f"cuda:{device}"
    try:
        return str(torch.device(device))
    except (RuntimeError, TypeError):
        raise SafetensorError(f"device {device} is invalid") from None


class _Layout:
    """Where each tensor's bytes lie, for the storage loader."""

    def __init__(self, file, data_start, entries, order):
        self.file = file
        self.data_start = data_start
        self.entries = entries
        self.order = order

    def storage_keys(self):
        return self.order

    def locate(self, name):
        e = self.entries[name]
        return self.data_start + e.begin, e.nbytes


class safe_open:
    r"""safe_open(filename, framework, device="cpu", *, backend="auto")

    Opens a safetensors file, as :class:`safetensors.safe_open` does: its
    header is read and checked at once (``SafetensorError`` for a bad file,
    as the library words it), tensors are read on demand, straight into
    their memory on `device` (CUDA: disk -> pinned pool -> GPU, through
    libspillfs_client), not mapped. A context manager (the file is closed on
    exit); also usable without ``with`` (closed by :meth:`__exit__` or when
    collected).

    Args:
        filename (str or os.PathLike): the file.
        framework (str): ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays, CPU).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``N`` or a :class:`torch.device`.
        backend (str): ``"auto"``, ``"native"`` or ``"posix"`` (see
            :func:`spillfs.save`); the library's ``"mmap"`` and ``"pread"``
            mean ``"auto"``.

    Example:
        >>> with spillfs.safetensors.safe_open("/mnt/spill/model.safetensors", "pt", device="cuda") as f:
        ...     w = f.get_tensor("lm_head.weight")
    """

    def __init__(self, filename, framework, device="cpu", *, backend="auto"):
        if framework not in _FRAMEWORKS:
            raise SafetensorError(f"framework {framework} is invalid")
        self._framework = _FRAMEWORKS[framework]
        self._map_location = _device(device)
        if backend not in _READ_BACKENDS:
            raise ValueError(f"backend must be one of {sorted(_READ_BACKENDS)}, not {backend!r}")
        self._path = os.fspath(filename)
        self._file = None
        try:
            self._file = _io.open_file(self._path, write=False, backend=_READ_BACKENDS[backend])
        except OSError as e:
            raise _named(e, self._path) from None
        try:
            self._read_header()
        except BaseException:
            self._close()
            raise

    def _read_header(self):
        size = self._file.size
        n = _format.header_length(self._file.pread(0, 8), size)
        text = self._file.pread(8, n)
        if len(text) != n:
            raise _format._error("invalid header length")
        self._metadata, self._entries, self._order = _format.decode_header(text, size - 8 - n)
        self._data_start = 8 + n

    def _open(self):
        if self._file is None:
            raise SafetensorError("File is closed")
        return self._file

    def _close(self):
        if self._file is not None:
            file, self._file = self._file, None
            file.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self._close()

    def __del__(self):
        try:
            self._close()
        except Exception:  # noqa: BLE001 - nothing to tell at collection
            pass

    def keys(self):
        """The tensors' names, sorted (as the library gives them)."""
        self._open()
        return sorted(self._entries)

    def offset_keys(self):
        """The tensors' names in the order of their data in the file."""
        self._open()
        return list(self._order)

    def metadata(self):
        """The header's ``__metadata__`` (a dict of str), or None."""
        self._open()
        return None if self._metadata is None else dict(self._metadata)

    def _entry(self, name):
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise SafetensorError(f"File does not contain tensor {name}") from None

    def get_tensor(self, name):
        """The tensor `name`, read into memory on the device."""
        self._open()
        self._entry(name)
        return self._load([name], readahead_bytes=0)[name]

    def get_tensors(self):
        """Every tensor, {name: tensor} in the file's order, each read while
        the next ones are read ahead."""
        self._open()
        return self._load(self._order, readahead_bytes=512 << 20)

    def get_slice(self, name):
        """A :class:`SafeSlice` of tensor `name`: its shape and dtype, and
        the part that indexing it asks for, read on demand."""
        self._open()
        return SafeSlice(self, self._entry(name))

    def _load(self, names, readahead_bytes):
        report = IOReport(op="load", path=self._path)
        report.backend = "native" if self._file.native else "posix"
        report.io_path = self._file.backend
        report.file_bytes = self._file.size
        out = {}
        with report.stage("total"):
            layout = _Layout(self._file, self._data_start, self._entries, list(names))
            loader = _reader.StorageLoader(layout, self._map_location, report, readahead_bytes=readahead_bytes)
            try:
                for name in names:
                    e = self._entries[name]
                    storage = loader.load(name, e.nbytes, "cpu")
                    out[name] = self._wrap(_tensor(storage, e))
            except (OSError, EOFError) as err:
                raise _reader.io_error(err, self._path) from None
            finally:
                loader.close()
        _publish(report)
        return out

    def _wrap(self, tensor):
        return tensor.numpy() if self._framework == "np" else tensor

    def _read(self, offset, nbytes):
        """Bytes [offset, offset + nbytes) of the data, as a CPU uint8 tensor."""
        torch = _torch()
        out = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            try:
                self._open().read([_io.Segment(out.data_ptr(), nbytes, self._data_start + offset, -1)]).wait()
            except (OSError, EOFError) as err:
                raise _reader.io_error(err, self._path) from None
        return out


def _tensor(storage, entry):
    """A tensor of `entry`'s dtype and shape over the untyped `storage`."""
    torch = _torch()
    dtype = _format.torch_dtype(entry.dtype)
    shape = _format.torch_shape(entry.dtype, entry.shape)
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, shape)


class SafeSlice:
    """A tensor of an open file, read on indexing: ``get_shape()``,
    ``get_dtype()`` (the format's name: ``"BF16"``), ``[index]`` (torch's
    indexing; a leading int or slice reads only those rows)."""

    def __init__(self, handle, entry):
        self._handle = handle
        self._entry = entry

    def get_shape(self):
        return list(self._entry.shape)

    def get_dtype(self):
        return self._entry.dtype

    def __getitem__(self, index):
        e = self._entry
        shape = _format.torch_shape(e.dtype, e.shape)
        index = index if isinstance(index, tuple) else (index,)
        first = index[0] if index else Ellipsis
        rows = None
        if shape and isinstance(first, int) and not isinstance(first, bool):
            i = first + shape[0] if first < 0 else first
            if not 0 <= i < shape[0]:
                raise IndexError(f"index {first} is out of bounds for dimension 0 with size {shape[0]}")
            rows, rest = (i, i + 1), (0,) + index[1:]
        elif shape and isinstance(first, slice) and (first.step is None or first.step > 0):
            start, stop, step = first.indices(shape[0])
            stop = max(start, stop)
            rows, rest = (start, stop), (slice(None, None, step),) + index[1:]
        if rows is None:  # anything else: the whole tensor, indexed here
            rows, rest = (0, shape[0] if shape else 1), index
        row_bytes = e.nbytes // shape[0] if shape and shape[0] else e.nbytes
        data = self._handle._read(e.begin + rows[0] * row_bytes, (rows[1] - rows[0]) * row_bytes)
        part_shape = _format.header_shape(e.dtype, [rows[1] - rows[0]] + shape[1:]) if shape else []
        part = _format.Entry(e.name, e.dtype, part_shape, 0, data.numel())
        tensor = _tensor(data.untyped_storage(), part)[rest]
        torch = _torch()
        if self._handle._map_location != "cpu":
            tensor = tensor.to(torch.device(self._handle._map_location))
        return self._handle._wrap(tensor)


def load_file(filename, device="cpu", *, backend="auto"):
    r"""load_file(filename, device="cpu", *, backend="auto")

    Loads a safetensors file into a dict of tensors, as
    :func:`safetensors.torch.load_file` does: each read into its memory on
    `device` (see :class:`safe_open`), the next ones read ahead.

    Example:
        >>> sd = spillfs.safetensors.load_file("/mnt/spill/model.safetensors", device="cuda:0")
    """
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()
