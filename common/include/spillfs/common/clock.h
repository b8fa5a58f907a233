// Clocks: wall-clock time for inode timestamps, monotonic time for intervals.
#pragma once

#include <time.h>

#include <cstdint>

namespace spillfs {

inline int64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Monotonic time in nanoseconds, for intervals (never set by anyone).
inline int64_t SteadyNowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace spillfs
