// UnitHashesHost / BlockChecksumsHost (the kernels' code on the CPU) give the
// daemon's dedup key and block checksum (spillfs/common/block_checksum.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "spillfs/common/block_checksum.h"
#include "spillfs/cuda/hash_kernels.h"
#include "spillfs/cuda/runtime.h"
#include "support/random_bytes.h"

namespace spillfs::cuda {
namespace {

using Bytes = std::vector<uint8_t>;
using spillfs::testing::RandomBytes;

TEST(HashHost, UnitHashesAreTheDedupKeys) {
  const size_t length = 5 * kDedupUnitBytes + 12345;  // the partial unit is not hashed
  const Bytes bytes = RandomBytes<Bytes>(length, 1);
  ASSERT_EQ(UnitCount(length, kDedupUnitBytes), 5u);
  std::vector<Hash128> out(6, Hash128{1, 1});
  ASSERT_TRUE(UnitHashesHost(bytes.data(), length, kDedupUnitBytes, out.data()).ok());
  for (size_t u = 0; u < 5; ++u) {
    const XXH128_hash_t want = ContentHash128(bytes.data() + u * kDedupUnitBytes, kDedupUnitBytes);
    EXPECT_EQ(out[u].low64, want.low64) << "unit " << u;
    EXPECT_EQ(out[u].high64, want.high64) << "unit " << u;
  }
  EXPECT_EQ(out[5], (Hash128{1, 1})) << "wrote past the whole units";
}

TEST(HashHost, BlockChecksumsAreTheVolumes) {
  const size_t length = 37 * kChecksumBlockBytes + 777;  // the partial block is hashed over its bytes
  const Bytes bytes = RandomBytes<Bytes>(length, 2);
  ASSERT_EQ(BlockCount(length, kChecksumBlockBytes), 38u);
  std::vector<uint32_t> out(39, 7);
  ASSERT_TRUE(BlockChecksumsHost(bytes.data(), length, kChecksumBlockBytes, out.data()).ok());
  for (size_t b = 0; b < 38; ++b) {
    const size_t n = std::min(kChecksumBlockBytes, length - b * kChecksumBlockBytes);
    EXPECT_EQ(out[b], BlockChecksum(bytes.data() + b * kChecksumBlockBytes, n)) << "block " << b;
  }
  EXPECT_EQ(out[38], 7u) << "wrote past the last block";
}

TEST(HashHost, OtherUnitSizes) {
  const Bytes bytes = RandomBytes<Bytes>(100000, 3);
  for (size_t unit : {1, 16, 200, 241, 1000, 1088, 65536}) {
    std::vector<Hash128> hashes(UnitCount(bytes.size(), unit));
    std::vector<uint32_t> sums(BlockCount(bytes.size(), unit));
    ASSERT_TRUE(UnitHashesHost(bytes.data(), bytes.size(), unit, hashes.data()).ok());
    ASSERT_TRUE(BlockChecksumsHost(bytes.data(), bytes.size(), unit, sums.data()).ok());
    for (size_t u = 0; u < hashes.size(); ++u)
      ASSERT_EQ(hashes[u].low64, XXH3_128bits(bytes.data() + u * unit, unit).low64) << unit << " " << u;
    for (size_t b = 0; b < sums.size(); ++b)
      ASSERT_EQ(sums[b], BlockChecksum(bytes.data() + b * unit, std::min(unit, bytes.size() - b * unit)))
          << unit << " " << b;
  }
}

TEST(HashHost, EdgeArguments) {
  Hash128 h{};
  uint32_t c = 0;
  EXPECT_EQ(UnitHashesHost(nullptr, 10, 0, &h).code(), EINVAL);
  EXPECT_EQ(BlockChecksumsHost(nullptr, 10, 0, &c).code(), EINVAL);
  // Nothing to hash: nothing written, not even read.
  EXPECT_TRUE(UnitHashesHost(nullptr, 0, kDedupUnitBytes, nullptr).ok());
  EXPECT_TRUE(UnitHashesHost(nullptr, kDedupUnitBytes - 1, kDedupUnitBytes, nullptr).ok());
  EXPECT_TRUE(BlockChecksumsHost(nullptr, 0, kChecksumBlockBytes, nullptr).ok());
}

TEST(HashKernels, WithoutADeviceTheyAnswerAnError) {
  if (Available()) GTEST_SKIP() << "a CUDA device is present (cuda_gpu_test covers it)";
  std::vector<uint8_t> bytes(kDedupUnitBytes);
  Hash128 h{};
  uint32_t c = 0;
  const Status units = UnitHashes(bytes.data(), bytes.size(), kDedupUnitBytes, &h, 0);
  const Status blocks = BlockChecksums(bytes.data(), 4096, kChecksumBlockBytes, &c, 0);
  EXPECT_FALSE(units.ok());
  EXPECT_FALSE(blocks.ok());
#if SPILLFS_HAVE_CUDA
  EXPECT_EQ(units.code(), ENODEV) << units.ToString();
#else
  EXPECT_EQ(units.code(), ENOTSUP) << units.ToString();
#endif
}

}  // namespace
}  // namespace spillfs::cuda
