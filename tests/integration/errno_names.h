// Errno helpers shared by the mounted-volume suites: a readable name for an
// errno in failure messages, and EXPECT_ERRNO for system calls expected to
// fail with a given errno (the one ext4 would give).
#pragma once

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace spillfs::testing {

// "ENOENT" for ENOENT, "success" for 0; a negative value is a child process's
// failure code (permissions_test's helpers report those).
inline std::string ErrnoName(int e) {
  if (e == 0) return "success";
  if (e < 0) return "child process failure " + std::to_string(e);
  const char* name = strerrorname_np(e);
  return name != nullptr ? name : std::to_string(e);
}

}  // namespace spillfs::testing

// Evaluates CALL (a system call returning -1 and setting errno on failure) and
// expects it to fail with errno EXPECTED, or to succeed when EXPECTED is 0.
#define EXPECT_ERRNO(expected, call)                                                                            \
  do {                                                                                                          \
    errno = 0;                                                                                                  \
    long rc_ = static_cast<long>(call);                                                                         \
    int err_ = rc_ < 0 ? errno : 0;                                                                             \
    EXPECT_EQ(err_, (expected)) << #call << " returned " << rc_ << " with " << ErrnoName(err_) << ", expected " \
                                << ErrnoName(expected);                                                         \
  } while (0)
