// BackgroundSync: makes written data durable in the background, so that a
// later fsync finds little left to flush (the idea of RocksDB's
// bytes_per_sync, for the data area).
//
// Why: the write-behind flusher writes a long sequential file to the SSD as
// it arrives, but the writes sit in the device's volatile cache (or, on a
// VM, in the host's page cache) until a flush command; the fsync at the end
// then pays for the whole file at once. Measured on the 2-core VM
// (tools/bench/RESULTS.md, 2026-12-05): after 1 GiB of write-behind, the
// fsync's fdatasync of the image took 0.45-0.67 s with the disk and both
// CPUs idle before it; syncing as the data goes lets that overlap the
// writer.
//
// Request() returns at once; requests that arrive while a sync runs are
// served by one more sync after it (the running one may have missed their
// writes). The sync function runs on this object's own thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "spillfs/status.h"

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
  std::mutex mu_;
  std::condition_variable wake_;
  bool requested_ = false;
  bool stopping_ = false;
  std::atomic<uint64_t> syncs_{0};
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace spillfs
