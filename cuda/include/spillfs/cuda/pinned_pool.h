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
// A shareable pool (Shareable()) keeps its slabs in one memfd, windows of
// it mapped MAP_SHARED and page-locked with cudaHostRegister where CUDA is
// available, so that another process given the memfd (the spillfs daemon,
// which does the I/O of callers who may not open the data area) sees the
// buffers: shared_fd() and shared_offset() name a buffer there. The memfd is
// sealed against shrinking (a process mapping it cannot be made to fault).
//
// Threading: thread-safe. Acquire blocks on a condition variable while the
// bound is reached and wakes when a buffer is returned; a caller that holds
// buffers while it waits for more can deadlock against itself. Waiters are
// not served in order: a large request may wait while small ones pass.
// Error convention: Acquire/TryAcquire return an empty buffer for requests
// that can never be served (0 bytes, more than slab_bytes()) and when no slab
// can be allocated at all (check it: `if (!buffer)`).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
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
  // The same, its slabs in one sealed memfd (see above). Null with errno set
  // when the memfd cannot be made or mapped.
  static std::unique_ptr<PinnedPool> Shareable(size_t max_bytes, size_t slab_bytes);
  // REQUIRES: every buffer has been returned.
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of `bytes`, waiting while the pool is at its bound. Empty when
  // the request can never be served (see the error convention above).
  PinnedBuffer Acquire(size_t bytes);
  // The same without waiting: nullopt while the pool is at its bound.
  std::optional<PinnedBuffer> TryAcquire(size_t bytes);

  // Slabs are page-locked (cudaHostAlloc; for a shareable pool,
  // cudaHostRegister, false once a registration failed).
  bool pinned() const { return pinned_ && !unpinned_slabs_.load(std::memory_order_relaxed); }
  // A shareable pool's memfd (-1 for others), and where in it `data` (inside
  // a buffer of this pool) lies.
  int shared_fd() const { return shared_fd_; }
  uint64_t shared_offset(const void* data) const {
    return static_cast<uint64_t>(static_cast<const char*>(data) - shared_base_);
  }
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
  // Slab `index` (a shareable pool's window of that number).
  void* AllocateSlab(size_t index);
  void FreeSlab(void* base) const;

  const size_t slab_bytes_;
  const size_t max_slabs_;
  const bool pinned_;
  mutable std::mutex mu_;
  size_t slab_limit_;  // max_slabs_, lowered when a slab cannot be allocated
  std::condition_variable returned_;
  std::vector<Slab> slabs_;
  size_t allocating_ = 0;   // slabs being allocated outside the lock
  size_t next_window_ = 0;  // a shareable pool's next slab window (never reused)
  size_t in_use_ = 0;
  // A shareable pool's memfd and its mapping (max_slabs_ windows).
  int shared_fd_ = -1;
  char* shared_base_ = nullptr;
  std::atomic<bool> unpinned_slabs_{false};
};

}  // namespace spillfs::cuda
