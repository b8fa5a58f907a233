// Inspector: read-only answers about what a volume holds, for the `spillfs
// stat / ls / du / top` tools and for the control interface of a mount
// (MOUNTPOINT/.spillfs/control, MOUNTPOINT/.spillfs/stats).
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

#include "spillfs/kvindex/index.h"
#include "spillfs/kvindex/records.h"
#include "spillfs/common/status.h"

namespace spillfs {

// Counters only a running daemon knows. A default-constructed RuntimeStats
// (mounted == false) is what an unmounted volume reports: zeros, and free
// space read from the index's `free` family.
struct RuntimeStats {
  bool mounted = false;
  // Free space as the allocator sees it (persisted free list); when unset,
  // Stat() sums the `free` family.
  bool has_free_bytes = false;
  uint64_t free_bytes = 0;

  // Write-back RAM tier.
  uint64_t ram_tier_bytes = 0;           // dirty bytes held in host memory now
  uint64_t ram_tier_capacity_bytes = 0;  // its bound (0: no RAM tier)
  uint64_t ram_tier_hits = 0;            // reads served from the RAM tier
  uint64_t ram_tier_misses = 0;          // reads that went to the SSD
  // Writes that waited for room in the tier in vain and went to the SSD.
  uint64_t ram_tier_stalls = 0;

  // Data area I/O (bytes that reached or came from the SSD).
  uint64_t bytes_written_ssd = 0;
  uint64_t bytes_read_ssd = 0;
  // Bytes that never reached the SSD because their file was unlinked or
  // truncated while they waited in the RAM tier.
  uint64_t bytes_cancelled = 0;
  uint64_t checksum_errors = 0;
  // fdatasync calls on the data area that succeeded (before each mapping of
  // fresh data, fsync, unmount; callers that shared one count once).
  uint64_t data_syncs = 0;
  double data_sync_seconds = 0;  // spent in those syncs (and in a failed one)
  // The failed fdatasync that every later sync reports until a remount
  // (block_store.h, Flush); empty while none has failed.
  std::string data_sync_error;

  // Client-visible traffic (FUSE read/write and the direct path).
  uint64_t bytes_written = 0;  // logical bytes accepted by write()
  uint64_t bytes_read = 0;     // logical bytes returned by read()
  uint64_t writes = 0;         // write operations
  uint64_t reads = 0;          // read operations
  uint64_t queue_depth = 0;    // SSD I/Os in flight now
  // FUSE requests answered over io_uring (mount --fuse-uring) since mount.
  uint64_t fuse_ring_requests = 0;

  // The daemon's read-ahead for sequential readers (read_ahead.h).
  uint64_t read_ahead_window_bytes = 0;   // one window (0: read-ahead off, or not mounted)
  uint64_t read_ahead_windows = 0;        // windows started since mount
  uint64_t read_ahead_bytes_fetched = 0;  // read from the SSD into windows
  uint64_t read_ahead_bytes_served = 0;   // read requests answered from windows
  uint64_t read_ahead_waits = 0;          // of those, reads that waited for a window's fetch
  double read_ahead_wait_seconds = 0;     // and the time they waited

  double uptime_seconds = 0;  // since mount
};

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

  // Volume-wide numbers: an object with the keys
  //   uuid (string), format_version, block_size, checksums (bool), dedup
  //   (bool), mounted (bool),
  //   capacity_bytes, used_bytes, free_bytes (used + free == capacity),
  //   logical_bytes, referenced_bytes, physical_bytes, dedup_ratio (double),
  //   inodes, files (regular), directories, symlinks, special_files, orphans,
  //   extents, index_bytes,
  //   ram_tier_bytes, ram_tier_capacity_bytes, ram_tier_hits, ram_tier_misses,
  //   ram_tier_stalls,
  //   bytes_written_ssd, bytes_read_ssd, bytes_cancelled, checksum_errors, data_syncs,
  //   data_sync_seconds (double), data_sync_failed (bool), data_sync_error
  //   (string or null),
  //   bytes_written, bytes_read, writes, reads, queue_depth, fuse_ring_requests,
  //   read_ahead_window_bytes, read_ahead_windows, read_ahead_bytes_fetched,
  //   read_ahead_bytes_served, read_ahead_waits, read_ahead_wait_seconds (double),
  //   uptime_seconds (double).
  // The daemon's counters (RuntimeStats) are 0 where the volume is not mounted.
  Result<nlohmann::json> Stat(const RuntimeStats& runtime) const;

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

  // The control interface in one call: parses `request` (JSON text), runs it
  // and returns the reply text, {"ok":true,"result":...} or
  // {"ok":false,"errno":N,"error":"message"}. Requests:
  //   {"op":"stat"}
  //   {"op":"ls","paths":[...],"long":bool,"extents":bool,"directory":bool}
  //   {"op":"du","path":"/rel"}
  // (booleans are optional and default to false).
  std::string HandleControl(std::string_view request, const RuntimeStats& runtime) const;

  // The reply objects of the control interface.
  static nlohmann::json OkReply(nlohmann::json result);
  static nlohmann::json ErrorReply(const Status& status);

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
