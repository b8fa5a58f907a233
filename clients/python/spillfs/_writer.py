"""Writing the records of a torch.save archive: to a file by offsets (native or
Python I/O), or to a file object in order.

By offsets, the file is written in two phases:

1. the big storages (256 KiB or more, at 256 KiB-aligned offsets), each from
   its start to its last whole 4 KiB block: host memory as it is, CUDA memory
   through the library's pinned pool (native) or through pinned staging
   buffers here (Python I/O, or ``crc32=True``); with dedup, only the 256 KiB
   units the volume does not hold; CRC-32s are computed meanwhile on threads;
2. once their CRCs are known (the bigs' request may still run), the *glue*:
   every other byte (local headers, small records, big storages' tails, the
   central directory), in regions that start 4 KiB-aligned and end where a
   big storage starts or at the end of file: no block of the bigs' bodies.

So every segment the native I/O gets starts at a 4 KiB boundary and is a
whole number of 4 KiB blocks long, except the one that ends the file.
"""

import bisect
import zlib

from . import _io, _zipfile
from ._zipfile import BIG_ALIGN

BLOCK = 4096
_STAGE_CHUNK = 64 << 20
_HASH_GROUP_MIN = 4 << 20  # bytes of host storages one hashing task takes at least
_NOT_SPILLFS = ("direct_io", "buffered")  # native backends off a spillfs mount: no dedup, no hashing


def _torch():
    import torch
    return torch


class Source:
    """A storage to save: its untyped storage (kept alive), where its bytes are."""

    __slots__ = ("storage", "nbytes", "ptr", "device", "crc", "crc_future", "host_copy", "stream", "needed",
                 "hashes")

    def __init__(self, storage):
        torch = _torch()
        device = storage.device
        if device.type not in ("cpu", "cuda"):
            storage = storage.cpu()  # as torch.save does (meta and other devices raise there)
            device = storage.device
        self.storage = storage
        self.nbytes = storage.nbytes()
        self.ptr = storage.data_ptr()
        self.device = -1 if device.type == "cpu" else (device.index if device.index is not None
                                                       else torch.cuda.current_device())
        self.crc = 0
        self.crc_future = None
        self.host_copy = None
        self.stream = 0
        self.needed = None  # dedup: bytearray of 0/1 per whole unit; None = write all
        self.hashes = None  # dedup: the XXH3-128 of each whole unit (array of 2 uint64 a unit)
        if self.device >= 0:
            self.stream = torch.cuda.current_stream(self.device).cuda_stream

    def byte_tensor(self):
        torch = _torch()
        t = torch.empty(0, dtype=torch.uint8, device=self.storage.device)
        return t.set_(self.storage, 0, (self.nbytes,), (1,))

    def host_bytes(self, start=0, end=None):
        """A memoryview of bytes [start, end) in host memory (CUDA: copied)."""
        end = self.nbytes if end is None else end
        if self.device < 0:
            return _io.host_view(self.ptr + start, end - start)
        if self.host_copy is None or start < self.host_copy[0] or end > self.host_copy[0] + len(self.host_copy[1]):
            data = self.byte_tensor()[start:end].cpu()
            self.host_copy = (start, memoryview(data.numpy()).cast("B"), data)
        base, view, _ = self.host_copy
        return view[start - base:end - base]

    @staticmethod
    def copy_to_host(sources):
        """Copies the bytes of CUDA `sources` into host memory (what
        host_bytes() then returns), one device-to-host copy a device: a copy a
        storage costs a synchronisation each (~25 us), and a checkpoint has
        hundreds of small ones (biases, norms) that go into the glue."""
        torch = _torch()
        by_device = {}
        for src in sources:
            if src.device >= 0 and src.host_copy is None and src.nbytes > 0:
                by_device.setdefault(src.device, []).append(src)
        for group in by_device.values():
            flat = torch.cat([src.byte_tensor() for src in group]).cpu()
            view = memoryview(flat.numpy()).cast("B")
            at = 0
            for src in group:
                src.host_copy = (0, view[at:at + src.nbytes], flat)
                at += src.nbytes

    def write_ranges(self, start, end):
        """[a, b) byte ranges within [start, end) to write: all of it, or with
        dedup the units still needed (and everything past the last whole unit)."""
        if self.needed is None:
            return [(start, end)] if end > start else []
        ranges = []
        for i, need in enumerate(self.needed):
            a, b = max(start, i * BIG_ALIGN), min(end, (i + 1) * BIG_ALIGN)
            if need and a < b:
                if ranges and ranges[-1][1] == a:
                    ranges[-1] = (ranges[-1][0], b)
                else:
                    ranges.append((a, b))
        tail = max(start, len(self.needed) * BIG_ALIGN)
        if tail < end:
            if ranges and ranges[-1][1] == tail:
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((tail, end))
        return ranges


