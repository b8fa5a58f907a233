// The `stat` object of a volume, key by key: one table that the daemon's JSON
// (Inspector::Stat), the Prometheus text of MOUNT/.spillfs/stats and the
// tools' tables all read. A key is spelled here once: RuntimeStats holds the
// counters only a running daemon knows, and kStatKeys names every key of the
// object with its help line, its Prometheus type and, for a runtime counter,
// the RuntimeStats member that holds it.
//
// Adding a counter: a member of RuntimeStats, a row of kStatKeys, and the
// daemon's value in ControlPlane::Runtime (fs/control/control_plane.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

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

  // Data area I/O (bytes that reached or came from the SSD). Written: the
  // daemon's writes and the direct path's (bytes_written_direct, counted at
  // their commits); read: the daemon's (the direct path's reads are its
  // clients' own).
  uint64_t bytes_written_ssd = 0;
  uint64_t bytes_read_ssd = 0;
  uint64_t bytes_written_direct = 0;
  // Bytes of flushes and direct-path saves stored as references to blobs
  // already on the volume (dedup), instead of written.
  uint64_t bytes_deduplicated = 0;
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

  // The daemon's read-ahead for sequential readers (fs/cache/include/spillfs/cache/read_ahead.h).
  uint64_t read_ahead_window_bytes = 0;   // one window (0: read-ahead off, or not mounted)
  uint64_t read_ahead_windows = 0;        // windows started since mount
  uint64_t read_ahead_bytes_fetched = 0;  // read from the SSD into windows
  uint64_t read_ahead_bytes_served = 0;   // read requests answered from windows
  uint64_t read_ahead_waits = 0;          // of those, reads that waited for a window's fetch
  double read_ahead_wait_seconds = 0;     // and the time they waited

  double uptime_seconds = 0;  // since mount
};

// How a key shows in Prometheus text: not at all (a string), a gauge, or a
// counter (monotonic since mount).
enum class StatType { kText, kGauge, kCounter };

// One key of the stat object. `count`, `seconds` or `flag` points at the
// RuntimeStats member that holds a runtime counter, copied as it is; all are
// null for what Inspector::Stat works out of the index and the superblock
// (and for the runtime keys it derives: free_bytes, data_sync_failed,
// data_sync_error).
struct StatKey {
  constexpr StatKey(const char* key, StatType type, const char* help) : key(key), type(type), help(help) {}
  constexpr StatKey(const char* key, StatType type, const char* help, uint64_t RuntimeStats::*count)
      : key(key), type(type), help(help), count(count) {}
  constexpr StatKey(const char* key, StatType type, const char* help, double RuntimeStats::*seconds)
      : key(key), type(type), help(help), seconds(seconds) {}
  constexpr StatKey(const char* key, StatType type, const char* help, bool RuntimeStats::*flag)
      : key(key), type(type), help(help), flag(flag) {}

  const char* key;
  StatType type;
  const char* help;
  uint64_t RuntimeStats::*count = nullptr;
  double RuntimeStats::*seconds = nullptr;
  bool RuntimeStats::*flag = nullptr;
};

