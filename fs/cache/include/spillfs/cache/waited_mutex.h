// WaitedMutex: a mutex that knows whether anyone waits for it.
//
// The holder of a long, divisible job (a background flush, which may go on
// with data written while it runs) asks waiting() between steps and stops
// early when a thread waits: an fsync, a writer of a chunk being flushed, a
// truncate. Counting waiters inside Lock() covers every such caller without
// each of them having to announce itself. Annotated like Mutex
// (spillfs/common/mutex.h): take it with ExclusiveLock; it is also Lockable,
// for std::unique_lock where the analysis cannot follow the locking anyway.
#pragma once

#include <atomic>

#include "spillfs/common/mutex.h"
#include "spillfs/common/thread_annotations.h"

namespace spillfs {

class CAPABILITY("mutex") WaitedMutex {
 public:
  void Lock() ACQUIRE() {
    waiters_.fetch_add(1, std::memory_order_relaxed);
    mu_.Lock();
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.TryLock(); }
  void Unlock() RELEASE() { mu_.Unlock(); }
  // Lockable.
  void lock() ACQUIRE() { Lock(); }
  bool try_lock() TRY_ACQUIRE(true) { return TryLock(); }
  void unlock() RELEASE() { Unlock(); }
  // Whether another thread is blocked in Lock() (a hint: it may arrive or
  // give up at any moment).
  bool waited() const { return waiters_.load(std::memory_order_relaxed) > 0; }

 private:
  Mutex mu_;
  std::atomic<int> waiters_{0};
};

}  // namespace spillfs
