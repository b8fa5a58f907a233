// PinnedPool on whatever memory this machine gives it (host memory on a CPU
// machine, pinned where a GPU is present): alignment, reuse, the bound,
// blocking, coalescing, concurrency.
#include "spillfs/cuda/pinned_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "spillfs/cuda/runtime.h"

namespace spillfs::cuda {
namespace {

constexpr size_t kMiB = 1 << 20;

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % PinnedPool::kAlignment == 0; }

TEST(PinnedPool, BuffersAreAlignedAndRoundedToPages) {
  PinnedPool pool(4 * kMiB, kMiB);
  EXPECT_EQ(pool.pinned(), Available());
  EXPECT_EQ(pool.capacity(), 4 * kMiB);
  EXPECT_EQ(pool.reserved(), 0u) << "nothing is allocated before it is needed";
  PinnedBuffer a = pool.Acquire(1);
  PinnedBuffer b = pool.Acquire(5000);
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  EXPECT_TRUE(Aligned(a.data()));
  EXPECT_TRUE(Aligned(b.data()));
  EXPECT_EQ(a.size(), 1u);
  EXPECT_EQ(a.capacity(), 4096u);
  EXPECT_EQ(b.capacity(), 8192u);
  EXPECT_EQ(pool.in_use(), 12288u);
  std::memset(b.data(), 0xab, b.capacity());  // all of it is usable
  EXPECT_EQ(pool.reserved(), kMiB);
}

TEST(PinnedPool, BuffersAreReused) {
  PinnedPool pool(8 * kMiB, 4 * kMiB);
  void* first = nullptr;
  for (int i = 0; i < 100; ++i) {
    PinnedBuffer buffer = pool.Acquire(3 * kMiB);
    ASSERT_TRUE(buffer);
    if (i == 0) first = buffer.data();
    EXPECT_EQ(buffer.data(), first) << "round " << i;
  }
  EXPECT_EQ(pool.reserved(), 4 * kMiB) << "one slab served every round";
  EXPECT_EQ(pool.in_use(), 0u);
}

TEST(PinnedPool, TheBoundHolds) {
  PinnedPool pool(4 * kMiB, kMiB);
  std::vector<PinnedBuffer> held;
  for (int i = 0; i < 4; ++i) {
    std::optional<PinnedBuffer> buffer = pool.TryAcquire(kMiB);
    ASSERT_TRUE(buffer && *buffer) << i;
    held.push_back(std::move(*buffer));
  }
  EXPECT_EQ(pool.in_use(), 4 * kMiB);
  EXPECT_EQ(pool.reserved(), 4 * kMiB);
  EXPECT_FALSE(pool.TryAcquire(4096).has_value()) << "the pool is at its bound";
  held.pop_back();
  std::optional<PinnedBuffer> again = pool.TryAcquire(kMiB);
  EXPECT_TRUE(again && *again);
  EXPECT_EQ(pool.reserved(), 4 * kMiB);
}

TEST(PinnedPool, RequestsThatCanNeverBeServedAreEmpty) {
  PinnedPool pool(4 * kMiB, kMiB);
  EXPECT_FALSE(pool.Acquire(0));
  EXPECT_FALSE(pool.Acquire(kMiB + 1)) << "larger than a slab";
  std::optional<PinnedBuffer> big = pool.TryAcquire(2 * kMiB);
  ASSERT_TRUE(big.has_value());
  EXPECT_FALSE(*big);
  // A slab is never larger than the bound.
  PinnedPool small(10000, kMiB);
  EXPECT_EQ(small.slab_bytes(), 12288u);
  EXPECT_EQ(small.capacity(), 12288u);
  EXPECT_TRUE(small.Acquire(12288));
}

TEST(PinnedPool, AcquireWaitsForARelease) {
  PinnedPool pool(2 * kMiB, kMiB);
  PinnedBuffer a = pool.Acquire(kMiB);
  PinnedBuffer b = pool.Acquire(kMiB);
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    PinnedBuffer c = pool.Acquire(kMiB / 2);
    EXPECT_TRUE(c);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got) << "Acquire returned while the pool was at its bound";
  b.Reset();
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(pool.in_use(), kMiB);
}

TEST(PinnedPool, FreedNeighboursCoalesce) {
  PinnedPool pool(kMiB, kMiB);
  std::vector<PinnedBuffer> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(pool.Acquire(kMiB / 4));
  // Return them out of order: the whole slab must be one free range again.
  for (int i : {1, 3, 0, 2}) quarters[i].Reset();
  std::optional<PinnedBuffer> whole = pool.TryAcquire(kMiB);
  ASSERT_TRUE(whole && *whole);
  EXPECT_EQ(pool.reserved(), kMiB);
}

TEST(PinnedPool, MovedBuffersReturnOnce) {
  PinnedPool pool(kMiB, kMiB);
  PinnedBuffer a = pool.Acquire(4096);
  PinnedBuffer b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(pool.in_use(), 4096u);
  PinnedBuffer c = pool.Acquire(8192);
  c = std::move(b);  // c's own buffer goes back
  EXPECT_EQ(pool.in_use(), 4096u);
  c.Reset();
  EXPECT_EQ(pool.in_use(), 0u);
}

TEST(PinnedPool, ManyThreads) {
  PinnedPool pool(8 * kMiB, 2 * kMiB);
  std::vector<std::thread> threads;
  std::atomic<int> corrupt{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 300; ++i) {
        PinnedBuffer buffer = pool.Acquire(1 + rng() % (kMiB + kMiB / 2));
        if (!buffer) {
          ++corrupt;
          return;
        }
        auto* p = static_cast<uint8_t*>(buffer.data());
        std::memset(p, t + 1, buffer.size());
        std::this_thread::yield();
        for (size_t k = 0; k < buffer.size(); k += 997)
          if (p[k] != t + 1) ++corrupt;  // another thread wrote into our buffer
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupt, 0);
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_LE(pool.reserved(), pool.capacity());
}

}  // namespace
}  // namespace spillfs::cuda
