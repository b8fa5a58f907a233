"""Reading a torch.save archive: its central directory, its records, and its
storages straight into their final memory (CPU tensors, or CUDA memory through
pinned buffers), the next ones read ahead while the unpickler goes on.

Each storage is complete before the unpickler gets it (so objects that look
at tensor values while being unpickled see what ``torch.load`` shows them);
throughput comes from reading ahead: storages are numbered in the order the
pickler met them, which is the order the unpickler asks for them, so while
storage k is handed over, k+1, k+2, ... (up to ``readahead_bytes``) are in
flight, to the device storage k went to.
"""

import ctypes
import errno as _errno
import io
import os
import struct

from .. import _io
from . import _zipfile
from ._zipfile import FormatError


class Unsupported(Exception):
    """Records this reader does not handle (compressed...): torch.load does."""


class StreamFile:
    """A seekable file object behind the ``_io`` file interface (host memory)."""

    native = False
    supports_device = False
    backend = "stream"

    def __init__(self, f):
        self.stats = {}
        self.f = f
        self.base = f.tell()
        self.size = f.seek(0, io.SEEK_END) - self.base
        f.seek(self.base)
        self.path = getattr(f, "name", None) if isinstance(getattr(f, "name", None), str) else None

    def pread(self, offset, length):
        self.f.seek(self.base + offset)
        return self.f.read(length)

    def read(self, segments, stream=0):
        for s in segments:
            view = _io.host_view(s.ptr, s.length)
            self.f.seek(self.base + s.offset)
            done = 0
            while done < s.length:
                got = self.f.readinto(view[done:]) if hasattr(self.f, "readinto") else None
                if got is None:
                    chunk = self.f.read(s.length - done)
                    view[done:done + len(chunk)] = chunk
                    got = len(chunk)
                if not got:
                    raise EOFError(f"the file ends {s.length - done} bytes short of a record")
                done += got
        return _io.Request(lambda: {"bytes": sum(s.length for s in segments)})

    def close(self):
        self.f.seek(self.base)


class Archive:
    """The records of an opened archive (names relative to its folder)."""

    def __init__(self, file):
        self.file = file
        entries = _zipfile.read_directory(file.pread, file.size)
        if not entries:
            raise FormatError("archive does not contain any files")
        first = entries[0].name
        slash = first.find("/")
        if slash < 0:
            raise FormatError(f"file in archive is not in a subdirectory: {first}")
        self.prefix = first[:slash + 1]
        self.entries = {e.name[len(self.prefix):]: e for e in entries if e.name.startswith(self.prefix)}
        self._offsets = {}

    def has_record(self, name):
        return name in self.entries

    def entry(self, name):
        try:
            return self.entries[name]
        except KeyError:
            raise FormatError(f"failed locating file {name}: file not found") from None

    def data_offset(self, name):
        offset = self._offsets.get(name)
        if offset is None:
            e = self.entry(name)
            if e.method != 0 or e.compressed_size != e.size:
                raise Unsupported(f"record {name} is compressed")
            offset = self._offsets[name] = _zipfile.data_offset(self.file.pread, e, self.file.size)
        return offset

    def locate_all(self, prefix="data/"):
        """Data offsets of every stored record under `prefix`, their local
        headers read in one request (hundreds of storages, one round trip)."""
        todo = [n for n, e in self.entries.items()
                if n.startswith(prefix) and n not in self._offsets and e.method == 0 and e.compressed_size == e.size]
        if not todo:
            return
        heads = bytearray(_zipfile.LOCAL_HEADER * len(todo))
        base = _io_addr(heads)
        segments = [_io.Segment(base + i * _zipfile.LOCAL_HEADER, _zipfile.LOCAL_HEADER, self.entries[n].offset, -1)
                    for i, n in enumerate(todo)]
        try:
            self.file.read(segments).wait()
        except (OSError, EOFError):
            return  # data_offset() will find out record by record
        for i, n in enumerate(todo):
            e = self.entries[n]
            head = heads[i * _zipfile.LOCAL_HEADER:(i + 1) * _zipfile.LOCAL_HEADER]
            if head[:4] != b"PK\x03\x04":
                continue
            name_len, extra_len = struct.unpack_from("<HH", head, 26)
            start = e.offset + _zipfile.LOCAL_HEADER + name_len + extra_len
            if start + e.compressed_size <= self.file.size:
                self._offsets[n] = start

    def get_record(self, name):
        offset = self.data_offset(name)
        size = self.entry(name).size
        data = self.file.pread(offset, size)
        if len(data) != size:
            raise FormatError(f"short read of record {name}")
        return data

    def storage_keys(self):
        """Keys of data/<key> records, in the order the pickler numbered them
        (their local headers read first, all in one request)."""
        self.locate_all("data/")
        keys = [n[5:] for n in self.entries if n.startswith("data/")]
        return sorted(keys, key=lambda k: (0, int(k), "") if k.isdigit() else (1, 0, k))

    def locate(self, key):
        """(data offset, size) of storage `key`'s record."""
        name = "data/" + key
        return self.data_offset(name), self.entry(name).size


def _io_addr(buf):
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def _torch():
    import torch
    return torch


def untyped(tensor):
    """The UntypedStorage of a tensor, in torch 1.13 and 2.x."""
    if hasattr(tensor, "untyped_storage"):
        return tensor.untyped_storage()
    return tensor.storage().untyped()


