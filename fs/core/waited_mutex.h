// WaitedMutex: a mutex that knows whether anyone waits for it.
//
// The holder of a long, divisible job (a background flush, which may go on
// with data written while it runs) asks waiting() between steps and stops
// early when a thread waits: an fsync, a writer of a chunk being flushed, a
// truncate. Counting waiters inside lock() covers every such caller without
// each of them having to announce itself. Meets Lockable, so std::lock_guard
// and std::unique_lock work with it.
#pragma once

#include <atomic>
#include <mutex>

namespace spillfs {

class WaitedMutex {
 public:
  void lock() {
    waiters_.fetch_add(1, std::memory_order_relaxed);
    mu_.lock();
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
  bool try_lock() { return mu_.try_lock(); }
  void unlock() { mu_.unlock(); }
  // Whether another thread is blocked in lock() (a hint: it may arrive or
  // give up at any moment).
  bool waited() const { return waiters_.load(std::memory_order_relaxed) > 0; }

 private:
  std::mutex mu_;
  std::atomic<int> waiters_{0};
};

}  // namespace spillfs
