// BufferPool: fixed-size, 4 KiB-aligned buffers carved from large slabs.
//
// The RAM tier takes and returns buffers at memory speed. Fresh memory costs
// one page fault per 4 KiB on first touch (on paravirtualized machines that
// made a 1 MiB copy ~20x slower), so slabs are asked for transparent huge
// pages and buffers are recycled instead of being given back to the OS.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

namespace spillfs {

class BufferPool {
 public:
  // `buffer_bytes` must divide `slab_bytes`; both multiples of 4 KiB.
  BufferPool(size_t buffer_bytes, size_t slab_bytes);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of buffer_bytes(); never null (throws std::bad_alloc).
  char* Acquire();
  void Release(char* buffer);

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t reserved_bytes() const;  // memory taken from the OS

 private:
  const size_t buffer_bytes_;
  const size_t slab_bytes_;
  mutable std::mutex mu_;
  std::vector<void*> slabs_;
  std::vector<char*> free_;
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
