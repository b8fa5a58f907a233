// BlockStore: the data area of a volume, an image file or a block device
// opened with O_DIRECT. It knows byte offsets and nothing of files.
//
// All offsets, lengths and buffers must be multiples of / aligned to
// kDirectAlignment. Large transfers are split into chunks that run in
// parallel at the engine's queue depth.
//
// Power-cut simulation (tests only): when the environment variable
// SPILLFS_POWERCUT_JOURNAL names a file at Open (read-write opens only), every
// write first appends the pre-image of the bytes it replaces to that file
// (records of kPowercutRecordMagic, offset, length, then the old bytes; native
// byte order; fflush'd before the write is issued), and Flush() empties it
// once fdatasync has returned. The journal therefore holds, in write order,
// the pre-images of exactly the writes that are not yet durable: applying them
// in reverse order to the data area gives the bytes a power cut at that moment
// could leave. Flush excludes writes while it runs, so a write in flight
// during the fdatasync is never taken for durable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "spillfs/common/status.h"

namespace spillfs {

// A run of bytes in the data area.
struct PhysicalExtent {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const PhysicalExtent&) const = default;
};

// One transfer between the store and a buffer.
struct IoSlice {
  uint64_t offset = 0;  // in the store
  char* buffer = nullptr;
  uint64_t length = 0;
};

class BlockStore {
 public:
  static constexpr uint64_t kDirectAlignment = 4096;
  static constexpr uint32_t kChunkBytes = 1u << 20;  // split size for parallel I/O
  static constexpr const char* kPowercutJournalEnv = "SPILLFS_POWERCUT_JOURNAL";
  // One journal record: this header, then `length` bytes of pre-image.
  static constexpr uint32_t kPowercutRecordMagic = 0x50434a31;  // "PCJ1"
  struct PowercutRecordHeader {
    uint32_t magic = kPowercutRecordMagic;
    uint32_t reserved = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
  };

  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Creates a sparse image file of `size` bytes (fails if it exists).
  static Status CreateImage(const std::string& path, uint64_t size);
  // Opens an image file or block device for direct I/O.
  static Result<std::unique_ptr<BlockStore>> Open(const std::string& path, bool read_only = false);
  // Size in bytes of a file or block device.
  static Result<uint64_t> SizeOf(const std::string& path);

  // Scatter/gather: writes or reads each extent from the matching slice of
  // `buffer` (extents are consumed in order, back to back in the buffer).
  Status Write(const std::vector<PhysicalExtent>& extents, const char* buffer);
  Status Read(const std::vector<PhysicalExtent>& extents, char* buffer);
  // Independent transfers, run in parallel.
  Status WriteSlices(const std::vector<IoSlice>& slices) { return Transfer(slices, true); }
  Status ReadSlices(const std::vector<IoSlice>& slices) { return Transfer(slices, false); }
  Status WriteAt(uint64_t offset, const char* buffer, uint64_t length);
  Status ReadAt(uint64_t offset, char* buffer, uint64_t length);
  // Makes completed writes durable (fdatasync); empties the power-cut journal.
  // Safe from several threads: callers that arrive while an fdatasync runs
  // wait for it and then share one more. A failure is sticky: every later Flush fails
  // with it, because the kernel reports a lost write-back to one fdatasync
  // only and data written before it may be gone (the lesson of PostgreSQL's
  // "fsyncgate").
  Status Flush();
  // fdatasync calls that succeeded since Open (callers that shared one count once).
  uint64_t syncs() const { return syncs_.load(std::memory_order_relaxed); }
  // Nanoseconds spent in those fdatasync calls (and in failed ones): how much
  // the flush before each mapping costs on this device.
  uint64_t sync_ns() const { return sync_ns_.load(std::memory_order_relaxed); }
  // The sticky error of Flush: OK until an fdatasync has failed.
  Status sync_error() const;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  BlockStore(int fd, std::string path, uint64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  Status Transfer(const std::vector<IoSlice>& slices, bool write);
  // fdatasync, with the sticky error of Flush.
  Status SyncData();
  // Appends the current bytes under `slices` to the power-cut journal.
  Status JournalPreImages(const std::vector<IoSlice>& slices);

  int fd_;
  std::string path_;
  uint64_t size_;
  // Power-cut simulation (null unless SPILLFS_POWERCUT_JOURNAL was set at Open).
  FILE* journal_ = nullptr;
  std::mutex journal_mu_;            // appends and truncation of journal_
  std::shared_mutex durability_mu_;  // shared: a journaled write; exclusive: Flush
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> bytes_read_{0};
  // Group commit of fdatasync (SyncData), all guarded by sync_mu_.
  mutable std::mutex sync_mu_;
  std::condition_variable sync_done_;
  bool sync_running_ = false;
  uint64_t sync_tickets_ = 0;  // callers so far, numbered from 1
  uint64_t sync_covered_ = 0;  // callers up to this one are durable
  Status sync_error_;          // the first failed fdatasync, returned ever after
  std::atomic<uint64_t> syncs_{0};
  std::atomic<uint64_t> sync_ns_{0};
};

}  // namespace spillfs
