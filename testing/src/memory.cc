#include "spillfs/testing/memory.h"

#include <atomic>
#include <memory>

namespace spillfs::memory {

BufferPool::SlabFault FailSlabsAfter(uint64_t slabs) {
  auto mapped = std::make_shared<std::atomic<uint64_t>>(0);
  return [mapped, slabs] { return mapped->fetch_add(1) >= slabs; };
}

}  // namespace spillfs::memory
