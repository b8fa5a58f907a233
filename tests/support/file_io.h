// File helpers for tests that drive a filesystem through system calls: an
// owned descriptor, whole writes and reads, and the stat/statvfs wrappers
// that report a failure to GoogleTest instead of returning it.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spillfs::testing {

// An owned file descriptor, closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor held (if any) and holds `fd` instead.
  void Reset(int fd = -1);
  // Closes now and returns close()'s result (it carries flush errors).
  int Close();

 private:
  int fd_;
};

// pwrite()s all of `data` at `offset`, again after short writes; false (errno
// set) once a pwrite fails or writes nothing.
bool WriteAll(int fd, const void* data, size_t size, off_t offset);
inline bool WriteAll(int fd, std::string_view data, off_t offset = 0) {
  return WriteAll(fd, data.data(), data.size(), offset);
}

// Reads a whole file into *out; false (errno set) when it cannot be opened or read.
bool ReadWhole(const std::string& path, std::string* out);

// The whole file ("" after a failure, which is reported to GoogleTest).
std::string ReadFile(const std::string& path);
// Creates or truncates `path` (with `mode`) to hold `data`; asserts each step.
void WriteFile(const std::string& path, const std::string& data, mode_t mode = 0644);

// stat()/lstat() of `path`; a failure is reported to GoogleTest (and the
// result is zeroed).
struct stat Stat(const std::string& path);
struct stat Lstat(const std::string& path);

// Free bytes of the filesystem holding `path` (statvfs f_bfree * f_frsize;
// 0 after a failure, which is reported to GoogleTest).
uint64_t FreeBytes(const std::string& path);

}  // namespace spillfs::testing