class Options:
    """What the caller asked: dedup, crc32 (True / False / None), the staging chunk."""

    def __init__(self, dedup=True, crc32=None, stage_chunk=_STAGE_CHUNK):
        self.dedup = dedup
        self.crc32 = crc32
        self.stage_chunk = stage_chunk
        self.stage_buffers = None

    def wants_crc(self, source, native):
        """A real CRC for this storage? (None: wherever its bytes are in host
        memory here anyway, i.e. not CUDA storages the native I/O moves.)"""
        if self.crc32 is not None:
            return self.crc32
        return source.device < 0 or not native


def _payload_bytes(record):
    p = record.payload
    return p.host_bytes() if isinstance(p, Source) else memoryview(p)


def _crc_of_small(record, opts, report):
    """Small records are copied into host memory for the glue anyway."""
    if opts.crc32 is False:
        report.crc32_skipped += 1
        return 0
    return zlib.crc32(_payload_bytes(record))


class _InFlight:
    """Requests and CRC futures under way. Nothing may outlive the save (they
    read the tensors' memory and write the file's descriptor): on an error
    every one is waited for before the error goes on."""

    def __init__(self):
        self.items = []

    def add(self, item):
        self.items.append(item)
        return item

    def wait_all(self):
        """Waits for every item; raises the first error after all are done."""
        error = None
        items, self.items = self.items, []
        for item in items:
            try:
                item.wait() if hasattr(item, "wait") else item.result()
            except BaseException as e:  # noqa: B902 - re-raised below, after the others
                error = error or e
        if error is not None:
            raise error

    def drain(self):
        try:
            self.wait_all()
        except BaseException:  # noqa: B902 - the caller's error is the one to report
            pass


def write_by_offsets(file, records, cd_records, cd_offset, opts, report):
    """Writes the planned `records` (and the central directory of
    `cd_records` at `cd_offset`) into `file` (an ``_io`` file); returns the
    file size. Every I/O and CRC it starts is over when it returns or raises."""
    inflight = _InFlight()
    try:
        return _write_by_offsets(file, records, cd_records, cd_offset, opts, report, inflight)
    except BaseException:
        inflight.drain()
        raise


