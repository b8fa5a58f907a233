// RandomBytes: pseudo-random contents for tests that write bytes and compare
// what comes back. The same seed (or generator state) gives the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

namespace spillfs::testing {

// Fills `out[0, n)` from `rng`: 8 bytes a draw, then one draw per byte of
// a tail shorter than 8.
void FillRandom(std::mt19937_64& rng, char* out, size_t n);

// `n` bytes drawn from `rng` (which moves on by what it gave).
std::string RandomBytes(std::mt19937_64& rng, size_t n);

// Garbage for decoders: fewer than `max_len` bytes (the length drawn first),
// one draw a byte.
std::string RandomGarbage(std::mt19937_64& rng, size_t max_len);

// `n` bytes from a generator seeded with `seed`, in a std::string or any
// other container of bytes (RandomBytes<std::vector<uint8_t>>(n, seed)).
template <typename Bytes = std::string>
Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes out(n, 0);
  FillRandom(rng, reinterpret_cast<char*>(out.data()), n);
  return out;
}

}  // namespace spillfs::testing
