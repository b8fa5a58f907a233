#include "support/random_bytes.h"

#include <cstring>

namespace spillfs::testing {

void FillRandom(std::mt19937_64& rng, char* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<char>(rng());
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  FillRandom(rng, out.data(), n);
  return out;
}

std::string RandomGarbage(std::mt19937_64& rng, size_t max_len) {
  std::string out(rng() % max_len, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

}  // namespace spillfs::testing
