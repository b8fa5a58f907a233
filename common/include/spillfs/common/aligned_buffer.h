// AlignedBuffer: a growable byte buffer whose start is aligned for O_DIRECT.
//
// Running out of memory is an answer, not an exception: Resize returns
// ENOMEM, which the daemon passes back to the request that needed the memory
// (a write or read then fails with ENOMEM and the mount goes on serving).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "spillfs/common/status.h"

namespace spillfs {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 4096;

  AlignedBuffer() = default;
  // A buffer of `size` bytes; throws std::bad_alloc where Resize would fail.
  // For setup code and tests: code that serves requests calls Resize.
  explicit AlignedBuffer(size_t size) {
    if (!Resize(size).ok()) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& other) noexcept : data_(other.data_), size_(other.size_), capacity_(other.capacity_) {
    other.data_ = nullptr;
    other.size_ = other.capacity_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      std::free(data_);
      data_ = other.data_;
      size_ = other.size_;
      capacity_ = other.capacity_;
      other.data_ = nullptr;
      other.size_ = other.capacity_ = 0;
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Sets the size; contents are kept up to min(old, new) only when no
  // reallocation is needed. New bytes are not initialized. ENOMEM (the
  // buffer unchanged) when the memory cannot be had.
  [[nodiscard]] Status Resize(size_t size) {
    if (size > capacity_) {
      if (size > SIZE_MAX - kAlignment) return NoMemory();
      size_t capacity = (size + kAlignment - 1) / kAlignment * kAlignment;
      void* fresh = std::aligned_alloc(kAlignment, capacity);
      if (fresh == nullptr) return NoMemory();
      std::free(data_);
      data_ = static_cast<char*>(fresh);
      capacity_ = capacity;
    }
    size_ = size;
    return Status::OK();
  }
  void Zero() { std::memset(data_, 0, size_); }

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  // The message fits std::string's inline buffer: making it takes no memory.
  static Status NoMemory() { return Status::Error(ENOMEM, "out of memory"); }

  char* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace spillfs
