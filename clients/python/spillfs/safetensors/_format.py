"""The safetensors format: its dtypes, its header, and where spillfs puts the tensors.

A file is an 8-byte little-endian length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``
(which may end in spaces), then the data: the tensors' bytes, at their
offsets from the end of the header. The safetensors library (0.4 to 0.8,
``Metadata::validate``) wants the offsets, sorted, to cover the data exactly:
no gap between two tensors, none after the last. The order of the tensors in
the data is free, and so is the header's padding.

The layout (:func:`plan`) uses that freedom for the volume's 256 KiB dedup
units. Where some tensor is 256 KiB or more, the header is padded with
spaces so the data starts on a unit boundary, and the tensors whose size is
a whole number of units come first: each starts on a unit boundary, so a
tensor saved again unchanged is the same units, read straight from its
memory. The other tensors follow, as the library orders them (by dtype,
widest first, then by name: every tensor stays aligned to its element size);
their units are the same from save to save too while they do not change, and
the writer gathers the units shared by several of them (``_files._records``).
Without a tensor of a unit the file is what the library writes, byte for
byte (with at most one ``__metadata__`` key: the library writes several in
its hash map's order, which changes from run to run).
"""

import json
import struct

from ..checkpoint._zipfile import BIG_ALIGN, align_up

try:  # the library's exception where it is installed, so `except SafetensorError` catches ours
    from safetensors import SafetensorError
except ImportError:  # pragma: no cover - safetensors not installed
    class SafetensorError(Exception):
        """A file that is not a valid safetensors file (as the safetensors library names it)."""

MAX_HEADER_SIZE = 100_000_000  # the library's bound on N
_ALIGN = 8  # the library pads the header to a multiple of 8 bytes

# The library's dtype names in its order (Rust's Dtype enum, 0.8): files list
# tensors by this order, widest first, which keeps each aligned to its size.
_DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
                "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
_RANK = {name: i for i, name in enumerate(_DTYPE_ORDER)}
_TORCH_NAMES = {  # name -> the torch dtype's attribute (those this torch lacks are left out)
    "BOOL": "bool", "F4": "float4_e2m1fn_x2", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16",
    "I32": "int32", "U32": "uint32", "F32": "float32", "C64": "complex64", "F64": "float64", "I64": "int64",
    "U64": "uint64",
}
_PACKED = {"F4": 2}  # elements a byte, where the header counts them and torch's dtype holds several
_by_name = None


def _tables():
    """({name: torch dtype}, {torch dtype: name}) of the dtypes this torch has."""
    global _by_name
    if _by_name is None:
        import torch
        _by_name = {n: getattr(torch, a) for n, a in _TORCH_NAMES.items() if hasattr(torch, a)}
    return _by_name, {d: n for n, d in _by_name.items()}


def dtype_name(dtype):
    """The safetensors name of a torch dtype; KeyError(dtype), as the
    library's torch binding raises, for one the format has not."""
    return _tables()[1][dtype]


def torch_dtype(name):
    """The torch dtype of a safetensors name."""
    return _tables()[0][name]


def header_shape(name, shape):
    """The shape the header gives a tensor of torch `shape` (packed dtypes count elements)."""
    shape = list(shape)
    if name in _PACKED and shape:
        shape[-1] *= _PACKED[name]
    return shape


def torch_shape(name, shape):
    shape = list(shape)
    if name in _PACKED and shape:
        shape[-1] //= _PACKED[name]
    return shape


_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
         "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
         "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


class Entry:
    """One tensor of a file: name, dtype name, header shape, [begin, end) in the data."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def nbytes(self):
        return self.end - self.begin


def plan(specs):
    """The data offsets of tensors `specs` ([(name, dtype name, header shape,
    nbytes)]): [Entry] in data order, and whether the data should start on a
    unit boundary (some tensor is a unit or more). See the module's doc."""
    def library_order(spec):
        return (-_RANK[spec[1]], spec[0])
    specs = sorted(specs, key=library_order)
    units = any(s[3] >= BIG_ALIGN for s in specs)
    if units:  # whole units first: sizes that keep every later tensor where the library's order puts it
        whole = [s for s in specs if s[3] and s[3] % BIG_ALIGN == 0]
        specs = whole + [s for s in specs if not (s[3] and s[3] % BIG_ALIGN == 0)]
    entries, at = [], 0
    for name, dtype, shape, nbytes in specs:
        entries.append(Entry(name, dtype, shape, at, at + nbytes))
        at += nbytes
    return entries, units


def encode_header(entries, metadata, unit_aligned):
    """The file's first bytes: N, then the JSON (``__metadata__`` first, the
    tensors in data order, as the library writes it) padded with spaces to a
    multiple of 8 bytes, or so that the data starts on a unit boundary."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    for e in entries:
        header[e.name] = {"dtype": e.dtype, "shape": e.shape, "data_offsets": [e.begin, e.end]}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    n = align_up(len(text), _ALIGN)
    if unit_aligned:
        n = align_up(8 + len(text), BIG_ALIGN) - 8
    return struct.pack("<Q", n) + text + b" " * (n - len(text))


def _error(what):
    return SafetensorError(f"Error while deserializing header: {what}")


def header_length(head, file_size):
    """N from the file's first 8 bytes `head`, checked as the library checks it."""
    if len(head) < 8 or file_size < 8:
        raise _error("header too small")
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER_SIZE:
        raise _error("header too large")
    if 8 + n > file_size:
        raise _error("invalid header length")
    return n


def decode_header(text, data_size):
    """(metadata or None, {name: Entry}, [names in data order]) of the JSON
    header `text`, validated as the library validates it against `data_size`
    bytes of data."""
    try:
        header = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise _error("invalid UTF-8 in header") from None
    except ValueError as e:
        raise _error(f"invalid JSON in header: {e}") from None
    if not isinstance(header, dict):
        raise _error("invalid JSON in header: expected a map")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise _error("invalid JSON in header: __metadata__ must be a map of strings")
    entries = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            ok = (dtype in _RANK and isinstance(shape, list)
                  and all(isinstance(d, int) and d >= 0 for d in shape + [begin, end]))
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise _error(f"invalid JSON in header: bad entry for tensor `{name}`")
        entries[name] = Entry(name, dtype, shape, begin, end)
    order = sorted(entries, key=lambda k: (entries[k].begin, entries[k].end))
    at = 0
    for name in order:
        e = entries[name]
        if e.begin != at or e.end < e.begin:
            raise _error(f"invalid offset for tensor `{name}`")
        at = e.end
        count = 1
        for d in e.shape:
            count *= d
        if (count * _BITS[e.dtype] + 7) // 8 != e.nbytes:
            raise _error("invalid shape, data type, or offset for tensor")
    if at != data_size:
        raise _error("incomplete metadata, file not fully covered")
    return metadata, entries, order
