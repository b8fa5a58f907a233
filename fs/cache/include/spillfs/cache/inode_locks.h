// InodeLocks: the per-inode locks of the file data, striped, and the order in
// which every lock of the daemon is taken.
//
// Two locks per inode, by stripe (inodes share a stripe: a thread holds the
// locks of one inode at a time). The RAM tier's flusher (ram_tier_flusher.h)
// and the POSIX core (core/filesystem.h) both take them.
//
// ---- The locks, in the order they are taken (outer first) ----
//
// 1. Flush(ino): held for the whole of a flush of the inode, and by every
//    operation that drops or rewrites cached chunks other than by write() or
//    maps data (truncate, fallocate, write-through, direct commit), and by a
//    change of the ephemeral flag (Filesystem::FlushForEphemeralChange). A
//    background flush gives it up early when someone waits for it
//    (WaitedMutex::waited).
// 2. Io(ino): exclusive to change a file's bytes, size or RAM-tier chunks
//    (RamTier::File's chunks are guarded by it), shared to read them. Never
//    taken before the flush lock.
// 3. Filesystem::mu_, the core's commit lock: namespace changes, the inode
//    table, and every commit of an index batch (the allocator's deltas are
//    worked out against the state the batch applies to).
// 4. Leaves, taken last and briefly, with no other lock taken under them but
//    BufferPool::mu_ under RamTier::mu_ (ram_tier.h): RamTier::mu_,
//    ReadAhead::mu_, Allocator::mu_, ReclaimGate::mu_, BackgroundSync::mu_,
//    BlockStore's sync lock, BufferPool::mu_, Filesystem::unsettled_mu_,
//    Filesystem::records_mu_ (the record cache).
// Above 1: the control plane's ControlPlane::Handle::mu, then
// ControlPlane::mu_, which call into the core. The data writes and syncs of a
// flush run with none of 2-4 held; a read-ahead fetch takes none of 1-3
// (Filesystem::DeleteInode waits for the file's fetches under mu_:
// ReadAhead::Forget).
//
// Clang's analysis (tools/check-thread-safety.sh) checks what is marked:
// GUARDED_BY members, and REQUIRES on the methods that need a lock held. It
// does not check the order.
//
// Thread safety: the locks are the synchronization; the object is fixed.
#pragma once

#include <array>
#include <cstddef>

#include "spillfs/cache/waited_mutex.h"
#include "spillfs/common/mutex.h"
#include "spillfs/kvindex/records.h"

namespace spillfs {

class InodeLocks {
 public:
  static constexpr size_t kStripes = 256;

  WaitedMutex& Flush(InodeNumber ino) { return flush_[ino % kStripes]; }
  SharedMutex& Io(InodeNumber ino) { return io_[ino % kStripes]; }

 private:
  std::array<WaitedMutex, kStripes> flush_;
  std::array<SharedMutex, kStripes> io_;
};

}  // namespace spillfs
