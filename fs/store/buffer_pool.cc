#include "spillfs/store/buffer_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <new>
#include <utility>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it (EINVAL) and nothing is warmed
#endif

namespace spillfs {

BufferPool::BufferPool(size_t buffer_bytes, size_t slab_bytes, SlabFault slab_fault)
    : buffer_bytes_(buffer_bytes), slab_bytes_(slab_bytes), slab_fault_(std::move(slab_fault)) {}

BufferPool::~BufferPool() {
  for (void* slab : slabs_) munmap(slab, slab_bytes_);
}

bool BufferPool::AddSlabLocked(bool populate) {
  if (slab_fault_ && slab_fault_()) return false;
  try {
    // Room for every buffer first: a slab mapped is never lost, and Release
    // never needs memory.
    slabs_.reserve(slabs_.size() + 1);
    free_.reserve((slabs_.size() + 1) * (slab_bytes_ / buffer_bytes_));
  } catch (const std::bad_alloc&) {
    return false;
  }
  void* slab = mmap(nullptr, slab_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (slab == MAP_FAILED) return false;
  madvise(slab, slab_bytes_, MADV_HUGEPAGE);
  if (populate) madvise(slab, slab_bytes_, MADV_POPULATE_WRITE);  // best effort (Linux 5.14+)
  slabs_.push_back(slab);
  char* base = static_cast<char*>(slab);
  // Pushed last to first, so the slab is used from its start.
  for (size_t at = slab_bytes_; at >= buffer_bytes_; at -= buffer_bytes_) free_.push_back(base + at - buffer_bytes_);
  return true;
}

void BufferPool::Warm(size_t bytes) {
  MutexLock lock(&mu_);
  // Best effort: what cannot be mapped now is mapped on demand (or fails then).
  while ((slabs_.size() + 1) * slab_bytes_ <= bytes && AddSlabLocked(/*populate=*/true)) {
  }
}

Result<char*> BufferPool::Acquire() {
  MutexLock lock(&mu_);
  // Mapped under the lock (a mapping is cheap: its pages fault in as the
  // buffers are used), so writers that find the pool empty together map one
  // slab, not one each.
  if (free_.empty() && !AddSlabLocked(/*populate=*/false)) {
    return Status::Error(ENOMEM, "out of memory for the RAM tier");
  }
  char* buffer = free_.back();
  free_.pop_back();
  return buffer;
}

void BufferPool::Release(char* buffer) {
  MutexLock lock(&mu_);
  free_.push_back(buffer);
}

size_t BufferPool::reserved_bytes() const {
  MutexLock lock(&mu_);
  return slabs_.size() * slab_bytes_;
}

}  // namespace spillfs
