// TaskPool: a few worker threads for the CPU work of the sequential paths
// (block checksums of spill_write, their verification in spill_read), so that
// the thread driving the ring only submits and reaps and the device never
// waits for a hash. Tasks are independent; Latch tells when a group is done.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace spillfs::client {

class TaskPool {
 public:
  explicit TaskPool(unsigned threads);
  ~TaskPool();  // runs what is queued, then joins
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Submit(std::function<void()> task);
  unsigned size() const { return static_cast<unsigned>(workers_.size()); }

 private:
  void Work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Counts the tasks of a group down and keeps the group's first error, with
// its message: the message is thread-local (spill_last_error), so a task's
// must travel back to the thread that reports it.
class Latch {
 public:
  void Add(unsigned n = 1);
  // Ends one task; rc != 0 is kept (with LastError() of this thread) if first.
  void Done(int rc);
  // Waits for every task added so far; returns the first error (its message
  // set on this thread) or 0.
  int Wait();
  // The first error so far, without waiting (0 when none).
  int error();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  unsigned pending_ = 0;
  int error_ = 0;
  std::string message_;
};

}  // namespace spillfs::client
