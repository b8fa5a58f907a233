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

// A deduplicated run of blocks, shared by every extent whose blob_id is its
// physical offset. Freed when the last such extent goes.
struct BlobRecord {
  std::string hash;  // 16 bytes, XXH3-128 of the contents
  uint64_t length = 0;
  uint64_t refs = 0;  // extent records that name this blob
  // The blob's block checksums, as its extents carry them, so that the dedup
  // control op can map the blob into a file without reading it. Empty in
  // records written before they were kept (the op then reads the blob once)
  // and on volumes without checksums. Encoded after the fields above only
  // when present: older decoders ignore them, older records decode as before.
  std::vector<uint32_t> block_checksums;

  std::string Encode() const;
  static Result<BlobRecord> Decode(std::string_view bytes);
  bool operator==(const BlobRecord&) const = default;
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
