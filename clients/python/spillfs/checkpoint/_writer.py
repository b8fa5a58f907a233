"""Writing the records of a torch.save archive: to a file by offsets (native or
Python I/O), or to a file object in order. By offsets, the records of other
containers too (safetensors files): what the container adds around them (zip
headers and directory, a JSON header) is a *framing* (:class:`_zipfile.Framing`).

By offsets, the file is written in two phases:

1. the big storages (256 KiB or more, at 256 KiB-aligned offsets), each from
   its start to its last whole 4 KiB block: host memory as it is, CUDA memory
   through the library's pinned pool (native) or through pinned staging
   buffers here (Python I/O, or ``crc32=True``); with dedup (:mod:`._dedup`),
   only the 256 KiB units the volume does not hold: those changed in place
   since this process last saved them at once, the others once the volume
   has answered about them; CRC-32s are computed meanwhile on threads;
2. once their CRCs are known (the bigs' requests, and the dedup request,
   may still run), the *glue*:
   every other byte (the framing's: local headers and the central directory;
   small records, big storages' tails), in regions that start 4 KiB-aligned and end where a
   big storage starts or at the end of file: no block of the bigs' bodies.

So every segment the native I/O gets starts at a 4 KiB boundary and is a
whole number of 4 KiB blocks long, except the one that ends the file.
"""

import bisect
import zlib

from .. import _io
from . import _dedup, _zipfile
from ._zipfile import BIG_ALIGN

BLOCK = 4096
_STAGE_CHUNK = 64 << 20
_NOT_SPILLFS = ("direct_io", "buffered")  # native backends off a spillfs mount: no dedup, no hashing


def _torch():
    import torch
    return torch


