// Wall-clock time in nanoseconds since the epoch, for inode timestamps.
#pragma once

#include <time.h>

#include <cstdint>

namespace spillfs {

inline int64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace spillfs