def _write_by_offsets(file, records, cd_records, cd_offset, opts, report, inflight):
    pool = _io.crc_pool()
    bigs = sorted((r for r in records if isinstance(r.payload, Source) and r.align >= BIG_ALIGN),
                  key=lambda r: r.data_offset)
    if opts.dedup and file.native and file.backend not in _NOT_SPILLFS:
        _dedup(file, [r for r in bigs if r.payload.nbytes >= BIG_ALIGN], report)
    with report.stage("write"):
        # One request per memory (host; each CUDA device with its stream), all in flight at once;
        # the CRC-32s of host storages are computed meanwhile.
        batches = {}
        staged = []
        by_units = []  # host storages whose CRC-32 comes from their units'
        for r in bigs:
            src = r.payload
            body_end = src.nbytes // BLOCK * BLOCK  # the tail goes with the glue
            want_crc = opts.wants_crc(src, file.native)
            if src.device >= 0 and (want_crc or not file.supports_device):
                staged.append((r, body_end, want_crc))
                continue
            segments = [_io.Segment(src.ptr + a, b - a, r.data_offset + a, src.device)
                        for a, b in src.write_ranges(0, body_end)]
            batches.setdefault((src.device, src.stream), []).extend(segments)
            report.bytes_written += sum(s.length for s in segments)
            if src.device >= 0:
                report.device_bytes += sum(s.length for s in segments)
            if want_crc and src.hashes is not None and src.device < 0:
                by_units.append(src)
            elif want_crc:
                src.crc_future = inflight.add(_zipfile.crc32_parallel(src.host_bytes(), pool))
            else:
                report.crc32_skipped += 1
        for (_, stream), segments in batches.items():
            if segments:
                inflight.add(file.write(segments, stream))
        _start_unit_crcs(by_units, pool, inflight)
        for r, body_end, want_crc in staged:
            src = r.payload
            src.crc = _stage_device(file, src, r.data_offset, body_end, want_crc, opts, report, inflight)
    # The glue goes out while the bigs' request may still run: its blocks are
    # none of theirs.
    with report.stage("crc"):
        Source.copy_to_host([r.payload for r in records
                             if isinstance(r.payload, Source) and not r.align >= BIG_ALIGN])
        for r in bigs:
            if r.payload.crc_future is not None:
                r.payload.crc = r.payload.crc_future.result()
                r.payload.crc_future = None
            r.crc = r.payload.crc
        for r in records:
            if not (isinstance(r.payload, Source) and r.align >= BIG_ALIGN):
                r.crc = _crc_of_small(r, opts, report)
    cd = _zipfile.central_directory(cd_records, cd_offset)
    file_size = cd_offset + len(cd)
    with report.stage("write"):
        glue = _glue_regions(records, bigs, cd, cd_offset, file_size)
        segments = [_io.Segment(_addr(buf), len(buf), start, -1) for start, buf in glue]
        inflight.add(file.write(segments))
        inflight.wait_all()  # the bigs' requests too
        report.bytes_written += sum(len(buf) for _, buf in glue)
    return file_size