// Every key of the stat object (docs/design.md, the control protocol), in
// the order of `spillfs stat`'s explanation; JSON objects sort their keys.
inline constexpr StatKey kStatKeys[] = {
    // The volume, from the superblock.
    {"uuid", StatType::kText, "Identity of the volume."},
    {"format_version", StatType::kGauge, "Format version of the volume."},
    {"block_size", StatType::kGauge, "Block size of the volume in bytes."},
    {"checksums", StatType::kGauge, "1 when data blocks are checksummed."},
    {"dedup", StatType::kGauge, "1 when deduplication is on."},
    {"mounted", StatType::kGauge, "1 when the volume is mounted.", &RuntimeStats::mounted},
    // Space and contents, from the index.
    {"capacity_bytes", StatType::kGauge, "Size of the data area in bytes."},
    {"used_bytes", StatType::kGauge, "Bytes of the data area in use."},
    {"free_bytes", StatType::kGauge, "Bytes of the data area free."},
    {"logical_bytes", StatType::kGauge, "Sum of the sizes of regular files."},
    {"referenced_bytes", StatType::kGauge, "Sum of the lengths of all file extents (shared bytes counted per use)."},
    {"physical_bytes", StatType::kGauge, "Bytes of the data area mapped by files (shared bytes counted once)."},
    {"dedup_ratio", StatType::kGauge, "referenced_bytes / physical_bytes."},
    {"inodes", StatType::kGauge, "Inodes in the index."},
    {"files", StatType::kGauge, "Regular files."},
    {"directories", StatType::kGauge, "Directories."},
    {"symlinks", StatType::kGauge, "Symbolic links."},
    {"special_files", StatType::kGauge, "Device, FIFO and socket nodes."},
    {"orphans", StatType::kGauge, "Inodes unlinked while open, not yet reclaimed."},
    {"extents", StatType::kGauge, "Extent records in the index."},
    {"index_bytes", StatType::kGauge, "Approximate on-disk size of the index."},
    // The RAM tier.
    {"ram_tier_bytes", StatType::kGauge, "Dirty bytes held in the write-back RAM tier.", &RuntimeStats::ram_tier_bytes},
    {"ram_tier_capacity_bytes", StatType::kGauge, "Bound of the write-back RAM tier.",
     &RuntimeStats::ram_tier_capacity_bytes},
    {"ram_tier_hits", StatType::kCounter, "Reads served from the RAM tier since mount.", &RuntimeStats::ram_tier_hits},
    {"ram_tier_misses", StatType::kCounter, "Reads that went to the SSD since mount.", &RuntimeStats::ram_tier_misses},
    {"ram_tier_stalls", StatType::kCounter, "Writes that waited for room in the RAM tier in vain since mount.",
     &RuntimeStats::ram_tier_stalls},
    // The data area.
    {"bytes_written_ssd", StatType::kCounter,
     "Bytes written to the data area since mount, by the daemon and by direct-path clients.",
     &RuntimeStats::bytes_written_ssd},
    {"bytes_read_ssd", StatType::kCounter,
     "Bytes the daemon read from the data area since mount (direct-path reads are the clients' own).",
     &RuntimeStats::bytes_read_ssd},
    {"bytes_written_direct", StatType::kCounter,
     "Bytes direct-path clients wrote to the data area since mount (within bytes_written_ssd).",
     &RuntimeStats::bytes_written_direct},
    {"bytes_deduplicated", StatType::kCounter,
     "Bytes stored as references to data already on the volume (dedup) since mount, instead of written.",
     &RuntimeStats::bytes_deduplicated},
    {"bytes_cancelled", StatType::kCounter, "Bytes dropped from the RAM tier before reaching the SSD since mount.",
     &RuntimeStats::bytes_cancelled},
    {"checksum_errors", StatType::kCounter, "Checksum mismatches detected on read since mount.",
     &RuntimeStats::checksum_errors},
    {"data_syncs", StatType::kCounter, "fdatasync calls on the data area since mount.", &RuntimeStats::data_syncs},
    {"data_sync_seconds", StatType::kCounter, "Seconds spent in fdatasync of the data area since mount.",
     &RuntimeStats::data_sync_seconds},
    {"data_sync_failed", StatType::kGauge,
     "1 once an fdatasync of the data area has failed: every sync fails until a remount."},
    {"data_sync_error", StatType::kText, "The failed fdatasync's message (null while none has failed)."},
    // Client traffic.
    {"bytes_written", StatType::kCounter, "Bytes written by clients since mount.", &RuntimeStats::bytes_written},
    {"bytes_read", StatType::kCounter, "Bytes read by clients since mount.", &RuntimeStats::bytes_read},
    {"writes", StatType::kCounter, "Write operations since mount.", &RuntimeStats::writes},
    {"reads", StatType::kCounter, "Read operations since mount.", &RuntimeStats::reads},
    {"queue_depth", StatType::kGauge, "SSD I/Os in flight.", &RuntimeStats::queue_depth},
    {"fuse_ring_requests", StatType::kCounter, "FUSE requests answered over io_uring since mount.",
     &RuntimeStats::fuse_ring_requests},
    // Read-ahead.
    {"read_ahead_window_bytes", StatType::kGauge, "Size of one read-ahead window (0: read-ahead off).",
     &RuntimeStats::read_ahead_window_bytes},
    {"read_ahead_windows", StatType::kCounter, "Read-ahead windows started since mount.",
     &RuntimeStats::read_ahead_windows},
    {"read_ahead_bytes_fetched", StatType::kCounter, "Bytes read from the SSD ahead of sequential readers since mount.",
     &RuntimeStats::read_ahead_bytes_fetched},
    {"read_ahead_bytes_served", StatType::kCounter, "Bytes of reads answered from read-ahead windows since mount.",
     &RuntimeStats::read_ahead_bytes_served},
    {"read_ahead_waits", StatType::kCounter,
     "Reads that waited for a read-ahead window still being fetched since mount.", &RuntimeStats::read_ahead_waits},
    {"read_ahead_wait_seconds", StatType::kCounter,
     "Seconds reads waited for read-ahead windows being fetched since mount.", &RuntimeStats::read_ahead_wait_seconds},
    {"uptime_seconds", StatType::kGauge, "Seconds since mount.", &RuntimeStats::uptime_seconds},
};

// The row of `key`, or null.
constexpr const StatKey* FindStatKey(std::string_view key) {
  for (const StatKey& k : kStatKeys) {
    if (key == k.key) return &k;
  }
  return nullptr;
}

// Whether `key` is a key of the stat object. (By index and without a pointer
// compared to null: GCC's UBSan instrumentation makes FindStatKey's result
// compared to nullptr no constant expression, and a SPILLFS_SANITIZE build
// of StatKeyName would then fail to compile.)
constexpr bool IsStatKey(std::string_view key) {
  for (std::size_t i = 0; i < std::size(kStatKeys); ++i) {
    if (key == kStatKeys[i].key) return true;
  }
  return false;
}

// A key of the stat object, checked when the program is compiled: a reader
// of the object that names a key missing from kStatKeys does not build.
//   uint64_t Get(const json& stat, StatKeyName key);  Get(stat, "ram_tier_hits")
struct StatKeyName {
  consteval StatKeyName(const char* name) : name(name) {  // NOLINT(google-explicit-constructor)
    if (!IsStatKey(name)) throw "not a key of the stat object (spillfs/common/stat_keys.h)";
  }
  const char* name;
};

}  // namespace spillfs