def restore_location_for(map_location):
    """torch's restore_location(storage, location) for a map_location."""
    torch = _torch()
    serialization = torch.serialization
    get = getattr(serialization, "_get_restore_location", None)
    if get is not None:
        return get(map_location)
    default = serialization.default_restore_location  # the same rules, should torch rename its helper
    if map_location is None:
        return default
    if isinstance(map_location, dict):
        return lambda storage, location: default(storage, map_location.get(location, location))
    if isinstance(map_location, (str, torch.device)):
        return lambda storage, location: default(storage, str(map_location))

    def restore(storage, location):
        result = map_location(storage, location)
        return default(storage, location) if result is None else result
    return restore


class _Pending:
    __slots__ = ("target", "tensor", "host", "request", "nbytes")

    def __init__(self, target, tensor, host, request, nbytes):
        self.target, self.tensor, self.host, self.request, self.nbytes = target, tensor, host, request, nbytes

    def finish(self):
        self.request.wait()
        if self.host is not None:  # Python I/O to CUDA: the pinned copy goes up now
            self.tensor.copy_(self.host)
            self.host = None
        return untyped(self.tensor)


class StorageLoader:
    """Materializes storages of a file on the device map_location says.

    `layout` tells where they lie (an :class:`Archive`, or a safetensors
    header): ``file``, ``storage_keys()`` (in the order they will be asked
    for: the read-ahead's) and ``locate(key)`` -> (offset, size)."""

    def __init__(self, layout, map_location, report, readahead_bytes=512 << 20):
        torch = _torch()
        self.torch = torch
        self.layout = layout
        self.file = layout.file
        self.map_location = map_location
        self.restore_location = restore_location_for(map_location)
        self.report = report
        self.readahead_bytes = readahead_bytes
        self.order = layout.storage_keys()
        self.index = {k: i for i, k in enumerate(self.order)}
        self.pending = {}
        self.in_flight = 0
        self.next_ahead = 0  # index in self.order of the next storage to read ahead
        self.done = set()

    def target_for(self, location):
        """'cpu', 'cuda:N' (validated as torch does), or None: read to the CPU
        and let torch's restore_location place it (callables, other devices)."""
        m = self.map_location
        torch = self.torch
        if m is None:
            where = location
        elif isinstance(m, dict):
            where = m.get(location, location)
        elif isinstance(m, str):
            where = m
        elif isinstance(m, torch.device):
            where = str(m)
        else:
            return None
        if where == "cpu":
            return "cpu"
        if isinstance(where, str) and where.startswith("cuda"):
            index = torch.serialization.validate_cuda_device(where)
            return f"cuda:{index}"
        return None

    def load(self, key, nbytes, location):
        """The UntypedStorage of record data/<key> (``nbytes``) where it belongs."""
        target = self.target_for(location)
        read_target = target or "cpu"
        p = self.pending.pop(key, None)
        if p is not None:
            self.in_flight -= p.nbytes
            if p.target != read_target or p.nbytes != nbytes:
                p.finish()
                p = None
        if p is None:
            p = self._start(key, nbytes, read_target)
        self.done.add(key)
        self.report.storages += 1
        self.report.storage_bytes += nbytes
        self._read_ahead(key, read_target)
        with self.report.stage("read"):
            storage = p.finish()
        if target is None:
            storage = self.restore_location(storage, location)
        return storage

    def _start(self, key, nbytes, target):
        torch = self.torch
        offset, size = self.layout.locate(key)
        if size < nbytes:
            raise FormatError(f"record data/{key} holds {size} bytes, the storage {nbytes}")
        host = None
        if target == "cpu":
            tensor = torch.empty(nbytes, dtype=torch.uint8)
            segment = _io.Segment(tensor.data_ptr(), nbytes, offset, -1)
            stream = 0
        else:
            device = torch.device(target)
            with torch.cuda.device(device):
                tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
                stream = torch.cuda.current_stream(device).cuda_stream
            if self.file.supports_device:
                segment = _io.Segment(tensor.data_ptr(), nbytes, offset, device.index)
            else:
                host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                segment = _io.Segment(host.data_ptr(), nbytes, offset, -1)
            self.report.device_bytes += nbytes
        request = self.file.read([segment], stream) if nbytes else _io.Request(lambda: {})
        self.report.bytes_read += nbytes
        return _Pending(target, tensor, host, request, nbytes)

    def _read_ahead(self, key, target):
        i = self.index.get(key)
        if i is None:
            return
        j = max(self.next_ahead, i + 1)
        while j < len(self.order) and self.in_flight < self.readahead_bytes:
            k = self.order[j]
            if k not in self.pending and k not in self.done:
                size = self.layout.locate(k)[1]
                try:
                    p = self._start(k, size, target)
                except (MemoryError, RuntimeError):
                    break  # out of memory for read-ahead: read on demand
                self.pending[k] = p
                self.in_flight += size
            j += 1
        self.next_ahead = j

    def close(self):
        """Waits for read-ahead nobody asked for (the memory it fills is ours)."""
        for p in self.pending.values():
            try:
                p.request.wait()
            except (OSError, EOFError):
                pass
        self.pending.clear()


def io_error(e, name):
    """An OSError of a load, naming the file."""
    if isinstance(e, OSError) and e.errno:
        return OSError(e.errno, e.strerror or os.strerror(e.errno), name)
    return OSError(_errno.EIO, str(e), name)
