#include "task_pool.h"

#include "error.h"

namespace spillfs::client {

TaskPool::TaskPool(unsigned threads) {
  workers_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void TaskPool::Submit(std::function<void()> task) {
  if (workers_.empty()) {  // no workers: run it here
    task();
    return;
  }
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void TaskPool::Work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing is left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void Latch::Add(unsigned n) {
  std::lock_guard lock(mu_);
  pending_ += n;
}

void Latch::Done(int rc) {
  std::lock_guard lock(mu_);
  if (rc != 0 && error_ == 0) {
    error_ = rc;
    message_ = LastError();
  }
  if (--pending_ == 0) cv_.notify_all();
}

int Latch::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return pending_ == 0; });
  if (error_ == 0) return 0;
  Fail(-error_, message_);
  return error_;
}

int Latch::error() {
  std::lock_guard lock(mu_);
  return error_;
}

}  // namespace spillfs::client
