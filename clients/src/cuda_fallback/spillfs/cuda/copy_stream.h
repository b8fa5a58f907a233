// Stand-in (see README): no CUDA, so no stream can be made.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "spillfs/common/status.h"

namespace spillfs::cuda {
struct CopyEvent {
  uint64_t id = 0;
};
class CopyStream {
 public:
  static Result<std::unique_ptr<CopyStream>> Create(int) { return Status::Error(ENODEV, "built without CUDA"); }
  Status WaitFor(uintptr_t) { return Unavailable(); }
  Status ToHost(void*, const void*, size_t) { return Unavailable(); }
  Status ToDevice(void*, const void*, size_t) { return Unavailable(); }
  Result<CopyEvent> Record() { return Unavailable(); }
  Status Wait(const CopyEvent&) { return Unavailable(); }
  Status SignalTo(uintptr_t) { return Unavailable(); }

 private:
  static Status Unavailable() { return Status::Error(ENODEV, "built without CUDA"); }
};
}  // namespace spillfs::cuda
