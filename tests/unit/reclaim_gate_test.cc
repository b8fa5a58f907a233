// Unit tests for fs/reclaim_gate.h: freed space is released only once every
// reader that could still see the old mapping has left.
#include "spillfs/store/reclaim_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace spillfs {
namespace {

// Records every release, in order.
class Released {
 public:
  ReclaimGate::ReleaseFn Fn() {
    return [this](const std::vector<PhysicalExtent>& extents) {
      std::lock_guard lock(mu_);
      calls_.push_back(extents);
    };
  }
  std::vector<PhysicalExtent> All() {
    std::lock_guard lock(mu_);
    std::vector<PhysicalExtent> out;
    for (const auto& c : calls_) out.insert(out.end(), c.begin(), c.end());
    return out;
  }
  size_t Calls() {
    std::lock_guard lock(mu_);
    return calls_.size();
  }

 private:
  std::mutex mu_;
  std::vector<std::vector<PhysicalExtent>> calls_;
};

const PhysicalExtent kA{4096, 4096};
const PhysicalExtent kB{65536, 8192};
const PhysicalExtent kC{1 << 20, 4096};

using Extents = std::vector<PhysicalExtent>;

// A gate whose releases `released` records; Enter() lets a reader in until
// its pointer is reset. (The tests that need a release function of their own
// make their own gate.)
class ReclaimGateTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReclaimGate::Reader> Enter() { return std::make_unique<ReclaimGate::Reader>(&gate); }

  Released released;
  ReclaimGate gate{released.Fn()};
};

TEST_F(ReclaimGateTest, ReleasesAtOnceWithoutReaders) {
  gate.Retire({kA, kB});
  EXPECT_EQ(released.All(), (Extents{kA, kB}));
  gate.Retire({});
  EXPECT_EQ(released.Calls(), 1u) << "retiring nothing must not call release";
}

TEST_F(ReclaimGateTest, ReaderInsideDelaysReleaseUntilItLeaves) {
  {
    ReclaimGate::Reader reader(&gate);
    gate.Retire({kA});
    EXPECT_TRUE(released.All().empty());
    gate.Retire({kB});
    EXPECT_TRUE(released.All().empty());
  }
  EXPECT_EQ(released.All(), (Extents{kA, kB}));
}

TEST_F(ReclaimGateTest, ReadersThatEnterLaterDoNotDelayIt) {
  auto early = Enter();
  gate.Retire({kA});
  auto late = Enter();
  EXPECT_TRUE(released.All().empty());
  early.reset();
  EXPECT_EQ(released.All(), (Extents{kA})) << "a reader that entered after the retire held it back";
  late.reset();
  EXPECT_EQ(released.All(), (Extents{kA}));
}

TEST_F(ReclaimGateTest, EveryEarlierReaderMustLeave) {
  auto r1 = Enter();
  auto r2 = Enter();
  gate.Retire({kA});
  r1.reset();
  EXPECT_TRUE(released.All().empty()) << "released while a reader from before the retire is inside";
  r2.reset();
  EXPECT_EQ(released.All(), (Extents{kA}));
}

TEST_F(ReclaimGateTest, EpochsReleaseInOrderOfTheirReaders) {
  auto r1 = Enter();
  gate.Retire({kA});
  auto r2 = Enter();
  gate.Retire({kB});
  auto r3 = Enter();
  gate.Retire({kC});

  // The newest reader leaving first frees nothing: older readers still hold all three.
  r3.reset();
  EXPECT_TRUE(released.All().empty());
  // r2 leaving first: r1 still holds A, B and C (it entered before all of them).
  r2.reset();
  EXPECT_TRUE(released.All().empty());
  r1.reset();
  auto all = released.All();
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.offset < b.offset; });
  EXPECT_EQ(all, (Extents{kA, kB, kC}));
}

TEST_F(ReclaimGateTest, OldestReaderLeavingReleasesOnlyWhatNoOneCanSee) {
  auto r1 = Enter();
  gate.Retire({kA});
  auto r2 = Enter();
  gate.Retire({kB});
  r1.reset();  // A is free of readers; B is still visible to r2
  EXPECT_EQ(released.All(), (Extents{kA}));
  r2.reset();
  EXPECT_EQ(released.All(), (Extents{kA, kB}));
}

TEST_F(ReclaimGateTest, SteadyStreamOfOverlappingReadersDoesNotStarveIt) {
  std::optional<ReclaimGate::Reader> current;
  current.emplace(&gate);
  gate.Retire({kA});
  // Readers hand over to each other: there is always one inside.
  for (int i = 0; i < 10; ++i) {
    auto next = Enter();
    current.reset();
    EXPECT_EQ(released.All(), (Extents{kA})) << "handover " << i;
    current.emplace(&gate);
    next.reset();
  }
  current.reset();
  EXPECT_EQ(released.All(), (Extents{kA}));
}

