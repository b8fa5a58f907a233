#include "store/buffer_pool.h"

#include <sys/mman.h>

#include <new>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it (EINVAL) and nothing is warmed
#endif

namespace spillfs {

BufferPool::BufferPool(size_t buffer_bytes, size_t slab_bytes) : buffer_bytes_(buffer_bytes), slab_bytes_(slab_bytes) {}

BufferPool::~BufferPool() {
  for (void* slab : slabs_) munmap(slab, slab_bytes_);
}

void BufferPool::AddSlabLocked(bool populate) {
  void* slab = mmap(nullptr, slab_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (slab == MAP_FAILED) throw std::bad_alloc();
  madvise(slab, slab_bytes_, MADV_HUGEPAGE);
  if (populate) madvise(slab, slab_bytes_, MADV_POPULATE_WRITE);  // best effort (Linux 5.14+)
  slabs_.push_back(slab);
  char* base = static_cast<char*>(slab);
  // Pushed last to first, so the slab is used from its start.
  for (size_t at = slab_bytes_; at >= buffer_bytes_; at -= buffer_bytes_) free_.push_back(base + at - buffer_bytes_);
}

void BufferPool::Warm(size_t bytes) {
  std::lock_guard lock(mu_);
  try {
    while ((slabs_.size() + 1) * slab_bytes_ <= bytes) AddSlabLocked(/*populate=*/true);
  } catch (const std::bad_alloc&) {
    // Best effort: what could not be mapped now is mapped on demand (or fails then).
  }
}

char* BufferPool::Acquire() {
  std::lock_guard lock(mu_);
  // Mapped under the lock (a mapping is cheap: its pages fault in as the
  // buffers are used), so writers that find the pool empty together map one
  // slab, not one each.
  if (free_.empty()) AddSlabLocked(/*populate=*/false);
  char* buffer = free_.back();
  free_.pop_back();
  return buffer;
}

void BufferPool::Release(char* buffer) {
  std::lock_guard lock(mu_);
  free_.push_back(buffer);
}

size_t BufferPool::reserved_bytes() const {
  std::lock_guard lock(mu_);
  return slabs_.size() * slab_bytes_;
}

}  // namespace spillfs
