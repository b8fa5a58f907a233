// BackgroundSync: runs a sync function on its own thread when asked, so
// that a caller holding locks (Filesystem::CommitTxn holds the commit lock)
// can ask for a sync without waiting for it. The filesystem uses it to make
// the index durable when freed space has waited too long for a sync
// (allocator.h, parked space).
//
// (From 3001f19 to c4c9309 it also synced the data area as the flusher
// wrote, `--bytes-per-sync`; every flush batch is now made durable before it
// is mapped, Filesystem::FlushBeforeMapping, which does that job.)
//
// Request() returns at once; requests that arrive while a sync runs are
// served by one more sync after it (the running one may have missed their
// writes). The sync function runs on this object's own thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"
#include "spillfs/common/thread_annotations.h"

namespace spillfs {

class BackgroundSync {
 public:
  // `sync` makes every write completed before it was called durable. Its
  // failures are logged here; the caller's own syncs must report them (the
  // kernel reports a write-back error to one fdatasync only: BlockStore
  // keeps it sticky).
  explicit BackgroundSync(std::function<Status()> sync);
  ~BackgroundSync();  // waits for a running sync, drops pending requests
  BackgroundSync(const BackgroundSync&) = delete;
  BackgroundSync& operator=(const BackgroundSync&) = delete;

  // Asks for a sync of everything written so far.
  void Request();
  // Syncs finished since construction.
  uint64_t syncs() const { return syncs_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  const std::function<Status()> sync_;
  Mutex mu_;  // a leaf: nothing else is taken under it (the sync runs without it)
  CondVar wake_{&mu_};
  bool requested_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> syncs_{0};
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace spillfs
