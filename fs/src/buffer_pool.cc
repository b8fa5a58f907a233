#include "spillfs/fs/buffer_pool.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace spillfs {

BufferPool::BufferPool(size_t buffer_bytes, size_t slab_bytes, size_t limit_bytes)
    : buffer_bytes_(buffer_bytes), slab_bytes_(slab_bytes), limit_bytes_(limit_bytes) {
  if (limit_bytes_ > 0) warmer_ = std::thread([this] { WarmLoop(); });
}

BufferPool::~BufferPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (warmer_.joinable()) warmer_.join();
  for (void* slab : slabs_) munmap(slab, slab_bytes_);
}

void* BufferPool::MapSlab(bool populate) const {
  void* slab = mmap(nullptr, slab_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (slab == MAP_FAILED) return nullptr;
  madvise(slab, slab_bytes_, MADV_HUGEPAGE);
  if (populate && madvise(slab, slab_bytes_, MADV_POPULATE_WRITE) != 0) {
    // Older kernel: touch every page instead.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto* bytes = static_cast<volatile char*>(slab);
    for (size_t at = 0; at < slab_bytes_; at += page) bytes[at] = 0;
  }
  return slab;
}

void BufferPool::AddSlabLocked(void* slab) {
  slabs_.push_back(slab);
  char* base = static_cast<char*>(slab);
  for (size_t at = slab_bytes_; at >= buffer_bytes_; at -= buffer_bytes_) free_.push_back(base + at - buffer_bytes_);
}

char* BufferPool::Acquire() {
  std::unique_lock lock(mu_);
  if (free_.empty()) {
    // Nothing warm: map one here and let its pages fault in on first touch.
    lock.unlock();
    void* slab = MapSlab(/*populate=*/false);
    if (slab == nullptr) throw std::bad_alloc();
    lock.lock();
    AddSlabLocked(slab);
  }
  char* buffer = free_.back();
  free_.pop_back();
  ++in_use_;
  if (WantsWarmSlabLocked()) wake_.notify_one();
  return buffer;
}

void BufferPool::Release(char* buffer) {
  std::lock_guard lock(mu_);
  free_.push_back(buffer);
  --in_use_;
}

bool BufferPool::WantsWarmSlabLocked() const {
  if (limit_bytes_ == 0 || in_use_ == 0) return false;
  size_t reserved = (slabs_.size() + warming_) * slab_bytes_;
  if (reserved + slab_bytes_ > limit_bytes_) return false;
  size_t ahead = std::clamp(in_use_ * buffer_bytes_, slab_bytes_, kMaxAheadBytes);
  size_t ready = free_.size() * buffer_bytes_ + warming_ * slab_bytes_;
  return ready < ahead;
}

void BufferPool::WarmLoop() {
  pthread_setname_np(pthread_self(), "spillfs-warm");
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || WantsWarmSlabLocked(); });
    if (stopping_) return;
    ++warming_;
    lock.unlock();
    void* slab = MapSlab(/*populate=*/true);
    lock.lock();
    --warming_;
    if (slab == nullptr) {
      // Out of memory: stop warming; Acquire reports a failure itself.
      return;
    }
    AddSlabLocked(slab);
    ++warmed_slabs_;
  }
}

size_t BufferPool::reserved_bytes() const {
  std::lock_guard lock(mu_);
  return slabs_.size() * slab_bytes_;
}

size_t BufferPool::warmed_bytes() const {
  std::lock_guard lock(mu_);
  return warmed_slabs_ * slab_bytes_;
}

}  // namespace spillfs
