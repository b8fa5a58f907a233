// xxh3.h (the code the hash kernels run) against libxxhash on the CPU:
// every length through 2048 (the short paths, 17..128, 129..240 and the long
// loop's first blocks), block boundaries, large and odd sizes, unaligned
// starts, several random contents.
#include "spillfs/cuda/xxh3.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include "support/random_bytes.h"

namespace spillfs::cuda {
namespace {

using Bytes = std::vector<uint8_t>;
using spillfs::testing::RandomBytes;

// Both widths of one input against libxxhash; the failure names the case.
void ExpectSame(const uint8_t* data, size_t len, const char* what) {
  EXPECT_EQ(Xxh3Hash64(data, len), XXH3_64bits(data, len)) << what << " len " << len;
  const XXH128_hash_t want = XXH3_128bits(data, len);
  const Hash128 got = Xxh3Hash128(data, len);
  EXPECT_EQ(got.low64, want.low64) << what << " len " << len;
  EXPECT_EQ(got.high64, want.high64) << what << " len " << len;
}

TEST(Xxh3, EveryLengthThrough2048) {
  for (uint64_t seed : {1, 2, 3}) {
    const Bytes bytes = RandomBytes<Bytes>(2048 + 16, seed);
    for (size_t len = 0; len <= 2048; ++len) {
      ExpectSame(bytes.data(), len, "aligned");
      ExpectSame(bytes.data() + 1 + len % 15, len, "unaligned");
      if (HasFailure()) return;  // one length's report is enough
    }
  }
}

TEST(Xxh3, EmptyInputNeedsNoData) {
  EXPECT_EQ(Xxh3Hash64(nullptr, 0), XXH3_64bits(nullptr, 0));
  EXPECT_EQ(Xxh3Hash128(nullptr, 0).low64, XXH3_128bits(nullptr, 0).low64);
}

TEST(Xxh3, ConstantInputs) {
  // Zeros and ones: no help from random bits to hide a wrong shift or key.
  for (uint8_t fill : {0x00, 0xff}) {
    const std::vector<uint8_t> bytes(70000, fill);
    for (size_t len : {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 4096, 65536, 70000})
      ExpectSame(bytes.data(), len, fill ? "ones" : "zeros");
  }
}

TEST(Xxh3, BlockBoundariesAndLargeSizes) {
  const Bytes bytes = RandomBytes<Bytes>((4 << 20) + 64, 7);
  std::vector<size_t> lengths = {4096,           4095,   4097, 256 << 10, (256 << 10) - 1, (256 << 10) + 1,
                                 (1 << 20) + 17, 4 << 20};
  for (size_t blocks = 1; blocks <= 9; ++blocks)
    for (int delta : {-65, -64, -63, -1, 0, 1, 63, 64, 65}) lengths.push_back(blocks * 1024 + delta);
  for (size_t len : lengths) {
    ExpectSame(bytes.data(), len, "aligned");
    ExpectSame(bytes.data() + 5, len, "unaligned");
  }
}

TEST(Xxh3, RandomLengthsAndContents) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    const size_t len = rng() % (64 << 10);
    const Bytes bytes = RandomBytes<Bytes>(len + 8, rng());
    ExpectSame(bytes.data() + rng() % 8, len, "random");
  }
}

}  // namespace
}  // namespace spillfs::cuda