class Source:
    """A storage to save: its untyped storage (kept alive), where its bytes are."""

    __slots__ = ("storage", "begin", "nbytes", "ptr", "device", "crc", "crc_future", "host_copy", "stream",
                 "needed", "hashes", "early")

    def __init__(self, storage, streams=None, begin=0, nbytes=None):
        """`streams`: {device: the current stream's handle}, filled as met
        (one look-up a device, not one a storage). `begin`, `nbytes`: the
        bytes of the storage to save (default: all of it)."""
        torch = _torch()
        device = storage.device
        if device.type not in ("cpu", "cuda"):
            storage = storage.cpu()  # as torch.save does (meta and other devices raise there)
            device = storage.device
        self.storage = storage
        self.begin = begin
        self.nbytes = storage.nbytes() - begin if nbytes is None else nbytes
        self.ptr = storage.data_ptr() + begin
        self.device = -1 if device.type == "cpu" else (device.index if device.index is not None
                                                       else torch.cuda.current_device())
        self.crc = 0
        self.crc_future = None
        self.host_copy = None
        self.stream = 0
        self.needed = None  # dedup: bytearray of 0/1 per whole unit; None = write all
        self.hashes = None  # dedup: the XXH3-128 of each whole unit (array of 2 uint64 a unit)
        self.early = None  # dedup: bytearray of 0/1, the units written before the volume answers
        if self.device >= 0:
            streams = {} if streams is None else streams
            if self.device not in streams:
                streams[self.device] = torch.cuda.current_stream(self.device).cuda_stream
            self.stream = streams[self.device]

    def byte_tensor(self):
        torch = _torch()
        t = torch.empty(0, dtype=torch.uint8, device=self.storage.device)
        return t.set_(self.storage, self.begin, (self.nbytes,), (1,))

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

    def write_ranges(self, start, end, units=None, tail=True):
        """[a, b) byte ranges within [start, end) to write: all of it, or with
        dedup the units of `units` (a 0/1 per whole unit; default `needed`)
        and, where `tail`, everything past the last whole unit."""
        units = self.needed if units is None else units
        if units is None:
            return [(start, end)] if end > start else []
        ranges = []
        i = units.find(1, start // BIG_ALIGN)  # runs of needed units, found at C speed
        while 0 <= i and i * BIG_ALIGN < end:
            j = units.find(0, i)
            j = len(units) if j < 0 else j
            a, b = max(start, i * BIG_ALIGN), min(end, j * BIG_ALIGN)
            if a < b:
                ranges.append((a, b))
            i = units.find(1, j)
        last = max(start, len(units) * BIG_ALIGN)
        if tail and last < end:
            if ranges and ranges[-1][1] == last:
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((last, end))
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


def write_by_offsets(file, records, framing, opts, report):
    """Writes the planned `records` and their `framing`'s bytes (a
    :class:`_zipfile.Framing`, or another container's) into `file` (an
    ``_io`` file); returns the file size. Every I/O and CRC it starts is over
    when it returns or raises."""
    inflight = _InFlight()
    try:
        return _write_by_offsets(file, records, framing, opts, report, inflight)
    except BaseException:
        inflight.drain()
        raise


def _write_by_offsets(file, records, framing, opts, report, inflight):
    pool = _io.crc_pool()
    bigs = sorted((r for r in records if isinstance(r.payload, Source) and r.align >= BIG_ALIGN),
                  key=lambda r: r.data_offset)
    asked = None
    if opts.dedup and file.native and file.backend not in _NOT_SPILLFS and bigs:
        asked = _dedup.start(file, bigs, report, inflight)
    with report.stage("write"):
        # With dedup, the units changed in place go now, while the volume is asked about the others.
        staged = _write_bigs(file, bigs, opts, report, inflight, pool, dedup=asked is not None)
    glue = None
    if not staged:  # every CRC is known without the volume's answer: the glue goes beside the request
        glue = _write_glue(file, records, bigs, framing, opts, report, inflight)
    if asked is not None:
        with report.stage("dedup"):
            late = asked.finish(report)
        with report.stage("write"):
            _write_late(file, bigs, late, staged, report, inflight)
    with report.stage("write"):
        for r, body_end, want_crc in staged:
            src = r.payload
            src.crc = _stage_device(file, src, r.data_offset, body_end, want_crc, opts, report, inflight)
    if glue is None:
        glue = _write_glue(file, records, bigs, framing, opts, report, inflight)
    with report.stage("write"):
        inflight.wait_all()  # the bigs' requests and the glue's (whose buffers `glue` keeps)
    return glue[0]


def _write_glue(file, records, bigs, framing, opts, report, inflight):
    """Once the CRCs are known, starts the write of the glue; it may go while
    the bigs' requests still run, as its blocks are none of theirs. Returns
    (file size, the glue's regions: to be kept until the request is done)."""
    with report.stage("crc"):
        Source.copy_to_host([r.payload for r in records
                             if isinstance(r.payload, Source) and not r.align >= BIG_ALIGN])
        for r in bigs:
            if r.payload.crc_future is not None:
                r.payload.crc = r.payload.crc_future.result()
                r.payload.crc_future = None
            r.crc = r.payload.crc
        if framing.checksums:
            for r in records:
                if not (isinstance(r.payload, Source) and r.align >= BIG_ALIGN):
                    r.crc = _crc_of_small(r, opts, report)
    framed, file_size = framing.pieces(records)
    with report.stage("write"):
        glue = _glue_regions(records, bigs, framed, file_size)
        segments = [_io.Segment(_addr(buf), len(buf), start, -1) for start, buf in glue]
        inflight.add(file.write(segments))
        report.bytes_written += sum(len(buf) for _, buf in glue)
    return file_size, glue


def _write_bigs(file, bigs, opts, report, inflight, pool, dedup):
    """Starts the writes of the bigs' bodies (with `dedup`: the units in
    their `early` masks and what lies past their whole units), one request
    per memory (host; each CUDA device with its stream), all in flight at
    once, and their CRC-32s. Returns [(record, body end, want_crc)] of the
    CUDA storages that go through pinned buffers of ours (left to the caller:
    with dedup, once the volume has answered)."""
    batches, staged, by_units = {}, [], []
    for r in bigs:
        src = r.payload
        body_end = src.nbytes // BLOCK * BLOCK  # the tail goes with the glue
        want_crc = opts.wants_crc(src, file.native)
        if src.device >= 0 and (want_crc or not file.supports_device):
            staged.append((r, body_end, want_crc))
            continue
        ranges = src.write_ranges(0, body_end, units=src.early if dedup else None)
        _add_segments(batches, src, r.data_offset, ranges, report)
        if want_crc and src.hashes is not None and src.device < 0:
            by_units.append(src)
        elif want_crc:
            src.crc_future = inflight.add(_zipfile.crc32_parallel(src.host_bytes(), pool))
        else:
            report.crc32_skipped += 1
    _submit(file, batches, inflight)
    _dedup.start_unit_crcs(by_units, pool, inflight)
    return staged


def _write_late(file, bigs, late, staged, report, inflight):
    """Starts the writes of the units the volume turned out to lack (`late`:
    [(source, 0/1 a unit)]), but of the `staged` storages (written whole
    once the answer is in)."""
    offsets = {id(r.payload): r.data_offset for r in bigs}
    skip = {id(r.payload) for r, _, _ in staged}
    batches = {}
    for src, units in late:
        if id(src) not in skip:
            ranges = src.write_ranges(0, len(units) * BIG_ALIGN, units=units, tail=False)
            _add_segments(batches, src, offsets[id(src)], ranges, report)
    _submit(file, batches, inflight)


def _add_segments(batches, src, offset, ranges, report):
    """Segments of `src`'s byte `ranges` (at file `offset`) into `batches`."""
    segments = [_io.Segment(src.ptr + a, b - a, offset + a, src.device) for a, b in ranges]
    batches.setdefault((src.device, src.stream), []).extend(segments)
    report.bytes_written += sum(s.length for s in segments)
    if src.device >= 0:
        report.device_bytes += sum(s.length for s in segments)


def _submit(file, batches, inflight):
    for (_, stream), segments in batches.items():
        if segments:
            inflight.add(file.write(segments, stream))


def _addr(buf):
    import ctypes
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else 0


def _glue_regions(records, bigs, framed, file_size):
    """[(offset, bytearray)]: the 4 KiB blocks outside the bigs' bodies that
    hold bytes (the `framed` pieces, [(offset, bytes)]: headers, the central
    directory; small records, tails); the rest (padding, gaps) stays a hole
    of zeros."""
    pieces = list(framed)
    for r in records:
        if isinstance(r.payload, Source) and r.align >= BIG_ALIGN:
            body = r.payload.nbytes // BLOCK * BLOCK
            if body < r.payload.nbytes:
                pieces.append((r.data_offset + body, r.payload.host_bytes(body)))
        elif r.size:
            pieces.append((r.data_offset, _payload_bytes(r)))
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
