#include "spillfs/core/background_sync.h"

#include <fmt/format.h>
#include <pthread.h>

#include <cstdio>

namespace spillfs {

BackgroundSync::BackgroundSync(std::function<Status()> sync) : sync_(std::move(sync)), thread_([this] { Loop(); }) {}

BackgroundSync::~BackgroundSync() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.Signal();
  thread_.join();
}

void BackgroundSync::Request() {
  {
    MutexLock lock(&mu_);
    if (requested_) return;
    requested_ = true;
  }
  wake_.Signal();
}

void BackgroundSync::Loop() {
  pthread_setname_np(pthread_self(), "spillfs-sync");
  bool failure_logged = false;  // a sticky failure would repeat on every request
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && !requested_) wake_.Wait();
    if (stopping_) return;
    requested_ = false;  // a request from now on needs another sync
    lock.Unlock();
    Status s = sync_();
    if (!s.ok() && !failure_logged) {
      fmt::print(stderr, "spillfs: background sync failed (not logged again): {}\n", s.ToString());
      failure_logged = true;
    }
    syncs_.fetch_add(1, std::memory_order_relaxed);
    lock.Lock();
  }
}

}  // namespace spillfs
