// UringEngine: batched block I/O through io_uring.
//
// Each calling thread gets its own ring (created on first use), so FUSE worker
// threads never contend on submission. Submit() keeps up to `queue_depth`
// requests in flight, resubmits short transfers and returns the first error
// with the offset it happened at.
#pragma once

#include <cstdint>
#include <span>

#include "spillfs/common/status.h"

namespace spillfs {

struct IoRequest {
  int fd = -1;
  bool write = false;
  uint64_t offset = 0;  // byte offset in the file or device
  char* buffer = nullptr;
  uint32_t length = 0;
};

class UringEngine {
 public:
  static constexpr unsigned kDefaultQueueDepth = 32;

  // Runs every request to completion. Requests may complete in any order.
  static Status Submit(std::span<IoRequest> requests, unsigned queue_depth = kDefaultQueueDepth);
  // True when io_uring can be set up in this process (kernel and seccomp allow it).
  static bool Available();
};

}  // namespace spillfs
