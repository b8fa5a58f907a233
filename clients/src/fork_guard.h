// ForkGuard: holds a set of mutexes across fork(), so that a child never
// inherits a container another thread of the parent was half way through
// changing (a DataLoader worker forked while the training thread caches a
// layout, say). Through pthread_atfork: before fork() the forking thread
// takes every registered mutex (after the threads inside them leave), and
// both processes unlock them after it. The critical sections guarded so must
// be short and must never wait for the forking thread.
//
// Not covered: a child made without the atfork handlers (_Fork(), a raw
// clone) inherits the mutexes as they were, and a fork() from a signal
// handler that interrupted a guarded section deadlocks in the handler.
#pragma once

#include <initializer_list>
#include <mutex>
#include <vector>

namespace spillfs::client {

class ForkGuard {
 public:
  // Registers `mutexes`, taken in this order before every fork() while this
  // guard lives. They must outlive it (declare the guard after them).
  ForkGuard(std::initializer_list<std::mutex*> mutexes);
  ~ForkGuard();
  ForkGuard(const ForkGuard&) = delete;
  ForkGuard& operator=(const ForkGuard&) = delete;

 private:
  static void BeforeFork();
  static void AfterFork();  // in the parent and in the child

  std::vector<std::mutex*> mutexes_;
};

}  // namespace spillfs::client
