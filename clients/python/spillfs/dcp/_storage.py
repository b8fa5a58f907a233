"""The DCP storage writer and reader: :class:`SpillWriter`, :class:`SpillReader`.

A ``.distcp`` file of DCP's ``FileSystemWriter`` (serialization format
``TORCH_SAVE``) is the concatenation of its write items: each BYTE_IO item's
bytes, then one ``torch.save`` archive per tensor item; ``.metadata`` records
each item's (file, offset, length), and ``FileSystemReader`` reads an item
with ``torch.load`` of that slice of the file. :class:`SpillWriter` writes the
same files, but builds each one as a whole with :mod:`spillfs.checkpoint`'s
writer by offsets (as :mod:`spillfs.safetensors` does for its format):

* each tensor's archive is :func:`spillfs.save`'s archive of that tensor
  (storages of 256 KiB or more at 256 KiB-aligned offsets inside it), and an
  archive with such a storage starts at a 256 KiB-aligned offset of the file,
  so its units are units of the volume: a tensor saved unchanged since the
  previous checkpoint has the same units at unit-aligned places and the
  volume shares them (dedup) instead of writing them again;
* the gaps this alignment leaves between archives are holes (no blocks), and
  the item's length in ``.metadata`` is its archive's, gaps excluded.
"""

import dataclasses
import io
import os
import pickle
import queue

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import (
    FileSystemReader,
    FileSystemWriter,
    SerializationFormat,
    _StorageInfo,
)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .. import _io
from .._report import IOReport, _publish
from ..checkpoint import _reader, _serialization, _writer, _zipfile
from ..checkpoint._zipfile import BIG_ALIGN, SMALL_ALIGN, align_up

__all__ = ["SpillWriter", "SpillReader"]

# The numeric IOReport fields a save's totals add up over its files.
_SUMMED = ("file_bytes", "storages", "storage_bytes", "bytes_written", "bytes_shared", "device_bytes",
           "crc32_skipped", "dedup_requests", "units_changed_in_place")


class _DistcpFraming:
    """What a ``.distcp`` file adds around its records, for the writer by
    offsets: each archive's local headers and central directory. Offsets in
    an archive's directory are relative to the archive's start (``torch.load``
    reads the archive as a slice of the file), so they are computed with the
    records moved back by the archive's base."""

    checksums = True  # the zip records' CRC-32s are in these bytes

    def __init__(self, archives, file_size):
        self.archives = archives  # [(base, records, cd_offset relative to base)]
        self.file_size = file_size

    def pieces(self, records):
        out = []
        for base, archive, cd_offset in self.archives:
            out += [(r.offset, _zipfile.local_header_core(r)) for r in archive]
            out.append((base + cd_offset, memoryview(_central_directory(archive, base, cd_offset))))
        return out, self.file_size


def _central_directory(archive, base, cd_offset):
    for r in archive:
        r.offset -= base
    try:
        return _zipfile.central_directory(archive, cd_offset)
    finally:
        for r in archive:
            r.offset += base


def _cpu_or_cuda(tensor):
    """The item's tensor as DCP's writer saves it (its _SerialCpuLoader): detached,
    compacted where it views part of a larger storage (torch.save would save all
    of it). CUDA tensors stay on their device: spillfs's writer moves them
    GPU -> pinned -> disk itself (their archives say ``cuda:N``; DCP's readers
    load with ``map_location="cpu"``). Other devices are copied to the CPU."""
    tensor = tensor.detach()
    if tensor.device.type not in ("cpu", "cuda"):
        tensor = tensor.cpu()
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        tensor = tensor.clone()
    return tensor


