"""A stand-in for libspillfs_client's segment I/O and dedup, in Python, for tests.

It takes the same ctypes arguments as the C ABI (spill_segment arrays,
byref'd request pointers, uint64/uint8 arrays) and keeps a content store of
256 KiB units: spill_file_dedup (and spill_file_dedup_units) copies units
the store holds into the file (as the volume maps them by reference) and
asks for the others; every whole aligned unit written is added to the store. So a second save of unchanged
storages writes only what changed, and the file must still read back right.
"""

import ctypes
import errno
import hashlib
import os
import struct

UNIT = 256 << 10


class FakeSegmentLib:
    def __init__(self):
        self.files = {}
        self.requests = {}
        self.store = {}  # unit hash -> bytes
        self.next_id = 1
        self.written = 0
        self.dedup_calls = 0
        self.units_asked = 0
        self.segments_seen = []

    def _id(self):
        self.next_id += 1
        return self.next_id

    @staticmethod
    def unit_hash(data):
        digest = hashlib.blake2b(data, digest_size=16).digest()
        return struct.unpack("<QQ", digest)

    def spill_file_open(self, path, flags, size_hint):
        write = flags & 2
        fd = os.open(path, (os.O_RDWR | os.O_CREAT | os.O_TRUNC) if write else os.O_RDONLY, 0o644)
        h = self._id()
        self.files[h] = fd
        return h

    def _segments(self, array, n):
        return [(array[i].ptr or 0, array[i].length, array[i].file_offset, array[i].device) for i in range(n)]

    def spill_file_write_segments(self, handle, array, n, stream, out):
        fd = self.files[handle]
        segs = self._segments(array, n)
        self.segments_seen.extend(segs)
        for ptr, length, offset, device in segs:
            assert device == -1, "the fake moves host memory only"
            data = ctypes.string_at(ptr, length) if length else b""
            os.pwrite(fd, data, offset)
            self.written += length
            first = (offset + UNIT - 1) // UNIT * UNIT
            for u in range(first, offset + length - UNIT + 1, UNIT):
                chunk = data[u - offset:u - offset + UNIT]
                self.store[self.unit_hash(chunk)] = chunk
        rid = self._id()
        self.requests[rid] = 0
        out._obj.value = rid
        return 0

    def spill_file_read_segments(self, handle, array, n, stream, out):
        fd = self.files[handle]
        for ptr, length, offset, device in self._segments(array, n):
            assert device == -1
            data = os.pread(fd, length, offset)
            if len(data) < length:
                return -errno.EIO
            ctypes.memmove(ptr, data, length)
        rid = self._id()
        self.requests[rid] = 0
        out._obj.value = rid
        return 0

    def spill_request_wait(self, request, stats):
        rid = request.value if hasattr(request, "value") else request
        return self.requests.pop(rid)

    def spill_file_sync(self, handle):
        os.fsync(self.files[handle])
        return 0

    def spill_file_close(self, handle):
        os.close(self.files.pop(handle))
        return 0

    def spill_file_truncate(self, handle, size):
        os.ftruncate(self.files[handle], size)
        return 0

    def spill_hash_units(self, ptr, length, device, stream, out):
        assert device == -1
        for i in range(length // UNIT):
            low, high = self.unit_hash(ctypes.string_at(ptr + i * UNIT, UNIT))
            out[2 * i], out[2 * i + 1] = low, high
        return 0

    def spill_file_dedup(self, handle, offset, hashes, n, needed):
        if offset % UNIT:
            return -errno.EINVAL
        return self._map_units(handle, [offset + i * UNIT for i in range(n)], hashes, needed)

    def spill_file_dedup_units(self, handle, offsets, hashes, n, needed):
        for i in range(n):
            if offsets[i] % UNIT or (i and offsets[i] <= offsets[i - 1]):
                return -errno.EINVAL
        return self._map_units(handle, [offsets[i] for i in range(n)], hashes, needed)

    def _map_units(self, handle, offsets, hashes, needed):
        """One dedup request: units the store holds are "mapped by reference" (written here)."""
        self.dedup_calls += 1
        self.units_asked += len(offsets)
        fd = self.files[handle]
        for i, at in enumerate(offsets):
            chunk = self.store.get((hashes[2 * i], hashes[2 * i + 1]))
            if chunk is None:
                needed[i] = 1
            else:
                os.pwrite(fd, chunk, at)
                needed[i] = 0
        return 0

    def spill_config_set(self, key, value):
        return 0

    def spill_last_error(self):
        return b""
