#include "spillfs/cache/waited_mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "support/eventually.h"

namespace spillfs {
namespace {

using namespace std::chrono_literals;
using testing::Eventually;

// The holder of the lock sees a thread blocked in lock() (a background flush
// stops taking more work then), and no longer once that thread has it.
TEST(WaitedMutexTest, TheHolderSeesAThreadWaitingForIt) {
  WaitedMutex mu;
  std::unique_lock held(mu);
  EXPECT_FALSE(mu.waited()) << "taking the lock is not waiting for it";
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    std::lock_guard lock(mu);
    got = true;
  });
  EXPECT_TRUE(Eventually([&] { return mu.waited(); }, 10s)) << "the blocked thread was not counted";
  EXPECT_FALSE(got.load());
  held.unlock();
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_FALSE(mu.waited()) << "a thread that got the lock still counts as waiting";
  EXPECT_TRUE(mu.try_lock());
  EXPECT_FALSE(mu.waited()) << "try_lock never waits";
  mu.unlock();
}

}  // namespace
}  // namespace spillfs