def _plan_file(items, planner, storage_key):
    """The records of one ``.distcp`` file (placed), its framing, its size and
    the items' WriteResults: BYTE_IO items first, packed, then the tensors'
    archives, in the order DCP's writer puts them."""
    records, archives, results = [], [], []
    cursor = 0
    for item in items:
        if item.type != WriteItemType.BYTE_IO:
            continue
        data = planner.resolve_data(item)
        if not isinstance(data, io.BytesIO):
            raise AssertionError("Data must be io.BytesIO for BYTE_IO write items")
        payload = bytes(data.getbuffer())
        r = _zipfile.Record("", len(payload), SMALL_ALIGN, payload=payload)
        r.offset = r.data_offset = cursor
        records.append(r)
        results.append(WriteResult(index=item.index, size_in_bytes=len(payload),
                                   storage_data=_StorageInfo(storage_key, cursor, len(payload))))
        cursor += len(payload)
    storages = storage_bytes = 0
    for item in items:
        if item.type == WriteItemType.BYTE_IO:
            continue
        tensor = _cpu_or_cuda(planner.resolve_data(item))
        pkl, by_key = _serialization._pickle(tensor, pickle, _serialization.DEFAULT_PROTOCOL)
        archive, first = _serialization._records("archive", pkl, _serialization._sources(by_key), byteorder=True)
        cd_offset = _zipfile.plan(archive, first=first)
        length = cd_offset + len(_zipfile.central_directory(archive, cd_offset))  # its size needs no CRC
        unit_aligned = any(r.align >= BIG_ALIGN for r in archive)
        base = align_up(cursor, BIG_ALIGN if unit_aligned else SMALL_ALIGN)
        for r in archive:
            r.offset += base
            r.data_offset += base
        records += archive
        archives.append((base, archive, cd_offset))
        results.append(WriteResult(index=item.index, size_in_bytes=length,
                                   storage_data=_StorageInfo(storage_key, base, length)))
        storages += len(by_key)
        storage_bytes += sum(s.nbytes() for s in by_key.values())
        cursor = base + length
    return records, _DistcpFraming(archives, cursor), cursor, results, storages, storage_bytes


def _totals(reports, op, path):
    total = IOReport(op=op, path=os.fspath(path))
    for r in reports:
        for name in _SUMMED:
            setattr(total, name, getattr(total, name) + getattr(r, name))
        for name, seconds in r.seconds.items():
            total.add_seconds(name, seconds)
        for name, value in r.io_stats.items():
            total.io_stats[name] = total.io_stats.get(name, 0) + value
        total.dedup = total.dedup or r.dedup
    for name in ("backend", "io_path"):  # one value, or each one met ("native,posix")
        values = sorted({getattr(r, name) for r in reports if getattr(r, name) is not None})
        setattr(total, name, ",".join(values) if values else None)
    return total


