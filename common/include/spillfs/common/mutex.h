// Mutex, SharedMutex and the scoped locks over them: std::mutex and
// std::shared_mutex with Clang's thread-safety annotations
// (thread_annotations.h), which libstdc++'s types lack, so that a clang build
// checks GUARDED_BY and REQUIRES against the locks actually taken. The shape
// is LevelDB's port::Mutex, port::CondVar and MutexLock. Everything inlines
// to the std calls.
//
//   Mutex mu_;
//   uint64_t count_ GUARDED_BY(mu_);
//   void AddLocked(uint64_t n) REQUIRES(mu_) { count_ += n; }
//   void Add(uint64_t n) { MutexLock lock(&mu_); AddLocked(n); }
//
// Take them with these scoped locks, not std::lock_guard or std::unique_lock:
// the analysis does not see locks taken by the std wrappers (lock(), unlock()
// and the like are there so the std wrappers and std::condition_variable_any
// compile, as for std::mutex; the clang check then reports what they guard as
// taken without the lock).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "spillfs/common/thread_annotations.h"

namespace spillfs {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the lock (not checked).
  void AssertHeld() ASSERT_CAPABILITY(this) {}
  // Lockable.
  void lock() ACQUIRE() { Lock(); }
  void unlock() RELEASE() { Unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return TryLock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Exclusive (writers) or shared (readers) ownership.
class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void LockShared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RELEASE_SHARED() { mu_.unlock_shared(); }
  // Lockable and SharedLockable.
  void lock() ACQUIRE() { Lock(); }
  void unlock() RELEASE() { Unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return TryLock(); }
  void lock_shared() ACQUIRE_SHARED() { LockShared(); }
  void unlock_shared() RELEASE_SHARED() { UnlockShared(); }

 private:
  std::shared_mutex mu_;
};

// Tags for the scoped locks: the caller has just taken the lock itself
// (adopt), or the lock is taken later, if at all, with Lock() (defer).
struct AdoptLock {};
inline constexpr AdoptLock kAdoptLock{};
struct DeferLock {};
inline constexpr DeferLock kDeferLock{};

// Holds `mu` exclusively for its scope: a Mutex, a SharedMutex or any other
// annotated lock with Lock() and Unlock(). Unlock() and Lock() let it go and
// take it again in between; it is released at the end only if held then.
template <typename M>
class SCOPED_CAPABILITY ExclusiveLock {
 public:
  explicit ExclusiveLock(M* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ExclusiveLock(M* mu, AdoptLock) REQUIRES(mu) : mu_(mu) {}
  ExclusiveLock(M* mu, DeferLock) EXCLUDES(mu) : mu_(mu), held_(false) {}
  ~ExclusiveLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  ExclusiveLock(const ExclusiveLock&) = delete;
  ExclusiveLock& operator=(const ExclusiveLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  M* const mu_;
  bool held_ = true;
};

using MutexLock = ExclusiveLock<Mutex>;
using WriterLock = ExclusiveLock<SharedMutex>;

// Holds a SharedMutex shared (a reader) for its scope; Unlock() gives it
// back early.
class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderLock() RELEASE() {
    if (held_) mu_->UnlockShared();
  }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

  void Unlock() RELEASE() {
    mu_->UnlockShared();
    held_ = false;
  }

 private:
  SharedMutex* const mu_;
  bool held_ = true;
};

// A condition variable whose waiters hold one Mutex: the one given here.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Gives the mutex up while it waits (the caller holds it); may wake
  // spuriously, so wait in a loop over the condition.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // The same, until `deadline`: false once it has passed.
  bool WaitUntil(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace spillfs