// Each retire is released with the commit number of the batch that freed
// it (the allocator keeps the space back until that batch is durable).
TEST_F(ReclaimGateTest, ReleasesCarryTheCommitNumberOfTheirRetire) {
  std::vector<std::pair<Extents, uint64_t>> calls;
  ReclaimGate gate(
      [&](const std::vector<PhysicalExtent>& extents, uint64_t commit) { calls.emplace_back(extents, commit); });
  {
    ReclaimGate::Reader reader(&gate);
    gate.Retire({kA}, 7);
    gate.Retire({kB, kC}, 9);
    EXPECT_TRUE(calls.empty());
  }
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], std::make_pair(Extents{kA}, uint64_t{7}));
  EXPECT_EQ(calls[1], std::make_pair(Extents{kB, kC}, uint64_t{9}));
  gate.Retire({kA});
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[2].second, 0u);
}

// Readers look up a "mapping" (a slot number) after entering and check the
// slot is still live while inside; a writer keeps remapping to a fresh slot
// and retiring the old one. A slot may be reused only after release.
TEST_F(ReclaimGateTest, ConcurrentReadersNeverSeeReleasedSpace) {
  constexpr int kSlots = 64;
  constexpr int kReaders = 4;
  constexpr int kRemaps = 20000;
  std::vector<std::atomic<int>> live(kSlots);  // 1 while mapped or retired, 0 once released
  std::mutex pool_mu;
  std::vector<int> pool;  // released slots
  for (int s = 1; s < kSlots; ++s) pool.push_back(s);
  live[0] = 1;
  std::atomic<int> current{0};
  std::atomic<int64_t> released_count{0};

  ReclaimGate gate([&](const std::vector<PhysicalExtent>& extents) {
    std::lock_guard lock(pool_mu);
    for (const auto& e : extents) {
      int slot = static_cast<int>(e.offset);
      live[slot].store(0);
      pool.push_back(slot);
      ++released_count;
    }
  });

  std::atomic<bool> done{false};
  std::atomic<int64_t> violations{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      while (!done.load()) {
        ReclaimGate::Reader reader(&gate);
        int slot = current.load();
        for (int spin = 0; spin < static_cast<int>(rng() % 64); ++spin) {
          if (live[slot].load() != 1) ++violations;
        }
        if (rng() % 8 == 0) std::this_thread::yield();
        if (live[slot].load() != 1) ++violations;
        ++reads;
      }
    });
  }

  int remaps = 0;
  while (remaps < kRemaps) {
    int fresh = -1;
    {
      std::lock_guard lock(pool_mu);
      if (!pool.empty()) {
        fresh = pool.back();
        pool.pop_back();
      }
    }
    if (fresh < 0) {  // every slot retired and held by readers: wait for them
      std::this_thread::yield();
      continue;
    }
    live[fresh].store(1);
    int old = current.exchange(fresh);
    gate.Retire({PhysicalExtent{static_cast<uint64_t>(old), 1}});
    ++remaps;
  }
  while (reads.load() < 1000) std::this_thread::yield();
  done = true;
  for (auto& r : readers) r.join();

  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(reads.load(), 0);
  // With every reader gone, everything retired has been released.
  EXPECT_EQ(released_count.load(), kRemaps);
  std::lock_guard lock(pool_mu);
  EXPECT_EQ(pool.size(), static_cast<size_t>(kSlots - 1));
}

// Many threads retiring and reading at once: everything retired is released
// exactly once, and nothing is lost.
TEST_F(ReclaimGateTest, ConcurrentRetiresAreReleasedExactlyOnce) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 5000;
  std::vector<std::atomic<int>> times(kThreads * kPerThread);
  ReclaimGate gate([&](const std::vector<PhysicalExtent>& extents) {
    for (const auto& e : extents) times[e.offset].fetch_add(1);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      for (int i = 0; i < kPerThread; ++i) {
        std::optional<ReclaimGate::Reader> reader;
        if (rng() % 2) reader.emplace(&gate);
        gate.Retire({PhysicalExtent{static_cast<uint64_t>(t * kPerThread + i), 1}});
      }
    });
  }
  for (auto& t : threads) t.join();
  int wrong = 0;
  for (auto& n : times) wrong += n.load() != 1;
  EXPECT_EQ(wrong, 0);
}

}  // namespace
}  // namespace spillfs
