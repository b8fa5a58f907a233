// BufferPool: fixed-size, 4 KiB-aligned buffers carved from large slabs.
//
// The RAM tier takes and returns buffers at memory speed. Fresh memory costs
// a page fault and the zeroing of the page on first touch; on the virtual
// machines we run on, that made a FUSE write into never-touched memory ~6x
// slower than into recycled memory (86% of the daemon's time in the kernel's
// clear_page). So:
//  - slabs are asked for transparent huge pages, and buffers are recycled
//    instead of being given back to the OS;
//  - a warm-up thread keeps fresh slabs faulted in ahead of demand (as many
//    bytes ahead as are in use, between one slab and `kMaxAheadBytes`, never
//    past `limit_bytes`), so the zeroing runs on another core, overlapped
//    with the writes that will use them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace spillfs {

class BufferPool {
 public:
  static constexpr size_t kMaxAheadBytes = 512u << 20;

  // `buffer_bytes` must divide `slab_bytes`; both multiples of 4 KiB. The
  // warm-up thread faults in at most `limit_bytes` (0: no warm-up);
  // Acquire itself is not limited.
  BufferPool(size_t buffer_bytes, size_t slab_bytes, size_t limit_bytes = 0);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of buffer_bytes(); never null (throws std::bad_alloc).
  char* Acquire();
  void Release(char* buffer);

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t reserved_bytes() const;  // memory taken from the OS
  size_t warmed_bytes() const;    // of which the warm-up thread faulted in

 private:
  // Maps one slab (huge pages asked for); faults it in when `populate`.
  void* MapSlab(bool populate) const;
  // Adds a mapped slab's buffers to the free list; mu_ held.
  void AddSlabLocked(void* slab);
  // Bytes the warm-up thread should have ready now; mu_ held.
  bool WantsWarmSlabLocked() const;
  void WarmLoop();

  const size_t buffer_bytes_;
  const size_t slab_bytes_;
  const size_t limit_bytes_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<void*> slabs_;
  std::vector<char*> free_;
  size_t in_use_ = 0;   // buffers handed out
  size_t warming_ = 0;  // slabs the warm-up thread is faulting in
  size_t warmed_slabs_ = 0;
  bool stopping_ = false;
  std::thread warmer_;  // last: started once the rest is built
};

// Owns one buffer of a pool for its lifetime.
class PooledBuffer {
 public:
  explicit PooledBuffer(BufferPool* pool) : pool_(pool), data_(pool->Acquire()) {}
  ~PooledBuffer() {
    if (data_) pool_->Release(data_);
  }
  PooledBuffer(PooledBuffer&& other) noexcept : pool_(other.pool_), data_(other.data_) { other.data_ = nullptr; }
  PooledBuffer& operator=(PooledBuffer&&) = delete;
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;

  char* data() { return data_; }
  const char* data() const { return data_; }

 private:
  BufferPool* pool_;
  char* data_;
};

}  // namespace spillfs
