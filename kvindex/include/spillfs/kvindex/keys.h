// Key layout of the spillfs index (one RocksDB column family per kind).
//
//   inode   ino                      -> InodeRecord
//   dirent  parent ino + name        -> DirentRecord
//   extent  ino + file offset        -> ExtentRecord
//   free    physical offset          -> varint length (free-space extents)
//   orphan  ino                      -> "" (unlinked while open)
//   xattr   ino + name               -> raw value
//   blob    'h' + XXH3-128 hash      -> BlobUnitRef: the blob's physical offset (8 bytes BE),
//                                       and the unit within it where not the first (8 more)
//           'p' + physical offset    -> BlobRecord: one unit's whole (hash, length, refcount,
//                                       checksums), or a head (units, length, refcount)
//           'd' + physical offset    -> a head's content (unit hashes, block checksums)
//   meta    name                     -> volume-wide values (superblock, next_ino, ...)
//
// Integers are 8-byte big-endian so bytewise order is numeric order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace spillfs::keys {

std::string Ino(uint64_t ino);                               // inode, orphan, prefixes
std::string Dirent(uint64_t parent, std::string_view name);  // parent + name
std::string Extent(uint64_t ino, uint64_t file_offset);
std::string Free(uint64_t physical);
std::string Xattr(uint64_t ino, std::string_view name);
std::string BlobByHash(std::string_view hash);
std::string BlobByPhysical(uint64_t physical);
std::string BlobContent(uint64_t physical);  // of a blob of several units

// Splits keys back; the caller has checked the key length (>= 8 or == 16).
uint64_t DecodeIno(std::string_view key);
std::string_view DirentName(std::string_view key);
uint64_t ExtentOffset(std::string_view key);

// Meta keys.
inline constexpr std::string_view kSuperblock = "superblock";
inline constexpr std::string_view kNextIno = "next_ino";
inline constexpr std::string_view kNextGeneration = "next_generation";
// Present while the volume is not mounted after a clean unmount.
inline constexpr std::string_view kCleanUnmount = "clean_unmount";

}  // namespace spillfs::keys
