"""Checkpoint dedup for ``spillfs.save`` on a spillfs mount.

The whole 256 KiB units of every big storage are hashed (XXH3-128, the
volume's dedup hash: on the GPU for CUDA storages, on the CRC pool's
threads for host ones), and the volume is asked, in one request whatever
the number of storages, which units it already holds: those it maps into
the file by reference, the others the save writes.

The request and the writes overlap. A unit that changed in place since this
process last saved it (the same storage object, still alive, with another
hash at that unit) is new content in a training run: it is written at once,
without asking, while the request about the other units runs. A wrong guess
costs bytes written, never the file (the unit is written, not shared); a
storage this process has not saved (a process's first save, tensors loaded
or made since) is asked about unit by unit.

Also here: the CRC-32s of units kept by their hash, so a host storage saved
again mostly unchanged gets its CRC-32 without its bytes being read.
"""

import array
import operator
import zlib

from .. import _io
from . import _zipfile
from ._zipfile import BIG_ALIGN

_HASH_GROUP_MIN = 4 << 20  # bytes of host storages one hashing task takes at least

# Bounds of what this module keeps across saves, in units (~16-100 bytes each):
# cleared when a save would pass it.
_UNIT_LIMIT = 1 << 18  # 64 GiB of storages


def hash_all(sources):
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


# The unit hashes this process last saved with dedup, by storage: its
# StorageImpl's address -> (a weak reference to it, device, data pointer,
# bytes, the hashes' bytes: 16 a unit). The weak reference makes the identity
# exact: while it is held no other storage is made at that address, and a
# storage freed since shows as expired (a tensor loaded or made anew where
# one was freed is asked about, never taken for one changed in place).
_saved = {}
_saved_units = 0


def _weak_ref(storage):
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(storage)


def _changed_in_place(src):
    """A bytearray, 1 for each unit of `src` whose hash differs from the one
    this process last saved from the same storage; None where it saved none."""
    kept = _saved.get(src.storage._cdata)
    if kept is None:
        return None
    weak, device, ptr, nbytes, old = kept
    new = src.hashes.tobytes()
    if weak.expired() or (device, ptr, nbytes) != (src.device, src.ptr, src.nbytes) or len(old) != len(new):
        return None
    if old == new:
        return bytearray(len(new) // 16)
    return bytearray(old[k:k + 16] != new[k:k + 16] for k in range(0, len(new), 16))


def _remember(sources):
    global _saved_units
    units = sum(len(s.hashes) // 2 for s in sources)
    if _saved_units + units > _UNIT_LIMIT:
        _saved.clear()
        _saved_units = 0
    for s in sources:
        key = s.storage._cdata
        old = _saved.pop(key, None)
        _saved_units -= len(old[4]) // 16 if old is not None else 0
        _saved[key] = (_weak_ref(s.storage), s.device, s.ptr, s.nbytes, s.hashes.tobytes())
        _saved_units += len(s.hashes) // 2


class Asked:
    """The volume's answer under way about the units not written at once."""

    def __init__(self, file, sources, picked, future, requests_before):
        self.file = file
        self.sources = sources
        self.picked = picked  # per source: the unit indices asked about, or None for all
        self.future = future  # of file.dedup_units, or None where nothing was asked
        self.requests_before = requests_before  # the file's dedup_requests before it

    def finish(self, report):
        """Waits for the answer; sets each source's `needed` (every unit the
        save writes) and returns [(source, late)]: the units the volume lacked
        that were not written at once (a 0/1 bytearray), where any."""
        needed = self.future.result() if self.future is not None else bytearray()
        if needed is not None:
            report.dedup = True
            before = self.requests_before
            report.dedup_requests += getattr(self.file, "dedup_requests", before + 1) - before
            _remember(self.sources)
        late_out, at = [], 0
        for src, picked in zip(self.sources, self.picked):
            n = len(src.hashes) // 2
            if picked is None:  # every unit asked about
                late = bytearray(b"\x01" * n) if needed is None else needed[at:at + n]
                at += n
                src.needed = late
            else:
                late = bytearray(n)
                for k, i in enumerate(picked):
                    late[i] = 1 if needed is None else needed[at + k]
                at += len(picked)
                src.needed = bytearray(map(operator.or_, src.early, late))
            if needed is not None:
                report.bytes_shared += (n - sum(src.needed)) * BIG_ALIGN
            if 1 in late:
                late_out.append((src, late))
        return late_out


def start(file, bigs, report, inflight):
    """Hashes the whole units of the `bigs` (records of storages of 256 KiB
    or more, planned), sets each source's `hashes` and `early` (a 0/1
    bytearray: the units changed in place, to write at once) and sends the
    request about the other units on the I/O pool (its future added to
    `inflight`: it reads the hash arrays). Returns an :class:`Asked`."""
    sources = [r.payload for r in bigs]
    with report.stage("hash"):
        hashes = hash_all(sources)
    offsets, asked, picked = array.array("Q"), array.array("Q"), []
    for r, src, h in zip(bigs, sources, hashes):
        src.hashes = h
        n = len(h) // 2
        early = _changed_in_place(src)
        src.early = early if early is not None else bytearray(n)
        if early is None or 1 not in early:
            offsets.extend(range(r.data_offset, r.data_offset + n * BIG_ALIGN, BIG_ALIGN))
            asked.extend(h)
            picked.append(None)
            continue
        units = [i for i in range(n) if not early[i]]
        for i in units:
            offsets.append(r.data_offset + i * BIG_ALIGN)
            asked.extend(h[2 * i:2 * i + 2])
        picked.append(units)
        report.units_changed_in_place += n - len(units)
    before = getattr(file, "dedup_requests", 0)
    future = inflight.add(_io.io_pool().submit(file.dedup_units, offsets, asked)) if len(offsets) else None
    return Asked(file, sources, picked, future, before)


# CRC-32s of 256 KiB units by their XXH3-128 (as one int), of the units this
# process saved with dedup lately: a storage saved again mostly unchanged
# gets its CRC-32 from its units' (combined, four table lookups a unit)
# without reading its bytes, as the volume shares them by the same hash.
_unit_crcs = {}
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


def start_unit_crcs(sources, pool, inflight):
    """Starts the CRC-32s of host `sources` that have unit hashes: the units'
    kept CRC-32s, the others' computed on `pool` in tasks of up to
    _UNIT_CRC_TASK units. Sets each source's crc_future."""
    if len(_unit_crcs) + sum(len(s.hashes) // 2 for s in sources) > _UNIT_LIMIT:
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
