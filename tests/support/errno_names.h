// Errno helpers: a readable name for an errno in failure messages, and
// EXPECT_ERRNO for system calls expected to fail with a given errno (the one
// ext4 would give).
#pragma once

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

namespace spillfs::testing {

// "ENOENT" for ENOENT, "success" for 0; a negative value is a child process's
// failure code (permissions_test's helpers report those).
std::string ErrnoName(int e);

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
