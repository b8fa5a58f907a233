"""The zip container of torch.save files, laid out, written and read here.

What torch's readers need (PyTorchStreamReader of torch 1.13 and 2.x, both on
miniz): every record *stored* (no compression), under one top folder (the
archive name, taken from the first central directory entry), found through
the central directory, its data after its local header (30 bytes, the name,
the extra field). Like torch's writer, records are aligned by padding in the
local header's extra field (tag ``"FB"``; zeros here, where torch writes
``Z``, so that a writer by offsets leaves whole blocks of it as holes); and like it, a
ZIP64 end of central directory record and locator are always written, ZIP64
extra fields wherever a size or an offset does not fit 32 bits.

The layout here differs from torch's in two ways readers do not see:

* storages of :data:`BIG_ALIGN` (256 KiB) or more start at 256 KiB-aligned
  offsets (the volume's dedup unit), small records at 64-byte ones;
* where a big storage's padding exceeds what an extra field holds (64 KiB),
  small records fill the space first, and what is left stays a gap before the
  local header (bytes of no record, zeros, a hole where a whole 4 KiB block),
  which zip readers skip as they go by the central directory.

Local headers carry the real CRC-32 and sizes (no data descriptors); a CRC of
0 is written only where the caller has none (see ``spillfs.save``'s
``crc32``).
"""

import ctypes
import ctypes.util
import struct
import zlib

SMALL_ALIGN = 64
BIG_ALIGN = 256 << 10
LOCAL_HEADER = 30
_U16, _U32 = 0xFFFF, 0xFFFFFFFF
_PAD_TAG = 0x4246          # "FB": torch's padding record in the extra field
_MAX_PAD = 0xFFFF - 20     # room for padding in an extra field beside a ZIP64 one
_DOS_DATE = (1 << 5) | 1   # 1980-01-01
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<4sHHHHIIH")
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_LOCATOR = struct.Struct("<4sIQI")


class FormatError(RuntimeError):
    """The bytes are not a zip archive torch can read (truncated, corrupt)."""


def align_up(value, alignment):
    return (value + alignment - 1) // alignment * alignment


class Record:
    """One file of the archive: ``name`` (bytes, with the archive folder),
    ``size`` bytes at ``data_offset``, its local header at ``offset``."""

    __slots__ = ("name", "size", "align", "offset", "data_offset", "pad", "crc", "payload")

    def __init__(self, name, size, align=SMALL_ALIGN, payload=None):
        self.name = name if isinstance(name, bytes) else name.encode()
        self.size = size
        self.align = align
        self.offset = self.data_offset = self.pad = None
        self.crc = 0
        self.payload = payload  # what the caller moves to data_offset (bytes, a storage...)

    @property
    def zip64(self):
        return self.size >= _U32

    def header_min(self):
        return LOCAL_HEADER + len(self.name) + (20 if self.zip64 else 0)

    def header_end(self):
        return self.data_offset

    def __repr__(self):
        return f"Record({self.name!r}, size={self.size}, offset={self.offset}, data_offset={self.data_offset})"


def _placement(record, cursor):
    """(header offset, data offset, padding) of `record` placed at or after `cursor`."""
    hmin = record.header_min()
    data = align_up(cursor + hmin, record.align)
    pad = data - cursor - hmin
    if 0 < pad < 4:  # an extra field has a 4-byte header: no room, go one alignment further
        data += record.align
        pad += record.align
    if pad <= _MAX_PAD:
        return cursor, data, pad
    return data - hmin, data, 0  # a gap of zeros before the header


def _assign(record, cursor):
    record.offset, record.data_offset, record.pad = _placement(record, cursor)
    return record.data_offset + record.size


