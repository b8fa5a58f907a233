// AlignedBuffer: a growable byte buffer whose start is aligned for O_DIRECT.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

namespace spillfs {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 4096;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size) { Resize(size); }
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
  // reallocation is needed. New bytes are not initialized.
  void Resize(size_t size) {
    if (size > capacity_) {
      size_t capacity = (size + kAlignment - 1) / kAlignment * kAlignment;
      void* fresh = std::aligned_alloc(kAlignment, capacity);
      if (fresh == nullptr) throw std::bad_alloc();
      std::free(data_);
      data_ = static_cast<char*>(fresh);
      capacity_ = capacity;
    }
    size_ = size;
  }
  void Zero() { std::memset(data_, 0, size_); }

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace spillfs
