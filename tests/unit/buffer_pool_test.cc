#include "spillfs/fs/buffer_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>

namespace spillfs {
namespace {

constexpr size_t kBuffer = 256 << 10;
constexpr size_t kSlab = 4 << 20;

// Waits up to 10 s for `pred`.
template <typename Pred>
bool Eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(BufferPoolTest, BuffersAreAlignedDistinctAndRecycled) {
  BufferPool pool(kBuffer, kSlab);
  std::set<char*> seen;
  std::vector<char*> held;
  for (int i = 0; i < 40; ++i) {
    char* b = pool.Acquire();
    ASSERT_EQ(reinterpret_cast<uintptr_t>(b) % 4096, 0u);
    ASSERT_TRUE(seen.insert(b).second) << "buffer handed out twice";
    std::memset(b, i, kBuffer);
    held.push_back(b);
  }
  size_t reserved = pool.reserved_bytes();
  EXPECT_EQ(reserved, 3 * kSlab);  // 40 buffers of 16 per slab
  for (char* b : held) pool.Release(b);
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(seen.count(pool.Acquire()));
  EXPECT_EQ(pool.reserved_bytes(), reserved) << "released buffers must be reused, not remapped";
  EXPECT_EQ(pool.warmed_bytes(), 0u) << "no limit: no warm-up";
}

TEST(BufferPoolTest, WarmUpStaysAheadOfUseWithinTheLimit) {
  const size_t limit = 8 * kSlab;
  BufferPool pool(kBuffer, kSlab, limit);
  EXPECT_EQ(pool.reserved_bytes(), 0u) << "nothing is warmed before first use";
  std::vector<char*> held;
  for (int i = 0; i < 20; ++i) held.push_back(pool.Acquire());  // 5 MiB in use
  // As many bytes ahead as are in use: 5 MiB in use, so at least that free.
  EXPECT_TRUE(Eventually([&] { return pool.reserved_bytes() >= 20 * kBuffer + 20 * kBuffer; }))
      << "reserved " << pool.reserved_bytes();
  EXPECT_GT(pool.warmed_bytes(), 0u);
  for (int i = 0; i < 100; ++i) held.push_back(pool.Acquire());  // 30 MiB, near the limit
  EXPECT_TRUE(Eventually([&] { return pool.reserved_bytes() >= limit; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LE(pool.warmed_bytes(), limit) << "the warm-up never goes past the limit";
  for (char* b : held) std::memset(b, 1, kBuffer);  // every buffer is writable memory
  for (char* b : held) pool.Release(b);
}

}  // namespace
}  // namespace spillfs