class SpillWriter(FileSystemWriter):
    r"""SpillWriter(path, single_file_per_rank=True, sync_files=True, thread_count=1, per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False, overwrite=True, *, dedup=True, backend="auto")

    A :class:`~torch.distributed.checkpoint.FileSystemWriter` whose ``.distcp``
    files are written by spillfs's writer: for :func:`torch.distributed.checkpoint.save`
    and :func:`~torch.distributed.checkpoint.async_save` (it stages like
    ``FileSystemWriter``: a CPU copy, then the write on a thread).

    The checkpoint is DCP's format (``TORCH_SAVE``): ``FileSystemReader`` and
    :class:`SpillReader` read it. What differs is how each rank's files are
    written (see :func:`spillfs.save`):

    * every tensor item is an archive of :func:`spillfs.save` (``torch.load``
      reads it as DCP's reader does), one of storages of 256 KiB or more
      starting at a 256 KiB-aligned offset of the file (holes between);
    * the bytes go from the tensors' memory by libspillfs_client's segment
      I/O (the direct data path on a spillfs mount; CUDA tensors GPU -> pinned
      -> disk), or by ``os.pwritev`` without it. Which one is in
      :attr:`report` (``backend``: ``"native"`` / ``"posix"``; ``io_path``:
      ``"direct_path"``, ``"mount"``, ``"direct_io"``...), as for
      :func:`spillfs.save` (whose ``RuntimeWarning`` also comes, once, where a
      mount is written through the mount, not the direct path: not root);
    * on a spillfs mount, ``dedup=True`` hashes each big storage's 256 KiB
      units and the volume maps the units it already holds by reference: a
      checkpoint whose tensors are mostly unchanged since the previous one
      (another directory of the same volume) writes about the units that
      changed (:attr:`report`'s ``bytes_written`` vs ``bytes_shared``);
    * each file goes under a temporary name in the checkpoint directory,
      fsync'ed (whatever ``sync_files`` says), renamed to its ``.distcp``
      name.

    Atomicity is DCP's: ``.metadata`` is written last (by rank 0, once every
    rank's files are written, through a ``.metadata.tmp`` renamed over it),
    and a checkpoint without ``.metadata`` does not load. A crash mid-save
    leaves no ``.metadata`` for a fresh directory, some complete ``.distcp``
    files and possibly a temporary ``.__N_M.distcp.*.spillfs-tmp`` file of
    the rank that was writing (never a partial file under a ``.distcp``
    name); saving again into the directory replaces them. Saving over an
    existing checkpoint (``overwrite=True``) replaces its ``.distcp`` files
    one by one before its ``.metadata``: a crash then leaves the old
    ``.metadata`` with new files, as with ``FileSystemWriter`` — save each step
    to a new directory.

    Args:
        path: the checkpoint's directory (made if missing).
        single_file_per_rank, overwrite, cache_staged_state_dict: as for
            ``FileSystemWriter``.
        sync_files: ignored: every file is fsync'ed, and the directory.
        thread_count: files per rank (items split by size as
            ``FileSystemWriter`` does); they are written one after the other,
            each by the library's I/O threads.
        per_thread_copy_ahead: unused (the writer reads the tensors' memory).
        dedup (bool): share the units the volume holds (spillfs mounts).
        backend (str): ``"auto"``, ``"native"`` or ``"posix"`` (see :func:`spillfs.save`).

    Attributes:
        report (IOReport): totals of the latest save's files on this rank.
        reports (list[IOReport]): one per file of the latest save.

    Raises:
        ValueError: a ``serialization_format`` other than ``TORCH_SAVE``, or
            ``_extensions`` (stream transforms), which this writer does not do.
        OSError: an I/O error, naming the ``.distcp`` file (``ENOSPC``...).

    Example:
        >>> writer = SpillWriter("/mnt/spill/ckpt/step2000")
        >>> dcp.save(model.state_dict(), storage_writer=writer)
        >>> writer.report.bytes_written, writer.report.bytes_shared
    """

    def __init__(self, path, single_file_per_rank=True, sync_files=True, thread_count=1,
                 per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False, overwrite=True,
                 _extensions=None, serialization_format=SerializationFormat.TORCH_SAVE, *, dedup=True,
                 backend="auto"):
        if serialization_format != SerializationFormat.TORCH_SAVE:
            raise ValueError(f"SpillWriter writes serialization_format=TORCH_SAVE only, not {serialization_format}")
        if _extensions:
            raise ValueError("SpillWriter does not apply stream transforms (_extensions): use FileSystemWriter")
        _io.check_backend(backend)
        super().__init__(path, single_file_per_rank=single_file_per_rank, sync_files=sync_files,
                         thread_count=thread_count, per_thread_copy_ahead=per_thread_copy_ahead,
                         cache_staged_state_dict=cache_staged_state_dict, overwrite=overwrite)
        self.dedup = dedup
        self.backend = backend
        self.reports = []
        self.report = IOReport(op="save", path=os.fspath(self.path))

    def _write_data(self, planner, file_queue):
        """Writes each (path, file name, items) of `file_queue` (FileSystemWriter.write_data
        names them) as a whole; a done Future of the items' WriteResults."""
        results, reports = [], []
        opts = _writer.Options(dedup=self.dedup, crc32=_serialization._crc32_default(None))
        while True:
            try:
                path, storage_key, items = file_queue.get_nowait()
            except queue.Empty:
                break
            report = IOReport(op="save", path=os.fspath(path))
            with report.stage("total"):
                records, framing, size, file_results, report.storages, report.storage_bytes = \
                    _plan_file(items, planner, storage_key)
                _serialization.save_records(os.fspath(path), records, framing, size, opts, self.backend, report)
            reports.append(report)
            results += file_results
        self.reports = reports
        self.report = _totals(reports, "save", self.path)
        _publish(self.report)
        future = Future()
        future.set_result(results)
        return future


class _Slice:
    """Bytes [base, base + size) of an ``_io`` file, as an ``_io`` file of its own
    (an item's archive, for spillfs's reader)."""

    def __init__(self, file, base, size):
        self.file, self.base, self.size = file, base, size
        self.native, self.backend = file.native, file.backend
        self.supports_device = getattr(file, "supports_device", False)
        self.stats = file.stats
        self.path = getattr(file, "path", None)

    def pread(self, offset, length):
        length = max(0, min(length, self.size - offset))
        return self.file.pread(self.base + offset, length) if length else b""

    def read(self, segments, stream=0):
        return self.file.read([s._replace(offset=s.offset + self.base) for s in segments], stream)

    def close(self):
        pass