def _hash_all(sources):
    """The unit hashes of each source (an array of 2 uint64 a unit), host
    ones on the CRC pool's threads (the library drops the GIL), in groups of
    about equal bytes; CUDA ones here, one call (one synchronisation) for
    those of each device and stream."""
    out = [None] * len(sources)
    host = [i for i, s in enumerate(sources) if s.device < 0]
    on_gpu = {}
    for i, s in enumerate(sources):
        if s.device >= 0:
            on_gpu.setdefault((s.device, s.stream), []).append(i)
    for (device, stream), group in on_gpu.items():
        hashes = _io.hash_units_many([(sources[i].ptr, sources[i].nbytes) for i in group], device, stream)
        for i, h in zip(group, hashes):
            out[i] = h
    total = sum(sources[i].nbytes for i in host)
    workers = _io.crc_pool()._max_workers
    if total < 8 * _HASH_GROUP_MIN or workers < 2:
        for i in host:
            out[i] = _io.hash_units(sources[i].ptr, sources[i].nbytes, -1)
        return out
    groups, group, size = [], [], 0
    per_group = max(_HASH_GROUP_MIN, total // (2 * workers))
    for i in host:
        group.append(i)
        size += sources[i].nbytes
        if size >= per_group:
            groups.append(group)
            group, size = [], 0
    if group:
        groups.append(group)

    def run(group):
        return [(i, _io.hash_units(sources[i].ptr, sources[i].nbytes, -1)) for i in group]
    futures = [_io.crc_pool().submit(run, g) for g in groups]
    error = None
    for f in futures:  # every one waited for: they read the tensors' memory
        try:
            for i, hashes in f.result():
                out[i] = hashes
        except BaseException as e:  # noqa: B902 - raised once all are done
            error = error or e
    if error is not None:
        raise error
    return out


def _dedup(file, bigs, report):
    """Hashes the whole 256 KiB units of every big storage, then asks the
    volume in ONE request (whatever the number of storages) which units it
    lacks; the others are mapped into the file by reference. Sets each
    source's `needed`."""
    import array
    if not bigs:
        return
    sources = [r.payload for r in bigs]
    with report.stage("hash"):
        hashes = _hash_all(sources)
    offsets, all_hashes = array.array("Q"), array.array("Q")
    for r, h in zip(bigs, hashes):
        offsets.extend(range(r.data_offset, r.data_offset + len(h) // 2 * BIG_ALIGN, BIG_ALIGN))
        all_hashes.extend(h)
    before = getattr(file, "dedup_requests", 0)
    with report.stage("dedup"):
        needed = file.dedup_units(offsets, all_hashes)
    if needed is None:  # not a spillfs mount (or no dedup there)
        return
    report.dedup = True
    report.dedup_requests += getattr(file, "dedup_requests", before + 1) - before
    report.bytes_shared += (len(needed) - sum(needed)) * BIG_ALIGN
    at = 0
    for src, h in zip(sources, hashes):
        n = len(h) // 2
        src.needed = needed[at:at + n]
        src.hashes = h
        at += n


# CRC-32s of 256 KiB units by their XXH3-128 (as one int), of the units this
# process saved with dedup lately: a storage saved again mostly unchanged
# gets its CRC-32 from its units' (combined, four table lookups a unit)
# without reading its bytes, as the volume shares them by the same hash.
# Bounded: cleared when it would pass _UNIT_CRC_LIMIT units (~100 bytes each).
_unit_crcs = {}
_UNIT_CRC_LIMIT = 1 << 18  # 64 GiB of units
_UNIT_CRC_TASK = 128  # units a CRC task computes at most (32 MiB)


def _unit_key(hashes, i):
    return hashes[2 * i] | (hashes[2 * i + 1] << 64)


def _crc_units(view, hashes, units):
    """CRC-32 of each of `units` (unit indices) of `view`; each kept in _unit_crcs."""
    out = []
    for i in units:
        crc = zlib.crc32(view[i * BIG_ALIGN:(i + 1) * BIG_ALIGN])
        _unit_crcs[_unit_key(hashes, i)] = crc
        out.append(crc)
    return out


class _UnitCrc:
    """The CRC-32 of a host storage from those of its whole units (kept ones,
    or computed on the pool) and of its tail; a future-like with result()."""

    def __init__(self, src, crcs):
        self.src = src
        self.crcs = crcs  # per unit: an int, or (future, index in its result)
        self.value = None

    def result(self):
        if self.value is None:
            combine = _zipfile.crc32_combiner(BIG_ALIGN)
            crc, error = 0, None
            for c in self.crcs:
                if isinstance(c, tuple):
                    try:
                        c = c[0].result()[c[1]]
                    except BaseException as e:  # noqa: B902 - raised once all are done
                        error = error or e
                        continue
                crc = combine(crc, c)
            if error is not None:
                raise error
            whole = len(self.crcs) * BIG_ALIGN
            if whole < self.src.nbytes:
                crc = zlib.crc32(self.src.host_bytes(whole), crc)
            self.value = crc
        return self.value


def _start_unit_crcs(sources, pool, inflight):
    """Starts the CRC-32s of host `sources` that have unit hashes: the units'
    kept CRC-32s, the others' computed on `pool` in tasks of up to
    _UNIT_CRC_TASK units. Sets each source's crc_future."""
    if len(_unit_crcs) + sum(len(s.hashes) // 2 for s in sources) > _UNIT_CRC_LIMIT:
        _unit_crcs.clear()
    task = []  # (src, unit) of the task being gathered

    def submit():
        # one task per source's run of missing units, but several sources' runs in one pool call
        jobs = {}
        for src, i in task:
            jobs.setdefault(id(src), (src, []))[1].append(i)
        work = [(src.host_bytes(), src.hashes, units) for src, units in jobs.values()]
        future = inflight.add(pool.submit(lambda: [c for v, h, u in work for c in _crc_units(v, h, u)]))
        for k, (src, i) in enumerate(task):
            src.crc_future.crcs[i] = (future, k)
        task.clear()

    for src in sources:
        n = len(src.hashes) // 2
        crcs = [_unit_crcs.get(_unit_key(src.hashes, i)) for i in range(n)]
        src.crc_future = _UnitCrc(src, crcs)
        for i in range(n):
            if crcs[i] is None:
                task.append((src, i))
                if len(task) >= _UNIT_CRC_TASK:
                    submit()
    if task:
        submit()


def _addr(buf):
    import ctypes
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else 0


def _glue_regions(records, bigs, cd, cd_offset, file_size):
    """[(offset, bytearray)]: the 4 KiB blocks outside the bigs' bodies that
    hold bytes (headers, small records, tails, the central directory); the
    rest (padding, gaps) stays a hole of zeros."""
    pieces = []
    for r in records:
        pieces.append((r.offset, _zipfile.local_header_core(r)))
        if isinstance(r.payload, Source) and r.align >= BIG_ALIGN:
            body = r.payload.nbytes // BLOCK * BLOCK
            if body < r.payload.nbytes:
                pieces.append((r.data_offset + body, r.payload.host_bytes(body)))
        elif r.size:
            pieces.append((r.data_offset, _payload_bytes(r)))
    pieces.append((cd_offset, memoryview(cd)))
    pieces.sort(key=lambda p: p[0])
    # where big bodies start: blocks never extend into them
    limits = sorted(r.data_offset for r in bigs) + [file_size]
    spans = []  # [start, end) block spans, merged
    for offset, data in pieces:
        limit = limits[bisect.bisect_right(limits, offset)] if offset < file_size else file_size
        a = offset // BLOCK * BLOCK
        b = min(limit, (offset + len(data) + BLOCK - 1) // BLOCK * BLOCK)
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    regions = [(a, bytearray(b - a)) for a, b in spans]
    starts = [a for a, _ in regions]
    for offset, data in pieces:
        i = bisect.bisect_right(starts, offset) - 1
        a, buf = regions[i]
        buf[offset - a:offset - a + len(data)] = data
    return regions


def _stage_device(file, src, offset, end, want_crc, opts, report, inflight):
    """Bytes [0, end) of a CUDA storage to the file through pinned buffers of
    our own (copy of chunk i+1 while chunk i is written), the CRC-32 on the
    way (of the whole storage, tail included, where wanted)."""
    torch = _torch()
    chunk = opts.stage_chunk
    data = src.byte_tensor()
    if opts.stage_buffers is None:  # once per save (pinned allocations cost milliseconds)
        opts.stage_buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    buffers = opts.stage_buffers
    pending = [None, None]
    crc = 0
    with torch.cuda.device(src.device):
        for i, start in enumerate(range(0, end, chunk)):
            n = min(chunk, end - start)
            slot = i % 2
            if pending[slot] is not None:
                pending[slot].wait()  # (also in `inflight`: waiting twice is a no-op)
            buf = buffers[slot]
            buf[:n].copy_(data[start:start + n])  # pinned: a DMA copy, synchronous here
            view = _io.host_view(buf.data_ptr(), n)
            if want_crc:
                crc = zlib.crc32(view, crc)
            segments = [_io.Segment(buf.data_ptr() + a - start, b - a, offset + a, -1)
                        for a, b in src.write_ranges(start, start + n)]
            pending[slot] = inflight.add(file.write(segments)) if segments else None
            report.bytes_written += sum(s.length for s in segments)
            report.device_bytes += n
        for p in pending:
            if p is not None:
                p.wait()
    if not want_crc:
        report.crc32_skipped += 1
        return 0
    if end < src.nbytes:
        crc = zlib.crc32(src.host_bytes(end), crc)
    return crc


def write_stream(f, records, cd_records, cd_offset, opts, report):
    """Writes the planned archive into the file object `f` in offset order
    (CRCs first, from host copies: CUDA storages are copied with .cpu());
    returns the archive size."""
    position = 0
    for r in sorted(records, key=lambda r: r.offset):
        if r.offset > position:  # a gap between records
            f.write(bytes(r.offset - position))
        data = _payload_bytes(r)
        if opts.crc32 is False:
            report.crc32_skipped += 1
        else:
            r.crc = zlib.crc32(data)
        f.write(_zipfile.local_header(r))
        f.write(data)
        report.bytes_written += r.data_offset - r.offset + r.size
        position = r.data_offset + r.size
        if isinstance(r.payload, Source):
            r.payload.host_copy = None
    cd = _zipfile.central_directory(cd_records, cd_offset)
    f.write(cd)
    report.bytes_written += len(cd)
    return cd_offset + len(cd)
