// RandomBytes: `n` pseudo-random bytes from `seed`, the same for the same
// seed, for tests that write contents and compare what comes back.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace spillfs {

inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, std::min<size_t>(8, n - i));
  }
  return out;
}

}  // namespace spillfs
