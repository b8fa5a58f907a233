// RamTierFlusher: takes the RAM tier's cached data to the SSD. A flush
// gathers a file's chunks into batches, hashes and deduplicates them
// (Dedup), plans where they go (PlanSegments), writes them with io_uring and,
// once the data area is durable, has the layer above map them in the index:
// the one step of a flush that is not the cache's, behind FlushCommitter.
// Batches are pipelined: the next ones are written while the oldest waits for
// its sync and is mapped. A background thread flushes files by age and under
// memory pressure.
//
// Thread safety: every method may be called from any thread. A flush of an
// inode holds its InodeLocks::Flush lock throughout, and its Io lock only to
// pick chunks and to commit (inode_locks.h states the order of every lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "spillfs/cache/dedup.h"
#include "spillfs/cache/inode_locks.h"
#include "spillfs/cache/ram_tier.h"
#include "spillfs/cache/segment_plan.h"
#include "spillfs/common/status.h"
#include "spillfs/store/allocator.h"
#include "spillfs/store/block_store.h"

namespace spillfs {

// A batch of cached chunks on its way to the SSD.
struct FlushBatch {
  std::shared_ptr<RamTier::File> file;
  std::vector<uint64_t> chunks;  // chunk indexes, marked flushing
  std::vector<Segment> segments;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // file ranges replaced, sorted
  std::vector<SharedRef> shared;                      // dedup hits
  uint64_t total = 0;                                 // valid bytes gathered
  uint64_t hold = 0;                                  // space promise taken from the file
  uint64_t reserved_from_hold = 0;
  SegmentPlan plan;
  std::future<Status> written;  // the SSD writes of plan.slices
};

// What a flush needs of the layer above (the POSIX core implements it): the
// two steps of the crash order that concern the index (docs/design.md).
class FlushCommitter {
 public:
  virtual ~FlushCommitter() = default;
  // Crash order rule 2: makes the data area durable before a batch that maps
  // data just written to it is committed (nothing for an ephemeral file).
  // REQUIRES: the inode's Flush lock; no other lock.
  virtual Status FlushBeforeMapping(InodeNumber ino) = 0;
  // Maps the written batch in the index in one atomic batch and ends its
  // chunks' flush (RamTier::FinishFlush). A batch that cannot commit is given
  // back (RamTierFlusher::AbandonBatch, its space unreserved) before the
  // error returns; EAGAIN when a dedup hit vanished meanwhile (the flusher
  // retries without dedup). A batch with no chunks commits the overlay's size
  // and mtime only.
  // REQUIRES: the inode's Flush lock and its Io lock, exclusive.
  virtual Status CommitBatch(InodeNumber ino, FlushBatch* batch) = 0;
};

// How much of a file a flush takes.
enum class FlushScope {
  kAll,         // every cached block present when the flush starts (fsync, close)
  kBackground,  // all but a partly filled last chunk, which a writer is likely filling;
                // and, for a durable file, chunks filled while the flush runs
};

class RamTierFlusher {
 public:
  struct Options {
    // RAM-tier data flushed per batch (rounded down to whole chunks, at least one).
    uint64_t batch_bytes = 64ull << 20;
    // Non-ephemeral dirty data older than this is flushed by the background thread.
    int64_t age_ms = 2000;
    // Deduplicate flushed data.
    bool dedup = false;
  };

  // Uses the objects given, which must outlive it; `committer` is called
  // back from every flush.
  RamTierFlusher(RamTier* tier, Dedup* dedup, BlockStore* store, Allocator* allocator, InodeLocks* locks,
                 Dedup::BlockSums block_sums, uint64_t block_size, FlushCommitter* committer, const Options& options);
  // REQUIRES: Stop() called, or Start() never called.
  ~RamTierFlusher();
  RamTierFlusher(const RamTierFlusher&) = delete;
  RamTierFlusher& operator=(const RamTierFlusher&) = delete;

  // Starts and stops the background thread (flushes by age and pressure).
  // Stop waits for a flush in progress to end; flushes may still be asked
  // for after it (a final FlushAll).
  void Start();
  void Stop();

  // Flushes the file's cached data (takes its Flush lock).
  Status FlushFile(InodeNumber ino, FlushScope scope = FlushScope::kAll);
  // The same, every step under the locks the caller holds.
  // REQUIRES: the inode's Flush lock and its Io lock, exclusive.
  Status FlushLocked(InodeNumber ino);
  // Flushes the cached data of `inos`, up to `at_once` files at a time
  // (each on a thread of its own, one inode's locks a thread; 0: as many as
  // the background flusher takes, FilesFlushedAtOnce): small files flushed
  // together share their syncs of the data area (BlockStore::Flush) instead
  // of waiting for one each. The first error is returned.
  Status FlushFiles(const std::vector<InodeNumber>& inos, FlushScope scope, size_t at_once = 0);
  // Flushes every cached file (ephemeral ones too); the first error is returned.
  Status FlushAll();
  // Gives back what a batch that will not commit took: the space promise
  // goes back to the file, the chunks are thawed for a later flush. The
  // caller unreserves batch->plan.space if it was reserved.
  // REQUIRES: the inode's Io lock, exclusive.
  void AbandonBatch(FlushBatch* batch);

 private:
  // Takes the Io lock for each short step unless `locked` (then the caller
  // holds it throughout).
  Status FlushChunks(InodeNumber ino, FlushScope scope, bool locked);
  // Takes the Flush lock for a background flush, or says to skip the file (false).
  bool BackgroundFlushLock(InodeNumber ino, std::unique_lock<WaitedMutex>* flush_lock);
  std::unique_lock<SharedMutex> IoLockUnlessHeld(InodeNumber ino, bool held);
  // Starts a planned batch's SSD writes and the flush after them: on their
  // own thread, or `deferred` to the wait (the caller holds the locks, or the
  // batch is a flush's only one).
  void StartBatchWrites(InodeNumber ino, FlushBatch* batch, bool deferred);
  // Waits for a started batch's writes and maps them; a batch that cannot be
  // mapped is given back. Retries once without dedup.
  Status MapWrittenBatch(InodeNumber ino, std::unique_ptr<FlushBatch> batch, bool locked);
  // Freezes the chunks (RamTier::Freeze) and makes their valid runs the
  // batch's segments (Io lock exclusive held by the caller).
  void GatherBatch(const std::vector<uint64_t>& chunks, FlushBatch* batch);
  // Hashes, deduplicates and reserves space; fills the batch's plan.
  Status PlanBatch(FlushBatch* batch, bool dedup);
  // A batch's writes, then the committer's FlushBeforeMapping.
  Status WriteForMapping(InodeNumber ino, const std::vector<IoSlice>& slices);
  void Loop();

  RamTier& tier_;
  Dedup& dedup_;
  BlockStore& store_;
  Allocator& allocator_;
  InodeLocks& locks_;
  const Dedup::BlockSums block_sums_;
  const uint64_t block_size_;
  FlushCommitter& committer_;
  const Options options_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace spillfs
