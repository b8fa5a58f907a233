// Internal to libspillfs_client: segment files (spill_file_*), the C ABI's
// way to move a list of (pointer, length, file offset, host or device)
// segments of one file, on any file system. The work is split so:
//   file_open.cc      opening: which backend, the direct path's client
//   file_plan.cc      segments -> pieces: block-aligned runs of the file, cut
//                     at chunk boundaries, each staged in one pinned buffer
//   file_write.cc     the write pipeline (copy in, checksums, I/O, commit)
//   file_read.cc      the read pipeline (I/O, verify, copy out)
//   file_api.cc       the C ABI: files, requests, dedup, hashing, settings
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "control.h"
#include "spillfs/client.h"

struct spill_client;

namespace spillfs::client {

struct Layout;  // client_impl.h

enum class Backend {
  kDirectPath = SPILL_BACKEND_DIRECT_PATH,  // reserve, O_DIRECT into the store, commit
  kMount = SPILL_BACKEND_MOUNT,             // O_DIRECT (or buffered) through a spillfs mount
  kDirectIo = SPILL_BACKEND_DIRECT_IO,      // O_DIRECT on another file system
  kBuffered = SPILL_BACKEND_BUFFERED,       // where O_DIRECT is refused (or turned off)
  kMemoryIo = SPILL_BACKEND_MEMORY_IO,      // the daemon's I/O into the staging pool's memfd (mem_write, mem_read)
};

inline constexpr uint64_t kBlock = 4096;  // the unit of every I/O

// One segment of a request, as given.
struct Seg {
  char* ptr = nullptr;
  uint64_t length = 0;
  uint64_t offset = 0;  // in the file
  int device = -1;
  uint64_t end() const { return offset + length; }
};

// A block-aligned range of the file that one staging buffer holds: within one
// run of touched blocks and one chunk-aligned window of the file.
struct Piece {
  uint64_t start = 0, end = 0;
  // Host memory holding exactly [start, end) at a 4 KiB-aligned address: the
  // I/O uses it as is, nothing is staged.
  char* direct = nullptr;
  size_t first_seg = 0, last_seg = 0;  // segments [first, last) may overlap it
};

// The request's segments sorted by offset, and its pieces.
struct Plan {
  std::vector<Seg> segs;
  std::vector<uint64_t> max_end;  // max_end[i]: largest end among segs[0..i]
  std::vector<Piece> pieces;
  uint64_t bytes = 0;        // sum of lengths
  uint64_t exact_end = 0;    // largest segment end
  std::vector<int> devices;  // CUDA devices used
};

// Sorts and checks the segments and cuts the pieces; 0 or -errno (message set).
// `for_write`: segments must not overlap.
int MakePlan(const spill_segment* segments, size_t n, bool for_write, uint64_t chunk_bytes, Plan* plan);

}  // namespace spillfs::client

struct spill_file {
  using Backend = spillfs::client::Backend;

  Backend backend = Backend::kBuffered;
  std::string path;  // canonical
  int flags = 0;
  // The descriptor the I/O goes through (O_DIRECT unless kBuffered); for the
  // direct path, a plain descriptor of the file through the mount (size,
  // truncate, sync, and blocks to complete a partial block with).
  int fd = -1;
  bool o_direct = false;

  // A spillfs mount's (the direct path and kMount).
  std::string mountpoint;
  std::string rel;                       // "/a/b" in the mount
  std::shared_ptr<spill_client> client;  // the direct path
  bool memory_dedup = false;             // kMemoryIo: the volume dedups what the daemon writes

  // Direct path: the layout the last read took (its channel holds the lease
  // that keeps its blocks), used again while the file is unchanged: the
  // same stat, no change by this handle since, younger than the client's
  // lease_ms. Dropped by each change through the handle.
  std::mutex layout_mu;
  std::shared_ptr<spillfs::client::Layout> layout;
  uint64_t changes = 0;  // write requests, truncates and dedups of the handle

  // The control channel of spill_file_dedup, opened at first use.
  std::mutex control_mu;
  std::unique_ptr<spillfs::client::ControlChannel> control;

  // Size bookkeeping of the O_DIRECT backends, whose writes end on a block
  // boundary: the last write request to finish sets the size to what the
  // requests wrote (never less than it was). A dedup counts as a write in
  // flight: the daemon grows the file over the units it maps, and a write
  // ending meanwhile must not cut them off.
  std::mutex size_mu;
  uint64_t size = 0;        // the file's size as written (exact)
  uint64_t padded_end = 0;  // the end of blocks written past `size`
  unsigned writes_in_flight = 0;
  std::atomic<unsigned> requests_in_flight{0};

  // A change through the handle begins or ends: the kept layout goes.
  void Changed();

  // A write (or dedup) begins; returns the size before it.
  uint64_t BeginWrite();
  // It ends: `ok` with bytes up to `end` in place, blocks written up to
  // `padded_end` (>= end; 0: none past it). The last one in flight sets the
  // file's size to what was written; 0 or -errno (message set).
  int EndWrite(bool ok, uint64_t end, uint64_t padded_end);

  ~spill_file();
};

struct spill_request {
  std::thread worker;
  int rc = 0;
  std::string message;
  spill_io_stats stats{};
  spill_file* file = nullptr;
};
