#include "spillfs/fs/buffer_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace spillfs {
namespace {

constexpr size_t kBuffer = 256 << 10;
constexpr size_t kSlab = 4 << 20;

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
}

// The buffer released last is the next one handed out: a writer whose data
// is flushed as it goes keeps reusing the few buffers still in cache.
TEST(BufferPoolTest, MostRecentlyReleasedBufferComesBackFirst) {
  BufferPool pool(kBuffer, kSlab);
  std::vector<char*> held;
  for (int i = 0; i < 20; ++i) held.push_back(pool.Acquire());
  pool.Release(held[7]);
  pool.Release(held[3]);
  EXPECT_EQ(pool.Acquire(), held[3]);
  EXPECT_EQ(pool.Acquire(), held[7]);
  for (char* b : held) pool.Release(b);
}

// Threads taking and returning buffers never share one, and the pool grows
// only to what was held at once.
TEST(BufferPoolTest, ConcurrentUsersNeverShareABuffer) {
  BufferPool pool(kBuffer, kSlab);
  constexpr int kThreads = 4;
  constexpr int kHeld = 8;
  std::atomic<int> clobbered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        char* mine[kHeld];
        for (char*& b : mine) {
          b = pool.Acquire();
          std::memset(b, t + 1, 64);
        }
        for (char* b : mine) {
          for (int i = 0; i < 64; ++i) clobbered += b[i] != static_cast<char>(t + 1);
          pool.Release(b);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clobbered.load(), 0);
  EXPECT_LE(pool.reserved_bytes(), 2 * kSlab) << "at most 32 buffers were ever held at once";
}

}  // namespace
}  // namespace spillfs
