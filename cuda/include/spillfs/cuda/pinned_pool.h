// PinnedPool: page-locked host buffers for GPU <-> host copies, allocated once
// in large slabs and reused.
//
// A cudaHostAlloc costs milliseconds (it pins every page) and pageable memory
// halves nothing but the copy rate: 3.5 GB/s against 54 GB/s pinned on the
// GPU machine. So the client takes its staging buffers from this pool, and
// the bound the caller sets is all the pinned memory it will ever hold.
//
// Slabs are allocated on demand up to the bound (capacity()), never freed
// before the pool is; buffers are carved from them first-fit in 4 KiB pages
// and coalesced on release, so a buffer is 4 KiB-aligned and its capacity a
// multiple of 4 KiB (usable for O_DIRECT I/O as it is). Where CUDA is
// available the slabs are cudaHostAlloc'd (portable: pinned for every
// device); elsewhere they are plain 4 KiB-aligned host memory (pinned() is
// false), so the same code runs on a CPU machine.
//
// Threading: thread-safe. Acquire blocks on a condition variable while the
// bound is reached and wakes when a buffer is returned; a caller that holds
// buffers while it waits for more can deadlock against itself. Waiters are
// not served in order: a large request may wait while small ones pass.
// Error convention: Acquire/TryAcquire return an empty buffer for requests
// that can never be served (0 bytes, more than slab_bytes()) and when no slab
// can be allocated at all (check it: `if (!buffer)`).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace spillfs::cuda {

class PinnedPool;

// One buffer of a PinnedPool; move-only, returned to the pool on destruction
// (or Reset). Empty when default-constructed or moved from.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }          // the bytes asked for
  size_t capacity() const { return capacity_; }  // size() rounded up to 4 KiB
  explicit operator bool() const { return data_ != nullptr; }
  // Returns the buffer to its pool now.
  void Reset();

 private:
  friend class PinnedPool;
  PinnedBuffer(PinnedPool* pool, void* data, size_t size, size_t capacity)
      : pool_(pool), data_(data), size_(size), capacity_(capacity) {}

  PinnedPool* pool_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

class PinnedPool {
 public:
  static constexpr size_t kAlignment = 4096;

  // At most `max_bytes` in slabs of `slab_bytes` (both rounded up to 4 KiB; a
  // slab is at most max_bytes). Allocates nothing yet.
  PinnedPool(size_t max_bytes, size_t slab_bytes);
  // REQUIRES: every buffer has been returned.
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of `bytes`, waiting while the pool is at its bound. Empty when
  // the request can never be served (see the error convention above).
  PinnedBuffer Acquire(size_t bytes);
  // The same without waiting: nullopt while the pool is at its bound.
  std::optional<PinnedBuffer> TryAcquire(size_t bytes);

  bool pinned() const { return pinned_; }  // slabs are page-locked (cudaHostAlloc)
  size_t capacity() const { return max_slabs_ * slab_bytes_; }
  size_t slab_bytes() const { return slab_bytes_; }
  size_t in_use() const;    // bytes handed out (capacities)
  size_t reserved() const;  // bytes of slabs allocated so far

 private:
  friend class PinnedBuffer;
  struct Slab {
    char* base = nullptr;
    std::map<size_t, size_t> free;  // offset -> length, coalesced
  };

  // The common path of Acquire and TryAcquire: nullopt when `wait` is false
  // and the pool is at its bound.
  std::optional<PinnedBuffer> Get(size_t bytes, bool wait);
  char* CarveLocked(size_t bytes);
  void Release(void* data, size_t capacity);
  void* AllocateSlab() const;
  void FreeSlab(void* base) const;

  const size_t slab_bytes_;
  const size_t max_slabs_;
  const bool pinned_;
  mutable std::mutex mu_;
  size_t slab_limit_;  // max_slabs_, lowered when a slab cannot be allocated
  std::condition_variable returned_;
  std::vector<Slab> slabs_;
  size_t allocating_ = 0;  // slabs being allocated outside the lock
  size_t in_use_ = 0;
};

}  // namespace spillfs::cuda
