// The records spillfs keeps in its index, and their encodings.
//
// Every record value starts with a one-byte format version; decoders accept
// the versions they know and refuse anything else with a Corruption status,
// so a damaged or foreign index is reported, never misread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spillfs/common/status.h"

namespace spillfs {

using InodeNumber = uint64_t;
inline constexpr InodeNumber kRootInode = 1;

// Inode flags.
inline constexpr uint32_t kInodeEphemeral = 1u << 0;  // data need never be forced to disk
// A regular file created since the last sync whose data is not yet all
// durable and mapped: closed without waiting for the SSD, it is reclaimed
// whole after an unclean stop (absent, a state it had), never seen with its
// size committed and its data lost. Cleared in the batch that maps its last
// cached data, or by the next sync (docs/design.md, "Crash order").
inline constexpr uint32_t kInodeUnsettled = 1u << 1;

struct InodeRecord {
  uint32_t mode = 0;  // file type and permission bits, as st_mode
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t nlink = 0;
  uint64_t size = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  int64_t btime_ns = 0;  // creation time
  uint64_t generation = 0;
  uint32_t flags = 0;
  uint64_t rdev = 0;             // device number of character and block special files
  std::string symlink_target;    // only for symbolic links
  uint64_t allocated_bytes = 0;  // physical bytes mapped (st_blocks * 512)
  InodeNumber parent = 0;        // directories only: the directory holding it

  std::string Encode() const;
  static Result<InodeRecord> Decode(std::string_view bytes);
  bool operator==(const InodeRecord&) const = default;
};

struct DirentRecord {
  InodeNumber ino = 0;
  uint32_t type = 0;  // file type bits of st_mode (S_IFREG, S_IFDIR, ...)

  std::string Encode() const;
  static Result<DirentRecord> Decode(std::string_view bytes);
  bool operator==(const DirentRecord&) const = default;
};

// Extent flags.
inline constexpr uint32_t kExtentUnwritten = 1u << 0;  // allocated (fallocate), reads as zeros

// Maps [file_offset, file_offset + length) of one inode to the same number of
// bytes at `physical` in the data area. file_offset, physical and length are
// all multiples of the volume block size. When checksums are on, there is one
// 32-bit checksum per block.
struct ExtentRecord {
  uint64_t physical = 0;
  uint64_t length = 0;
  uint32_t flags = 0;
  uint64_t blob_id = 0;  // dedup blob this extent belongs to; 0 when not shared
  std::vector<uint32_t> block_checksums;

  bool unwritten() const { return (flags & kExtentUnwritten) != 0; }
  std::string Encode() const;
  static Result<ExtentRecord> Decode(std::string_view bytes);
  bool operator==(const ExtentRecord&) const = default;
};

// An encoded ExtentRecord parsed without decoding its checksums. A
// direct-path commit maps up to commit_bytes (256 MiB by default) in one
// record, 65,536 checksums; decoding all of them for each 4 KiB read through
// the mount held such a file to a fifth of the IOPS of one written through
// the mount. Reads decode only the checksums of the blocks they read (Slice).
struct ExtentView {
  uint64_t physical = 0;
  uint64_t length = 0;
  uint32_t flags = 0;
  uint64_t blob_id = 0;
  uint64_t checksum_count = 0;
  std::string_view checksums;  // checksum_count x 4 bytes (big endian), into the parsed bytes

