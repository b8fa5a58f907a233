// Inspector: read-only answers about what a volume holds, for the `spillfs
// stat / ls / du / top` tools and for the control plane of a mount
// (fs/control/control_plane.h), which routes the stat, ls and du requests of
// MOUNTPOINT/.spillfs/control here and serves MOUNTPOINT/.spillfs/stats.
//
// It reads only the index (never the data area) and knows nothing of FUSE: the
// tools run it over a volume opened read-only, the daemon over its live index
// together with the counters only the daemon knows (RuntimeStats). Every
// answer is a nlohmann::json value whose shape is documented below and is a
// contract of the tools' --json output.
//
// Definitions used throughout:
//  - logical bytes: the sum of st_size of regular files (holes included).
//  - referenced bytes: the sum of the lengths of all extents of all files;
//    a block shared by N files (dedup) counts N times.
//  - physical bytes: the bytes of the data area mapped by extents, each byte
//    counted once however many extents reference it (the union of the
//    extents' physical ranges, so a dedup blob counts once, also when files
//    reference different slices of it). Unwritten (fallocated) extents count:
//    they hold space.
//  - dedup_ratio: referenced / physical (1.0 when nothing is mapped). It is
//    exactly 1.0 without sharing, N when N files share all their blocks, and
//    is not disturbed by sparse files or partial tail blocks, which a
//    logical / physical ratio would mix in.
//
// On a live index the scans see each family at a slightly different moment
// (one RocksDB iterator per family); numbers are exact on a quiet volume.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "spillfs/common/stat_keys.h"
#include "spillfs/common/status.h"
#include "spillfs/kvindex/index.h"
#include "spillfs/kvindex/records.h"

namespace spillfs {

// A read-only view over an index. Cheap to construct; keeps a reference to
// the index (which must outlive it) and a copy of the superblock. Const and
// safe to call from several threads.
class Inspector {
 public:
  Inspector(const Index& index, const Superblock& superblock);

  // "/a/b" (relative to the volume root; "" and "/" are the root; "." and
  // ".." are understood, repeated slashes ignored) -> inode number. The last
  // component is not followed when it is a symlink; a symlink in the middle
  // is followed when its target is relative, and is ENOTDIR otherwise (an
  // absolute target names a path outside the volume). Errors: ENOENT,
  // ENOTDIR, ELOOP, with the path in the message.
  Result<InodeNumber> ResolvePath(std::string_view path) const;

  // Volume-wide numbers: an object with every key of kStatKeys
  // (spillfs/common/stat_keys.h, where each is explained): uuid (string),
  // the superblock's settings, space (used + free == capacity) and contents
  // counted in the index, and the daemon's counters (RuntimeStats), which are
  // 0 where the volume is not mounted. dedup_ratio and the *_seconds keys are doubles; checksums,
  // dedup, mounted and data_sync_failed booleans; data_sync_error a string
  // or null.
  Result<nlohmann::json> Stat(const RuntimeStats& runtime) const;
  // The superblock's settings alone (uuid, format_version, block_size,
  // checksums, dedup), as Stat gives them: no scan of the index. A client of
  // the direct path opens with these; Stat reads every inode and extent.
  nlohmann::json Volume() const;

  // The extents of one inode in file order: a list of
  //   {file_offset, physical_offset, length, checksum, shared, unwritten,
  //    blob_id}
  // checksum: XXH3-64 (hex, 16 digits) over the record's per-block checksums
  // (each as 4 little-endian bytes); null when the volume keeps none.
  // shared: the number of extents in the volume with the same non-zero
  // blob_id (1 when blob_id is 0).
  Result<nlohmann::json> Extents(InodeNumber ino) const;

  struct LsOptions {
    bool long_format = false;  // add atime/ctime/btime, generation, flags, ...
    bool extents = false;      // add "extents" (as Extents()) to each object
    bool directory = false;    // list directories themselves, not their entries
  };
  // Like ls(1): each path that names a directory stands for its entries
  // (sorted by name, "." and ".." left out) unless options.directory; other
  // paths stand for themselves. Returns a list of objects with
  //   path (volume path), name, ino, type ("file", "dir", "symlink", "fifo",
  //   "socket", "chardev", "blockdev"), mode (st_mode, type bits included),
  //   size, nlink, uid, gid, mtime_ns, mtime (UTC, RFC 3339 with ns),
  //   allocated_bytes, and target (symlinks only);
  // with long_format also atime_ns, ctime_ns, btime_ns, generation, flags,
  //   ephemeral (bool), rdev;
  // with extents also extents (a list as Extents()).
  // Fails on the first path that does not resolve.
  Result<nlohmann::json> Ls(const std::vector<std::string>& paths, const LsOptions& options) const;
  Result<nlohmann::json> Ls(const std::vector<std::string>& paths, bool long_format, bool extents) const {
    return Ls(paths, LsOptions{.long_format = long_format, .extents = extents});
  }

  // Usage of the tree at `path` (a file or a directory, recursively):
  //   {path, logical_bytes, referenced_bytes, physical_bytes, files,
  //    directories, symlinks, special_files}
  // Hard-linked inodes count once; physical bytes are the union of the
  // tree's extents (shared bytes once). A directory counts itself.
  Result<nlohmann::json> Du(std::string_view path) const;

 private:
  Result<std::unordered_map<uint64_t, uint64_t>> BlobReferences() const;

  const Index& index_;
  const Superblock superblock_;
};

// Prometheus text exposition of a Stat() object: every numeric (and boolean,
// as 0/1) key becomes `spillfs_<key> <value>` with # HELP and # TYPE lines
// (counter for the monotonic counters, gauge otherwise); nested objects are
// flattened with '_'; the uuid becomes `spillfs_info{uuid="..."} 1`.
std::string PrometheusText(const nlohmann::json& stat);

// "file", "dir", "symlink", ... for the S_IFMT bits of `mode`.
const char* FileTypeName(uint32_t mode);

}  // namespace spillfs
