#include "spillfs/core/background_sync.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "support/eventually.h"

namespace spillfs {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;

// A sync function that counts its calls and, while `hold` is set, blocks
// inside the call until released.
class HeldSync {
 public:
  Status operator()() {
    std::unique_lock lock(mu_);
    ++calls_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return !hold_; });
    return Status::OK();
  }
  void Release() {
    std::lock_guard lock(mu_);
    hold_ = false;
    changed_.notify_all();
  }
  bool WaitForCalls(int n) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, 10s, [&] { return calls_ >= n; });
  }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool hold_ = true;
  int calls_ = 0;
};

bool WaitForSyncs(const BackgroundSync& sync, uint64_t n) {
  return Eventually([&] { return sync.syncs() >= n; }, 10s, 1ms);
}

TEST(BackgroundSyncTest, NothingRunsUntilAsked) {
  std::atomic<int> calls{0};
  {
    BackgroundSync sync([&] {
      ++calls;
      return Status::OK();
    });
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(sync.syncs(), 0u);
  }
  EXPECT_EQ(calls.load(), 0);
}

TEST(BackgroundSyncTest, RequestsDuringASyncAreServedByOneMoreSync) {
  HeldSync held;
  BackgroundSync sync([&] { return held(); });
  sync.Request();
  ASSERT_TRUE(held.WaitForCalls(1));
  // The first sync is running and may have missed these requests' writes.
  for (int i = 0; i < 10; ++i) sync.Request();
  held.Release();
  ASSERT_TRUE(WaitForSyncs(sync, 2));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(held.calls(), 2);
  EXPECT_EQ(sync.syncs(), 2u);
  sync.Request();  // idle again: a new request is a new sync
  ASSERT_TRUE(WaitForSyncs(sync, 3));
  EXPECT_EQ(held.calls(), 3);
}

TEST(BackgroundSyncTest, AFailedSyncIsCountedAndTheThreadGoesOn) {
  std::atomic<int> calls{0};
  BackgroundSync sync([&] { return ++calls == 1 ? Status::IOError("injected") : Status::OK(); });
  sync.Request();
  ASSERT_TRUE(WaitForSyncs(sync, 1));
  sync.Request();
  ASSERT_TRUE(WaitForSyncs(sync, 2));
  EXPECT_EQ(calls.load(), 2);
}

TEST(BackgroundSyncTest, DestructionWaitsForTheRunningSync) {
  HeldSync held;
  std::atomic<bool> destroyed{false};
  auto sync = std::make_unique<BackgroundSync>([&] { return held(); });
  sync->Request();
  ASSERT_TRUE(held.WaitForCalls(1));
  std::thread destroyer([&] {
    sync.reset();
    destroyed = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(destroyed.load());
  held.Release();
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

}  // namespace
}  // namespace spillfs
