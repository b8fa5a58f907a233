// BlockStore: the data area of a volume, an image file or a block device
// opened with O_DIRECT. It knows byte offsets and nothing of files.
//
// All offsets, lengths and buffers must be multiples of / aligned to
// kDirectAlignment. Large transfers are split into chunks that run in
// parallel at the engine's queue depth.
//
// BlockStore is an interface: Open returns the one implementation, over a
// file descriptor and io_uring. Tests wrap it, as RocksDB's
// FaultInjectionTestFS wraps a FileSystem: the power-cut simulation's wrapper
// (testing/include/spillfs/testing/powercut.h) journals the pre-image of every
// write that is not yet durable, and Volume::Open puts it in place only when
// a test hands it one (Volume::Wrappers).
#pragma once

#include <cstdint>
#include <memory>
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

  virtual ~BlockStore() = default;
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Creates a sparse image file of `size` bytes (fails if it exists).
  static Status CreateImage(const std::string& path, uint64_t size);
  // Opens an image file or block device for direct I/O. A writable open holds
  // the area's writer lock (flock) until the store and every I/O it issued
  // are gone, waiting a few seconds for a previous writer's I/O to drain;
  // EBUSY if another writer holds it.
  static Result<std::unique_ptr<BlockStore>> Open(const std::string& path, bool read_only = false);
  // The writer lock of the data area at `path`, taken on `fd` (an open of
  // it) as a writable Open takes it: held until `fd` is closed.
  static Status LockForWriting(int fd, const std::string& path);
  // Size in bytes of a file or block device.
  static Result<uint64_t> SizeOf(const std::string& path);

  // Independent transfers, run in parallel.
  virtual Status WriteSlices(const std::vector<IoSlice>& slices) = 0;
  virtual Status ReadSlices(const std::vector<IoSlice>& slices) = 0;
  // Scatter/gather: writes or reads each extent from the matching slice of
  // `buffer` (extents are consumed in order, back to back in the buffer).
  Status Write(const std::vector<PhysicalExtent>& extents, const char* buffer);
  Status Read(const std::vector<PhysicalExtent>& extents, char* buffer);
  Status WriteAt(uint64_t offset, const char* buffer, uint64_t length);
  Status ReadAt(uint64_t offset, char* buffer, uint64_t length);
  // Makes completed writes durable (fdatasync).
  // Safe from several threads: callers that arrive while an fdatasync runs
  // wait for it and then share one more. A failure is sticky: every later Flush fails
  // with it, because the kernel reports a lost write-back to one fdatasync
  // only and data written before it may be gone (the lesson of PostgreSQL's
  // "fsyncgate").
  virtual Status Flush() = 0;
  // fdatasync calls that succeeded since Open (callers that shared one count once).
  virtual uint64_t syncs() const = 0;
  // Nanoseconds spent in those fdatasync calls (and in failed ones): how much
  // the flush before each mapping costs on this device.
  virtual uint64_t sync_ns() const = 0;
  // The sticky error of Flush: OK until an fdatasync has failed.
  virtual Status sync_error() const = 0;

  virtual uint64_t size() const = 0;
  virtual const std::string& path() const = 0;
  virtual uint64_t bytes_written() const = 0;
  virtual uint64_t bytes_read() const = 0;

 protected:
  BlockStore() = default;
};

}  // namespace spillfs