class SpillReader(FileSystemReader):
    r"""SpillReader(path, *, backend="auto")

    A :class:`~torch.distributed.checkpoint.FileSystemReader` that reads the
    items of DCP checkpoints (``FileSystemWriter``'s or :class:`SpillWriter`'s,
    format ``TORCH_SAVE``) through spillfs's reader: each ``.distcp`` file is
    opened once (libspillfs_client's segment I/O where present: the direct
    path on a spillfs mount; ``os.preadv`` otherwise), each tensor's storages
    are read straight into CPU memory, then narrowed and copied into the
    state_dict's tensors as ``FileSystemReader`` does. Items with stream
    transforms (``_extensions``) and archives this reader does not handle are
    read by ``FileSystemReader``'s code.

    Errors are DCP's: a missing checkpoint directory or ``.metadata`` raises
    :class:`FileNotFoundError` naming it (from
    :func:`torch.distributed.checkpoint.load`, wrapped in its
    ``CheckpointException`` where it runs collectives); a missing ``.distcp``
    file, an ``OSError`` naming that file.

    Attributes:
        report (IOReport): what the latest ``read_data`` read on this rank.

    Example:
        >>> dcp.load(state_dict, storage_reader=SpillReader("/mnt/spill/ckpt/step2000"))
    """

    def __init__(self, path, _extension_registry=None, *, backend="auto"):
        _io.check_backend(backend)
        super().__init__(path, _extension_registry=_extension_registry)
        self.backend = backend
        self.report = IOReport(op="load", path=os.fspath(self.path))

    def read_data(self, plan, planner):
        report = IOReport(op="load", path=os.fspath(self.path))
        per_file, transformed = {}, []
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            if info.transform_descriptors:
                transformed.append(item)
            else:
                per_file.setdefault(info.relative_path, []).append(item)
        with report.stage("total"):
            for relative_path, items in per_file.items():
                self._read_file(os.fspath(self.fs.concat_path(self.path, relative_path)), items, planner, report)
            if transformed:
                super().read_data(dataclasses.replace(plan, items=transformed), planner).wait()
        self.report = report
        _publish(report)
        future = Future()
        future.set_result(None)
        return future

    def _read_file(self, path, items, planner, report):
        try:
            file = _io.open_file(path, write=False, backend=self.backend)
        except OSError as e:
            raise _serialization._named(e, path) from None
        report.backend, report.io_path = ("native" if file.native else "posix"), file.backend
        try:
            for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
                info = self.storage_data[item.storage_index]
                if item.type == LoadItemType.BYTE_IO:
                    data = self._bytes(file, path, info.offset, info.length)
                    report.bytes_read += len(data)
                    planner.load_bytes(item, io.BytesIO(data))
                    continue
                tensor = self._tensor(file, path, info, report)
                tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
                target = planner.resolve_tensor(item).detach()
                if target.size() != tensor.size():
                    raise AssertionError(f"req {item.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
                target.copy_(tensor)
                planner.commit_tensor(item, target)
        finally:
            report.io_stats = dict(file.stats)
            file.close()

    @staticmethod
    def _bytes(file, path, offset, length):
        data = file.pread(offset, length)
        if len(data) != length:
            raise _reader.io_error(EOFError(f"the file ends {length - len(data)} bytes short of an item"), path)
        return data

    def _tensor(self, file, path, info, report):
        """The item's tensor, on the CPU: spillfs's reader of its archive, or
        torch.load for what that reader hands to torch (as spillfs.load does)."""
        part = IOReport(op="load", path=path)
        try:
            tensor = _serialization._load_file(_Slice(file, info.offset, info.length), path, "cpu", pickle, True,
                                               {"encoding": "utf-8"}, part)
        except _reader.Unsupported:
            part.backend = "torch"
            data = self._bytes(file, path, info.offset, info.length)
            tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        report.bytes_read += part.bytes_read
        report.storages += part.storages
        report.storage_bytes += part.storage_bytes
        for name, seconds in part.seconds.items():
            report.add_seconds(name, seconds)
        return tensor
