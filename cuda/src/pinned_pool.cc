#include "spillfs/cuda/pinned_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdlib>

#include "spillfs/common/rounding.h"
#include "spillfs/cuda/runtime.h"

#if SPILLFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace spillfs::cuda {

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (data_ != nullptr) pool_->Release(data_, capacity_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
}

namespace {

size_t SlabBytes(size_t max_bytes, size_t slab_bytes) {
  const size_t max_rounded = RoundUp(std::max<size_t>(max_bytes, 1), PinnedPool::kAlignment);
  return std::min(RoundUp(std::max<size_t>(slab_bytes, 1), PinnedPool::kAlignment), max_rounded);
}

}  // namespace

PinnedPool::PinnedPool(size_t max_bytes, size_t slab_bytes)
    : slab_bytes_(SlabBytes(max_bytes, slab_bytes)),
      max_slabs_(std::max<size_t>(max_bytes / slab_bytes_, 1)),
      pinned_(Available()),
      slab_limit_(max_slabs_) {}

std::unique_ptr<PinnedPool> PinnedPool::Shareable(size_t max_bytes, size_t slab_bytes) {
  std::unique_ptr<PinnedPool> pool(new PinnedPool(max_bytes, slab_bytes));
  const size_t bytes = pool->max_slabs_ * pool->slab_bytes_;
  int fd = memfd_create("spillfs-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  // Sparse until a slab is touched; sealed so that no holder can shrink it
  // under another's mapping.
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (base == MAP_FAILED) {
    int e = errno;
    close(fd);
    errno = e;
    return nullptr;
  }
  pool->shared_fd_ = fd;
  pool->shared_base_ = static_cast<char*>(base);
  return pool;
}

PinnedPool::~PinnedPool() {
  assert(in_use_ == 0 && "PinnedPool destroyed while buffers are out");
  for (const Slab& slab : slabs_) FreeSlab(slab.base);
  if (shared_base_ != nullptr) munmap(shared_base_, max_slabs_ * slab_bytes_);
  if (shared_fd_ >= 0) close(shared_fd_);
}

PinnedBuffer PinnedPool::Acquire(size_t bytes) {
  std::optional<PinnedBuffer> buffer = Get(bytes, /*wait=*/true);
  return buffer ? std::move(*buffer) : PinnedBuffer();
}

std::optional<PinnedBuffer> PinnedPool::TryAcquire(size_t bytes) { return Get(bytes, /*wait=*/false); }

std::optional<PinnedBuffer> PinnedPool::Get(size_t bytes, bool wait) {
  if (bytes == 0 || bytes > slab_bytes_) return PinnedBuffer();
  const size_t capacity = RoundUp(bytes, kAlignment);
  std::unique_lock lock(mu_);
  for (;;) {
    if (char* data = CarveLocked(capacity)) {
      in_use_ += capacity;
      return PinnedBuffer(this, data, bytes, capacity);
    }
    if (slabs_.size() + allocating_ < slab_limit_) {
      // Allocate outside the lock: pinning a slab takes milliseconds, and
      // buffers may be returned meanwhile.
      ++allocating_;
      const size_t window = next_window_++;
      lock.unlock();
      void* base = AllocateSlab(window);
      lock.lock();
      --allocating_;
      if (base != nullptr) {
        Slab& slab = slabs_.emplace_back();
        slab.base = static_cast<char*>(base);
        slab.free.emplace(0, slab_bytes_);
        returned_.notify_all();  // a waiter may fit in what this request leaves
        continue;
      }
      // No more memory: the pool stays at the slabs it has.
      slab_limit_ = slabs_.size() + allocating_;
      returned_.notify_all();
    }
    // Nothing out and nothing coming: waiting would never end.
    if (slabs_.empty() && allocating_ == 0) return PinnedBuffer();
    if (!wait) return std::nullopt;
    returned_.wait(lock);
  }
}

char* PinnedPool::CarveLocked(size_t bytes) {
  for (Slab& slab : slabs_) {
    for (auto it = slab.free.begin(); it != slab.free.end(); ++it) {
      if (it->second < bytes) continue;
      const size_t offset = it->first;
      const size_t rest = it->second - bytes;
      slab.free.erase(it);
      if (rest > 0) slab.free.emplace(offset + bytes, rest);
      return slab.base + offset;
    }
  }
  return nullptr;
}

void PinnedPool::Release(void* data, size_t capacity) {
  char* p = static_cast<char*>(data);
  {
    std::lock_guard lock(mu_);
    auto slab = std::find_if(slabs_.begin(), slabs_.end(),
                             [&](const Slab& s) { return p >= s.base && p < s.base + slab_bytes_; });
    assert(slab != slabs_.end());
    size_t offset = static_cast<size_t>(p - slab->base);
    size_t length = capacity;
    // Coalesce with the free neighbours on either side.
    auto next = slab->free.lower_bound(offset);
    if (next != slab->free.end() && next->first == offset + length) {
      length += next->second;
      next = slab->free.erase(next);
    }
    if (next != slab->free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        slab->free.erase(prev);
      }
    }
    slab->free.emplace(offset, length);
    in_use_ -= capacity;
  }
  returned_.notify_all();
}

size_t PinnedPool::in_use() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

size_t PinnedPool::reserved() const {
  std::lock_guard lock(mu_);
  return slabs_.size() * slab_bytes_;
}

void* PinnedPool::AllocateSlab(size_t index) {
  if (shared_base_ != nullptr) {
    if (index >= max_slabs_) return nullptr;
    char* base = shared_base_ + index * slab_bytes_;
#if SPILLFS_HAVE_CUDA
    if (pinned_ && cudaHostRegister(base, slab_bytes_, cudaHostRegisterPortable) != cudaSuccess) {
      cudaGetLastError();
      unpinned_slabs_.store(true, std::memory_order_relaxed);  // usable, copied at pageable speed
    }
#endif
    return base;
  }
#if SPILLFS_HAVE_CUDA
  if (pinned_) {
    void* base = nullptr;
    if (cudaHostAlloc(&base, slab_bytes_, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return base;
  }
#endif
  return std::aligned_alloc(kAlignment, slab_bytes_);
}

void PinnedPool::FreeSlab(void* base) const {
  if (shared_base_ != nullptr) {
#if SPILLFS_HAVE_CUDA
    if (pinned_ && cudaHostUnregister(base) != cudaSuccess) cudaGetLastError();
#endif
    return;  // unmapped with the whole memfd
  }
#if SPILLFS_HAVE_CUDA
  if (pinned_) {
    // Fails harmlessly when the CUDA runtime is already torn down at exit.
    if (cudaFreeHost(base) != cudaSuccess) cudaGetLastError();
    return;
  }
#endif
  std::free(base);
}

}  // namespace spillfs::cuda