def plan(records, first=None):
    """Gives each record its offsets; returns where the central directory starts.

    Records of alignment BIG_ALIGN are laid out in order; small ones fill the
    space their padding would take, first fit, the rest follow the last big
    one. `first` (a record) is put at offset 0 (data.pkl, as torch does)."""
    smalls = [r for r in records if r.align < BIG_ALIGN and r is not first]
    bigs = [r for r in records if r.align >= BIG_ALIGN and r is not first]
    cursor = _assign(first, 0) if first is not None else 0
    for big in bigs:
        target = _placement(big, cursor)[1]
        i = 0
        while i < len(smalls) and target - cursor > big.header_min() + SMALL_ALIGN:
            small = smalls[i]
            header, data, _ = _placement(small, cursor)
            end = data + small.size
            if header == cursor and _placement(big, end)[1] == target:
                cursor = _assign(small, cursor)
                del smalls[i]
            else:
                i += 1
        cursor = _assign(big, cursor)
    for small in smalls:
        cursor = _assign(small, cursor)
    return cursor


def local_header_core(record):
    """The local header of a placed record up to its padding's bytes (zeros,
    which a positional writer may leave as a hole)."""
    extra = b""
    size32 = record.size
    if record.zip64:
        extra = struct.pack("<HHQQ", 1, 16, record.size, record.size)
        size32 = _U32
    if record.pad:
        extra += struct.pack("<HH", _PAD_TAG, record.pad - 4)
    version = 45 if record.zip64 else 20
    head = _LOCAL.pack(b"PK\x03\x04", version, 0, 0, 0, _DOS_DATE, record.crc & _U32, size32, size32,
                       len(record.name), len(extra) + max(record.pad - 4, 0))
    return head + record.name + extra


def local_header(record):
    """The local header of a placed record, padding included (ending at its data offset)."""
    return local_header_core(record) + bytes(max(record.pad - 4, 0))


class Framing:
    """What a zip archive adds around its records, for a writer by offsets:
    each record's local header and the central directory (of `cd_records`,
    in that order, at `cd_offset`). Another container gives the writer an
    object with the same two members."""

    checksums = True  # the records' CRC-32s are part of these bytes

    def __init__(self, cd_records, cd_offset):
        self.cd_records = cd_records
        self.cd_offset = cd_offset

    def pieces(self, records):
        """[(offset, bytes)] of the framing of the placed `records` (their
        CRC-32s known), and the file size."""
        cd = central_directory(self.cd_records, self.cd_offset)
        out = [(r.offset, local_header_core(r)) for r in records]
        out.append((self.cd_offset, memoryview(cd)))
        return out, self.cd_offset + len(cd)


def central_directory(records, cd_offset):
    """The central directory of `records` (in the order given, the first one
    naming the archive folder), the ZIP64 end records and the end record,
    to be written at `cd_offset`."""
    parts = []
    for r in records:
        fields = []
        size32 = off32 = None
        if r.zip64:
            fields += [r.size, r.size]
            size32 = _U32
        if r.offset >= _U32:
            fields.append(r.offset)
            off32 = _U32
        extra = struct.pack("<HH%dQ" % len(fields), 1, 8 * len(fields), *fields) if fields else b""
        version = 45 if fields else 20
        parts.append(_CENTRAL.pack(b"PK\x01\x02", version, version, 0, 0, 0, _DOS_DATE, r.crc & _U32,
                                   r.size if size32 is None else size32, r.size if size32 is None else size32,
                                   len(r.name), len(extra), 0, 0, 0, 0, r.offset if off32 is None else off32))
        parts.append(r.name)
        parts.append(extra)
    cd = b"".join(parts)
    n, cd_size = len(records), len(cd)
    eocd64_offset = cd_offset + cd_size
    tail = (_EOCD64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, cd_size, cd_offset)
            + _LOCATOR.pack(b"PK\x06\x07", 0, eocd64_offset, 1)
            + _EOCD.pack(b"PK\x05\x06", 0, 0, min(n, _U16), min(n, _U16), min(cd_size, _U32),
                         min(cd_offset, _U32), 0))
    return cd + tail


