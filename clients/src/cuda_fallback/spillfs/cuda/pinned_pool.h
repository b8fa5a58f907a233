// Stand-in (see README): 4 KiB-aligned host slabs, bounded, reused.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace spillfs::cuda {

class PinnedPool;

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedPool* pool, char* data, size_t size) : pool_(pool), data_(data), size_(size) {}
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      pool_ = std::exchange(o.pool_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = o.size_;
    }
    return *this;
  }
  ~PinnedBuffer() { Release(); }
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  inline void Release();
  PinnedPool* pool_ = nullptr;
  char* data_ = nullptr;
  size_t size_ = 0;
};

class PinnedPool {
 public:
  PinnedPool(size_t max_bytes, size_t slab_bytes) : slab_bytes_(slab_bytes), max_slabs_(max_bytes / slab_bytes) {
    if (max_slabs_ == 0) max_slabs_ = 1;
  }
  ~PinnedPool() {
    for (char* p : free_) std::free(p);
  }
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  PinnedBuffer Acquire(size_t bytes) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty() || made_ < max_slabs_; });
    return TakeLocked(bytes);
  }
  std::optional<PinnedBuffer> TryAcquire(size_t bytes) {
    std::lock_guard lock(mu_);
    if (free_.empty() && made_ >= max_slabs_) return std::nullopt;
    return TakeLocked(bytes);
  }
  bool pinned() const { return false; }
  size_t capacity() const { return max_slabs_ * slab_bytes_; }
  size_t in_use() const {
    std::lock_guard lock(mu_);
    return out_ * slab_bytes_;
  }

 private:
  friend class PinnedBuffer;
  PinnedBuffer TakeLocked(size_t) {
    char* p;
    if (!free_.empty()) {
      p = free_.back();
      free_.pop_back();
    } else {
      p = static_cast<char*>(std::aligned_alloc(4096, (slab_bytes_ + 4095) / 4096 * 4096));
      ++made_;
    }
    ++out_;
    return PinnedBuffer(this, p, slab_bytes_);
  }
  void Give(char* p) {
    std::lock_guard lock(mu_);
    free_.push_back(p);
    --out_;
    cv_.notify_one();
  }
  size_t slab_bytes_;
  size_t max_slabs_;
  size_t made_ = 0;
  size_t out_ = 0;
  std::vector<char*> free_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

inline void PinnedBuffer::Release() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Give(data_);
  pool_ = nullptr;
  data_ = nullptr;
}

}  // namespace spillfs::cuda
