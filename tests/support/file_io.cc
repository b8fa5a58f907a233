#include "support/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>

#include "support/errno_names.h"

namespace spillfs::testing {

void Fd::Reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

int Fd::Close() {
  int rc = fd_ >= 0 ? close(fd_) : 0;
  fd_ = -1;
  return rc;
}

bool WriteAll(int fd, const void* data, size_t size, off_t offset) {
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(fd, bytes + done, size - done, offset + static_cast<off_t>(done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ReadWhole(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  out->clear();
  std::string buf(1 << 20, '\0');
  for (;;) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      int error = errno;
      close(fd);
      errno = error;
      return false;
    }
    if (n == 0) break;
    out->append(buf.data(), static_cast<size_t>(n));
  }
  close(fd);
  return true;
}

std::string ReadFile(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY));
  if (!fd.valid()) {
    ADD_FAILURE() << "open " << path << ": " << ErrnoName(errno);
    return "";
  }
  std::string out;
  std::string buf(1 << 20, '\0');
  for (;;) {
    ssize_t n = pread(fd.get(), buf.data(), buf.size(), static_cast<off_t>(out.size()));
    if (n < 0) {
      ADD_FAILURE() << "pread " << path << ": " << ErrnoName(errno);
      break;
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  return out;
}

void WriteFile(const std::string& path, const std::string& data, mode_t mode) {
  Fd fd(open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, mode));
  ASSERT_TRUE(fd.valid()) << "create " << path << ": " << ErrnoName(errno);
  ASSERT_TRUE(WriteAll(fd.get(), data)) << "write " << path << ": " << ErrnoName(errno);
  ASSERT_EQ(fd.Close(), 0) << "close " << path << ": " << ErrnoName(errno);
}

struct stat Stat(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) ADD_FAILURE() << "stat " << path << ": " << ErrnoName(errno);
  return st;
}

struct stat Lstat(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) ADD_FAILURE() << "lstat " << path << ": " << ErrnoName(errno);
  return st;
}

uint64_t FreeBytes(const std::string& path) {
  struct statvfs sv {};
  if (statvfs(path.c_str(), &sv) != 0) {
    ADD_FAILURE() << "statvfs " << path << ": " << ErrnoName(errno);
    return 0;
  }
  return static_cast<uint64_t>(sv.f_bfree) * sv.f_frsize;
}

}  // namespace spillfs::testing