class Entry:
    """A central directory entry as read: name, local header offset, size, CRC, method."""
    __slots__ = ("name", "offset", "size", "compressed_size", "crc", "method")

    def __init__(self, name, offset, size, compressed_size, crc, method):
        self.name, self.offset, self.size = name, offset, size
        self.compressed_size, self.crc, self.method = compressed_size, crc, method


def read_directory(pread, file_size):
    """The central directory of the archive of `file_size` bytes, as a list
    of :class:`Entry` in its order. `pread(offset, n)` returns up to n bytes.
    Raises :class:`FormatError` where it cannot be found or is corrupt."""
    if file_size < _EOCD.size:
        raise FormatError("failed finding central directory (file of %d bytes)" % file_size)
    tail_len = min(file_size, _EOCD.size + _U16)
    tail_start = file_size - tail_len
    tail = pread(tail_start, tail_len)
    at = tail.rfind(b"PK\x05\x06")
    while at >= 0 and (at + _EOCD.size > len(tail)
                       or at + _EOCD.size + struct.unpack_from("<H", tail, at + 20)[0] != len(tail)):
        at = tail.rfind(b"PK\x05\x06", 0, at)
    if at < 0:
        raise FormatError("failed finding central directory (truncated, or not a zip archive)")
    _, disk, cd_disk, n_disk, n, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    eocd_at = tail_start + at
    if eocd_at >= _LOCATOR.size + _EOCD64.size:
        loc = pread(eocd_at - _LOCATOR.size, _LOCATOR.size)
        if len(loc) == _LOCATOR.size and loc[:4] == b"PK\x06\x07":
            _, _, eocd64_offset, _ = _LOCATOR.unpack(loc)
            rec = pread(eocd64_offset, _EOCD64.size)
            if len(rec) != _EOCD64.size or rec[:4] != b"PK\x06\x06":
                raise FormatError("corrupt ZIP64 end of central directory record")
            _, _, _, _, disk, cd_disk, n_disk, n, cd_size, cd_offset = _EOCD64.unpack(rec)
    if disk != 0 or cd_disk != 0 or n_disk != n:
        raise FormatError("multi-disk zip archives are not supported")
    if cd_offset + cd_size > eocd_at:
        raise FormatError("central directory out of the file (truncated?)")
    cd = pread(cd_offset, cd_size)
    if len(cd) != cd_size:
        raise FormatError("short read of the central directory")
    entries, pos = [], 0
    for _ in range(n):
        if pos + _CENTRAL.size > cd_size or cd[pos:pos + 4] != b"PK\x01\x02":
            raise FormatError("corrupt central directory")
        (_, _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len, comment_len, _, _, _,
         offset) = _CENTRAL.unpack_from(cd, pos)
        pos += _CENTRAL.size
        name = cd[pos:pos + name_len]
        extra = cd[pos + name_len:pos + name_len + extra_len]
        pos += name_len + extra_len + comment_len
        if pos > cd_size:
            raise FormatError("corrupt central directory")
        usize, csize, offset = _zip64_fields(extra, usize, csize, offset)
        if flags & 1:
            raise FormatError("encrypted entries are not supported")
        entries.append(Entry(name.decode("utf-8", "surrogateescape"), offset, usize, csize, crc, method))
    return entries


