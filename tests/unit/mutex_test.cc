#include "spillfs/common/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace spillfs {
namespace {

using namespace std::chrono_literals;

// The analysis cannot follow a lock taken on a condition and probed by an
// assertion: the probe stays out of it.
template <typename M>
bool TryAndRelease(M& mu) NO_THREAD_SAFETY_ANALYSIS {
  if (!mu.TryLock()) return false;
  mu.Unlock();
  return true;
}

// Whether nobody holds `mu`, asked from another thread (try_lock by a holder
// is undefined).
template <typename M>
bool IsFree(M& mu) {
  bool free = false;
  std::thread probe([&] { free = TryAndRelease(mu); });
  probe.join();
  return free;
}

// A waiter wakes when signalled, holding the mutex again, and sees the change
// made under it.
TEST(CondVarTest, AWaiterWakesWithTheMutexAndSeesTheChange) {
  Mutex mu;
  CondVar changed(&mu);
  bool ready = false;  // guarded by mu (a local: not annotated)
  std::thread setter([&] {
    std::this_thread::sleep_for(10ms);
    MutexLock lock(&mu);
    ready = true;
    changed.SignalAll();
  });
  {
    MutexLock lock(&mu);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!ready && changed.WaitUntil(deadline)) {
    }
    EXPECT_TRUE(ready);
  }
  setter.join();
}

// WaitUntil gives up at the deadline, with the mutex held again.
TEST(CondVarTest, WaitUntilReturnsFalseAtTheDeadline) {
  Mutex mu;
  CondVar never(&mu);
  MutexLock lock(&mu);
  const auto started = std::chrono::steady_clock::now();
  bool woken = true;
  while (woken) woken = never.WaitUntil(started + 20ms);  // spurious wake-ups wait again
  EXPECT_GE(std::chrono::steady_clock::now() - started, 20ms);
  EXPECT_FALSE(IsFree(mu)) << "the mutex is held again after the wait";
}

// A scoped lock let go in between is not released twice, and one that never
// took its lock releases nothing.
TEST(ExclusiveLockTest, UnlockAndDeferLeaveTheMutexFree) {
  Mutex mu;
  {
    MutexLock lock(&mu);
    lock.Unlock();
    EXPECT_TRUE(IsFree(mu));
    lock.Lock();
    EXPECT_FALSE(IsFree(mu));
  }
  EXPECT_TRUE(IsFree(mu));
  {
    MutexLock deferred(&mu, kDeferLock);
    EXPECT_TRUE(IsFree(mu));
    deferred.Lock();
  }
  EXPECT_TRUE(IsFree(mu));
}

// Readers share a SharedMutex; a writer excludes them.
TEST(SharedMutexTest, ReadersShareAndAWriterExcludes) {
  SharedMutex mu;
  {
    ReaderLock reader(&mu);
    std::thread other([&] {
      ReaderLock second(&mu);  // shared with the first reader: does not block
    });
    other.join();
    EXPECT_FALSE(IsFree(mu));
  }
  {
    WriterLock writer(&mu);
    EXPECT_FALSE(IsFree(mu));
    writer.Unlock();
    EXPECT_TRUE(IsFree(mu));
  }
  EXPECT_TRUE(IsFree(mu));
}

}  // namespace
}  // namespace spillfs
