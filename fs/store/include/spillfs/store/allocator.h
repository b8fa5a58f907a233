// Allocator: free space of the data area, kept in the index's `free` family.
//
// Two views of free space, because allocation and commit are separate steps:
//  - `persisted_`: exactly what the `free` family holds once every committed
//    batch is applied. Changed only by Commit*(), which also write the matching
//    key changes into the caller's batch. Callers serialize Commit*() and the
//    Index::Commit of that batch (the filesystem's commit lock), so the deltas
//    are computed against the state the batch will be applied to.
//  - `available_`: what may be handed out now: persisted free space minus
//    reservations, and without space freed by a batch until Release() says
//    no reader can still see the old mapping and that batch is durable.
// A crash between Reserve() and the commit leaks nothing: the index still
// lists the space as free.
//
// Why freed space waits for durability: until the batch that freed it (an
// overwrite, unlink or truncate) is durable, a power cut can bring the old
// mapping back. Had the space been reused meanwhile, the old file would then
// name someone else's bytes: a file fsync'd before that unlink or overwrite
// would read EIO or, without checksums, wrong bytes. So space released with
// the commit number of an index batch that is not yet durable is `parked`
// until Durable() says that batch is. Parked space counts as free for holds
// and for available_bytes(): when a reservation needs it, Reserve() calls the
// shortage handler (the filesystem syncs the index) and tries again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"
#include "spillfs/kvindex/index.h"
#include "spillfs/store/block_store.h"

namespace spillfs {

class Allocator {
 public:
  // `unit`: every offset and length is a multiple of it (the block size).
  explicit Allocator(uint64_t unit) : unit_(unit) {}

  // Loads the free list from the index.
  Status Load(const Index& index);

  // Called, without the allocator's lock, when a reservation fits only with
  // parked space, to make it durable (Durable() is called); then the
  // reservation is tried once more. When it fails, the reservation fails with
  // its error instead of ENOSPC: the space exists, but cannot be used (a
  // failed sync of the data area keeps it parked until a remount). Set
  // before use.
  void SetShortageHandler(std::function<Status()> handler) { shortage_ = std::move(handler); }

  // Reserves `length` bytes (a multiple of unit) as one or more extents,
  // preferring one contiguous run after the last allocation. ENOSPC when the
  // available space, parked space included, is smaller than `length`.
  // `from_hold` bytes of an earlier Hold() are converted into this reservation.
  Result<std::vector<PhysicalExtent>> Reserve(uint64_t length, uint64_t from_hold = 0) EXCLUDES(mu_);
  // Delayed allocation: promises `bytes` to data waiting in the RAM tier, so
  // write() can fail with ENOSPC when the data arrives rather than at flush.
  Status Hold(uint64_t bytes);
  void ReleaseHold(uint64_t bytes);
  // Returns reserved extents that will not be committed.
  void Unreserve(const std::vector<PhysicalExtent>& extents);

  // Records in `batch` that reserved `extents` are now mapped.
  void CommitAllocated(const std::vector<PhysicalExtent>& extents, Index::Batch* batch);
  // Records in `batch` that `extents` are free again. They become available
  // only through Release(), after the batch is committed and no reader can
  // still be reading them.
  void CommitFreed(const std::vector<PhysicalExtent>& extents, Index::Batch* batch);
  // `commit`: the number of the index batch that freed `extents`; the space
  // is parked until Durable() reaches it. 0: usable now.
  void Release(const std::vector<PhysicalExtent>& extents, uint64_t commit = 0);
  // Every index batch numbered up to `commit` is durable (Index::durable_commit).
  void Durable(uint64_t commit);

  // Space that can still be promised: available plus parked, minus holds.
  uint64_t available_bytes() const;
  uint64_t persisted_free_bytes() const;
  // Space released but waiting for its batch to become durable.
  uint64_t parked_bytes() const;
  // How long the oldest parked space has waited (zero when none is parked).
  std::chrono::steady_clock::duration parked_for() const;
  // Snapshot of the persisted free list (for checks and tools).
  std::map<uint64_t, uint64_t> persisted() const;

 private:
  static void Insert(std::map<uint64_t, uint64_t>* map, uint64_t offset, uint64_t length, Index::Batch* batch);
  static void Remove(std::map<uint64_t, uint64_t>* map, uint64_t offset, uint64_t length, Index::Batch* batch);
  // One reservation attempt; `short_of_parked` says whether parked space
  // would have satisfied it.
  Result<std::vector<PhysicalExtent>> TryReserve(uint64_t length, uint64_t from_hold, bool* short_of_parked)
      EXCLUDES(mu_);
  void MakeAvailable(const std::vector<PhysicalExtent>& extents) REQUIRES(mu_);

  struct Parked {
    std::vector<PhysicalExtent> extents;
    std::chrono::steady_clock::time_point since;
  };

  const uint64_t unit_;
  // A leaf in the lock order (core/filesystem.h): nothing is taken under it,
  // and the shortage handler runs without it. Commit*() run under the
  // filesystem's commit lock, which is taken before it.
  mutable Mutex mu_;
  std::map<uint64_t, uint64_t> persisted_ GUARDED_BY(mu_);  // offset -> length, coalesced
  std::map<uint64_t, uint64_t> available_ GUARDED_BY(mu_);  // offset -> length, coalesced
  uint64_t persisted_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t available_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t held_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t cursor_ GUARDED_BY(mu_) = 0;                     // next-fit position
  std::multimap<uint64_t, Parked> parked_ GUARDED_BY(mu_);  // commit number -> space it freed
  uint64_t parked_bytes_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point oldest_parked_ GUARDED_BY(mu_);  // valid while parked_ is non-empty
  uint64_t durable_ GUARDED_BY(mu_) = 0;                                 // highest durable commit number
  // Set once before use (SetShortageHandler); read without the lock.
  std::function<Status()> shortage_;
};

}  // namespace spillfs