def _zip64_fields(extra, usize, csize, offset):
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + length]
        if tag == 1:
            values = list(struct.unpack_from("<%dQ" % (len(body) // 8), body))
            try:
                if usize == _U32:
                    usize = values.pop(0)
                if csize == _U32:
                    csize = values.pop(0)
                if offset == _U32:
                    offset = values.pop(0)
            except IndexError:
                raise FormatError("corrupt ZIP64 extra field") from None
        pos += 4 + length
    return usize, csize, offset


def data_offset(pread, entry, file_size):
    """Where `entry`'s data starts (past its local header), checked against the file."""
    head = pread(entry.offset, LOCAL_HEADER)
    if len(head) != LOCAL_HEADER or head[:4] != b"PK\x03\x04":
        raise FormatError(f"corrupt local header of {entry.name}")
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    start = entry.offset + LOCAL_HEADER + name_len + extra_len
    if start + entry.compressed_size > file_size:
        raise FormatError(f"record {entry.name} ends past the end of the file (truncated?)")
    return start


# -- CRC-32 ------------------------------------------------------------------

def _load_libz():
    for name in (ctypes.util.find_library("z"), "libz.so.1"):
        if not name:
            continue
        try:
            libz = ctypes.CDLL(name)
            fn = libz.crc32_combine64
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_ulong, ctypes.c_ulong, ctypes.c_int64]
        fn.restype = ctypes.c_ulong
        return fn
    return None


_libz_combine = _load_libz()


def _gf2_times(matrix, vec):
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= matrix[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(matrix):
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


def _crc32_combine_py(crc1, crc2, len2):
    """zlib's crc32_combine (x^(8 len2) applied to crc1, then xor), in Python."""
    if len2 <= 0:
        return crc1
    op = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    op = _gf2_square(_gf2_square(op))  # four zero bits
    while len2:  # zlib's loop, its two alternating halves folded into one
        op = _gf2_square(op)  # 2^k zero bytes at the k-th bit of len2
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
    return crc1 ^ crc2


def crc32_combine(crc1, crc2, len2):
    """CRC-32 of A+B from crc32(A), crc32(B) and len(B)."""
    if _libz_combine is not None:
        return _libz_combine(crc1, crc2, len2) & _U32
    return _crc32_combine_py(crc1, crc2, len2)


_combiners = {}


def crc32_combiner(len2):
    """A function (crc1, crc2) -> crc32_combine(crc1, crc2, len2) for one
    fixed `len2`: four table lookups, no call into zlib. Its tables (made
    once per length from 33 CRCs of len2 zeros: crc32(B, c) is
    M(len(B)) c ^ crc32(B, 0), M linear) are kept for the process."""
    combine = _combiners.get(len2)
    if combine is None:
        zeros = bytes(len2)
        base = zlib.crc32(zeros)
        columns = [zlib.crc32(zeros, 1 << i) ^ base for i in range(32)]
        tables = []
        for k in range(4):
            table = [0] * 256
            for b in range(1, 256):
                low = b & -b
                table[b] = table[b ^ low] ^ columns[8 * k + low.bit_length() - 1]
            tables.append(table)
        t0, t1, t2, t3 = tables

        def combine(crc1, crc2):
            return t0[crc1 & 255] ^ t1[(crc1 >> 8) & 255] ^ t2[(crc1 >> 16) & 255] ^ t3[crc1 >> 24] ^ crc2
        _combiners[len2] = combine
    return combine


def crc32_parallel(view, pool, chunk=32 << 20):
    """zlib.crc32 of a byte memoryview, its chunks on `pool`'s threads
    (zlib releases the GIL), combined in order. Returns a future-like with
    ``result()``."""
    n = len(view)
    if pool is None or n <= chunk:
        value = zlib.crc32(view)
        return _Done(value)
    futures = [(pool.submit(zlib.crc32, view[i:i + chunk]), min(chunk, n - i)) for i in range(0, n, chunk)]
    return _Combined(futures)


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _Combined:
    def __init__(self, futures):
        self.futures = futures
        self.value = None

    def result(self):
        """The combined CRC; waits for every chunk even when one failed."""
        if self.value is None:
            crc, error = 0, None
            for future, length in self.futures:
                try:
                    crc = crc32_combine(crc, future.result(), length)
                except BaseException as e:  # noqa: B902 - raised once all are done
                    error = error or e
            if error is not None:
                raise error
            self.value = crc
        return self.value
