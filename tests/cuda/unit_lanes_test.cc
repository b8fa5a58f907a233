// The hash kernels' per-thread code (cuda/src/unit_lanes.h) on the CPU: the
// lanes of a unit computed column by column, as 1, 2, 4 or 8 threads would,
// then merged, equal libxxhash's hashes of the unit. The GPU adds only the
// launch and the warp shuffles (cuda_gpu_test checks those).
#include "unit_lanes.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

namespace spillfs::cuda::internal {
namespace {

std::vector<uint64_t> SecretWords() {
  std::vector<uint64_t> words(kSecretWords);
  for (int w = 0; w < kSecretWords; ++w) words[w] = xxh3::Read64(xxh3::kHostSecret + 8 * w);
  return words;
}

// All 8 lanes of the unit at `unit`, 8 / kLanes "threads" in turn.
template <int kLanes>
void Lanes(const uint8_t* unit, size_t unit_bytes, uint64_t (&all)[8]) {
  const std::vector<uint64_t> words = SecretWords();
  for (int lane0 = 0; lane0 < 8; lane0 += kLanes) {
    uint64_t acc[kLanes];
    UnitColumnLanes<kLanes>(unit, unit_bytes, lane0, words.data(), acc);
    for (int l = 0; l < kLanes; ++l) all[lane0 + l] = acc[l];
  }
}

template <int kLanes>
void ExpectUnitHashes(const uint8_t* unit, size_t unit_bytes) {
  uint64_t all[8];
  Lanes<kLanes>(unit, unit_bytes, all);
  const Hash128 got = xxh3::FinishLong128(all, unit_bytes);
  const XXH128_hash_t want = XXH3_128bits(unit, unit_bytes);
  EXPECT_EQ(got.low64, want.low64) << kLanes << " lanes a thread, " << unit_bytes << " bytes";
  EXPECT_EQ(got.high64, want.high64) << kLanes << " lanes a thread, " << unit_bytes << " bytes";
  EXPECT_EQ(xxh3::FinishLong64(all, unit_bytes), XXH3_64bits(unit, unit_bytes))
      << kLanes << " lanes a thread, " << unit_bytes << " bytes";
}

class UnitLanes : public testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(11);
    bytes_.resize((256 << 10) + 4096);
    for (auto& b : bytes_) b = static_cast<uint8_t>(rng());
  }
  void ExpectAllShapes(size_t unit_bytes) {
    ExpectUnitHashes<8>(bytes_.data(), unit_bytes);
    ExpectUnitHashes<4>(bytes_.data(), unit_bytes);
    ExpectUnitHashes<2>(bytes_.data(), unit_bytes);
    ExpectUnitHashes<1>(bytes_.data(), unit_bytes);
  }
  std::vector<uint8_t> bytes_;
};

TEST_F(UnitLanes, EveryStripeCountThroughFiveBlocks) {
  // 256 bytes (4 stripes, no full block) to 5 KiB: every count of stripes in
  // the last block, 1 to 16, with 0 to 4 full blocks before it.
  for (size_t unit_bytes = 256; unit_bytes <= 5 * 1024; unit_bytes += 64) {
    ExpectAllShapes(unit_bytes);
    if (HasFailure()) return;
  }
}

TEST_F(UnitLanes, VolumeSizes) {
  for (size_t unit_bytes : {4096, 64 << 10, 256 << 10}) ExpectAllShapes(unit_bytes);
}

}  // namespace
}  // namespace spillfs::cuda::internal
