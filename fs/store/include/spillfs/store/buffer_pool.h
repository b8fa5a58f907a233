// BufferPool: fixed-size, 4 KiB-aligned buffers carved from large slabs.
//
// The RAM tier takes and returns buffers at memory speed. Fresh memory costs
// a page fault and the zeroing of the page on first touch, so slabs are asked
// for transparent huge pages, and buffers are recycled (most recently
// released first, still in cache) instead of being given back to the OS: a
// sequential writer whose data the flusher keeps writing out runs in a
// bounded, warm set of buffers.
//
// Warm() faults in a bounded part of the pool at mount, before any writer
// runs, so the first file written into a fresh mount is as fast as the
// second, for a slightly longer mount (784bf34).
// There is deliberately no thread that faults slabs in ahead of demand. One
// did (d220ff7) and was removed (f042b4d): it zeroed pages faster than they
// were needed, took CPU from the writers and the flusher, and let the pool
// run away on a fresh mount; ingest into a fresh mount was faster without it
// (docs/results.md, "RAM tier memory").
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"

namespace spillfs {

class BufferPool {
 public:
  // A test seam (spillfs_testing's memory faults, spillfs/testing/memory.h):
  // asked before each slab is mapped; true fails that mapping as if the
  // system had no memory left. The product sets none.
  using SlabFault = std::function<bool()>;

  // `buffer_bytes` must divide `slab_bytes`; both multiples of 4 KiB.
  BufferPool(size_t buffer_bytes, size_t slab_bytes, SlabFault slab_fault = nullptr);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of buffer_bytes(); ENOMEM when none is free and no slab can be
  // mapped (the write that wanted it fails with ENOMEM; the mount goes on).
  Result<char*> Acquire();
  void Release(char* buffer);
  // Maps and faults in whole slabs while the pool would still hold at most
  // `bytes` (best effort: MADV_POPULATE_WRITE, Linux 5.14+; a failed mapping
  // stops it). Warmed memory stays with the pool, as all its memory does. For the start, before any
  // writer runs: unlike a thread that faults in ahead of demand, it takes no
  // CPU from writers.
  void Warm(size_t bytes);

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t reserved_bytes() const;  // memory taken from the OS

 private:
  // False when the slab cannot be mapped.
  bool AddSlabLocked(bool populate) REQUIRES(mu_);

  const size_t buffer_bytes_;
  const size_t slab_bytes_;
  const SlabFault slab_fault_;
  // The last lock in the order (core/filesystem.h): taken under RamTier::mu_
  // or alone, nothing under it (slabs are mapped under it).
  mutable Mutex mu_;
  std::vector<void*> slabs_ GUARDED_BY(mu_);
  std::vector<char*> free_ GUARDED_BY(mu_);
};

// Owns one buffer of a pool for its lifetime.
class PooledBuffer {
 public:
  // A buffer of `pool`; ENOMEM as BufferPool::Acquire.
  static Result<PooledBuffer> Take(BufferPool* pool) {
    SPILLFS_ASSIGN_OR_RETURN(char* data, pool->Acquire());
    return PooledBuffer(pool, data);
  }
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
  PooledBuffer(BufferPool* pool, char* data) : pool_(pool), data_(data) {}

  BufferPool* pool_;
  char* data_;
};

}  // namespace spillfs
