// Internal to spillfs_testing: what both power-cut journals need of a file.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "spillfs/common/status.h"

namespace spillfs::powercut::internal {

// `what`, with errno's code and text.
inline Status Errno(const std::string& what) {
  int error = errno;
  return Status::Error(error, fmt::format("{}: {}", what, std::strerror(error)));
}

// Reads the whole file at `path` (a journal, after its writer was killed).
inline Status ReadWholeFile(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open " + path);
  out->clear();
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Errno("cannot read " + path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    out->append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return Status::OK();
}

}  // namespace spillfs::powercut::internal