  bool unwritten() const { return (flags & kExtentUnwritten) != 0; }
  static Result<ExtentView> Parse(std::string_view bytes);
  // The whole record, every checksum decoded.
  ExtentRecord Record() const;
  // The record of bytes [skip, skip + length) of this extent (block aligned,
  // within it), with the checksums of those blocks only (none if it has none).
  ExtentRecord Slice(uint64_t skip, uint64_t length, uint64_t block_size) const;
};

// Appends `block_checksums` as records hold them: 4 bytes big-endian a block.
void AppendChecksums(std::string* out, const std::vector<uint32_t>& block_checksums);

// ExtentRecord::Encode of an extent whose checksums are given encoded (4
// bytes big-endian a block, as ExtentView and a blob's content hold them): a
// blob's run mapped into a file takes its checksums as they are, not decoded
// and encoded again one by one (a 2.5 GiB checkpoint has 660,000).
std::string EncodeExtent(uint64_t physical, uint64_t length, uint32_t flags, uint64_t blob_id,
                         std::string_view checksums);

// A deduplicated run of blocks: one or more whole dedup units written
// together (a direct-path commit's run of whole units is one blob), shared by
// every extent whose blob_id is its physical offset; an extent may name any
// block-aligned part of it. Freed, whole, when the last such extent goes (a
// partly overwritten blob keeps its space until then, as btrfs keeps whole
// extents). One reference count a blob: sharing a run of units costs one
// extent record and one reference, whatever its length.
//
// A blob of one unit is one record ('p' key, version 1). A blob of several
// keeps its content (unit hashes, block checksums: ~260 bytes a unit) in a
// record of its own ('d' key), written once, so that a reference taken or
// dropped rewrites a head of a few bytes, not a megabyte of checksums.
struct BlobRecord {
  // The XXH3-128 of each of the blob's units, in order, 16 bytes each (one
  // unit's in a version 1 record). Empty in a head decoded without its
  // content (needs_content()).
  std::string hash;
  uint64_t length = 0;  // units x the dedup unit
  uint64_t refs = 0;    // extent records that name this blob
  // The blob's block checksums, as its extents carry them, so that the dedup
  // control op can map the blob into a file without reading it. Empty in
  // one-unit records written before they were kept (the op then reads the
  // blob once) and on volumes without checksums. Encoded after the fields
  // above only when present: older decoders ignore them.
  std::vector<uint32_t> block_checksums;
  // Units of a blob whose head was decoded (several units) before its
  // content: the content's unit count must agree.
  uint64_t head_units = 0;

  static constexpr size_t kHashBytes = 16;
  // Units (hashes) the record holds.
  uint64_t units() const { return hash.size() / kHashBytes; }
  std::string_view unit_hash(uint64_t unit) const {
    return std::string_view(hash).substr(unit * kHashBytes, kHashBytes);
  }
  // Whether the record is kept as a head ('p') and a content ('d') record.
  bool split() const { return units() > 1 || head_units > 1; }
  // A head decoded whose content has not been read (DecodeContent).
  bool needs_content() const { return head_units > 1 && hash.empty(); }

  // The 'p' value: the whole record for one unit (version 1), else the head
  // (version 2: units, length, refs).
  std::string Encode() const;
  // The 'd' value of a split record: unit hashes and block checksums.
  std::string EncodeContent() const;
  static Result<BlobRecord> Decode(std::string_view bytes);
  // Fills in hash and block_checksums of a head from its 'd' value.
  Status DecodeContent(std::string_view bytes);
  // The same from a parsed one; its checksums decoded only `with_checksums`.
  Status SetContent(const struct BlobContentView& view, bool with_checksums);
  bool operator==(const BlobRecord&) const = default;
};

// A blob content record ('d') parsed without decoding its checksums.
struct BlobContentView {
  std::string_view hashes;     // 16 bytes a unit
  std::string_view checksums;  // 4 bytes big-endian a block; empty on a volume without them
  static Result<BlobContentView> Parse(std::string_view bytes);
};

// Where the blob index's hash key ('h' + hash, keys.h) says a unit's content
// lies: unit `unit` of the blob at physical offset `blob`. Encoded as the
// blob's offset (8 bytes) for unit 0, as older volumes hold it, and as the
// offset and the unit number (16 bytes) for the others.
struct BlobUnitRef {
  uint64_t blob = 0;
  uint64_t unit = 0;

  std::string Encode() const;
  static Result<BlobUnitRef> Decode(std::string_view bytes);
  bool operator==(const BlobUnitRef&) const = default;
};

// What kind of backing store holds the data area.
enum class BackingKind : uint8_t { kImageFile = 1, kBlockDevice = 2 };

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint32_t kSuperblockMagic = 0x5350494c;  // "SPIL"

// Volume identity, stored both in the index (meta "superblock") and in the
// first block of the data area; mount refuses a pair whose copies differ.
struct Superblock {
  uint32_t format_version = kFormatVersion;
  std::string uuid;  // 16 raw bytes
  uint32_t block_size = 4096;
  uint64_t data_offset = 0;  // first byte of the allocatable area
  uint64_t data_size = 0;    // end of the allocatable area (size of the store)
  BackingKind backing = BackingKind::kImageFile;
  std::string device_path;  // for kBlockDevice
  int64_t created_ns = 0;
  bool checksums = true;
  bool dedup = true;

  std::string Encode() const;
  static Result<Superblock> Decode(std::string_view bytes);
  // The on-disk copy in block 0: magic + length + Encode(), zero padded.
  std::string EncodeBlock() const;
  static Result<Superblock> DecodeBlock(std::string_view block);
  std::string UuidString() const;
  bool operator==(const Superblock&) const = default;
};

}  // namespace spillfs
