// Filesystem: flushes of the write-back RAM tier to the SSD (batches written
// with io_uring, synced, then mapped in the index) and the background flusher.
// Reads and writes served by the tier are in ram_tier_io.cc.
#include <fmt/format.h>

#include <pthread.h>

#include <chrono>
#include <deque>
#include <future>
#include <system_error>
#include <thread>

#include "core/filesystem.h"
#include "spillfs/common/clock.h"

namespace spillfs {

struct Filesystem::FlushBatch {
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

namespace {

// Batches (FilesystemOptions::flush_batch_bytes) written or being written
// and not yet mapped, per flush. Each waits for an fdatasync before its
// mapping; the next ones are written meanwhile, so the SSD is not idle while
// a sync runs (under a stream of writes a sync can take as long as writing a
// batch). Four, not more: eight measured no faster and freeze twice the
// RAM-tier memory under a flush (59a375d; docs/results.md, "Write path").
constexpr size_t kFlushBatchesInFlight = 4;
// A background flush of a durable file takes chunks filled while it runs, up
// to this much in all, instead of ending (and waiting for its last sync) and
// starting again: a file being streamed is flushed in one pipeline. It stops
// taking more once anyone waits for the flush lock (an fsync, a writer of a
// chunk being flushed, a truncate) or the file system stops. Ephemeral files
// are flushed only to relieve pressure: no more than they hold then.
constexpr uint64_t kBackgroundFlushBytes = 1 << 30;

}  // namespace

Status Filesystem::FlushFile(InodeNumber ino, FlushScope scope) {
  if (!ram_tier_.Find(ino)) return Status::OK();
  if (scope == FlushScope::kBackground) {
    std::unique_lock<WaitedMutex> flush_lock;
    if (!BackgroundFlushLock(ino, &flush_lock)) return Status::OK();
    return FlushChunks(ino, scope, /*locked=*/false);
  }
  ExclusiveLock flush_lock(&FlushLock(ino));
  return FlushChunks(ino, scope, /*locked=*/false);
}

bool Filesystem::BackgroundFlushLock(InodeNumber ino, std::unique_lock<WaitedMutex>* flush_lock) {
  WaitedMutex& mu = FlushLock(ino);
  // The lock is not fair: a flusher that took it again and again could keep
  // an fsync (or truncate, or a writer of a chunk being flushed) out for
  // many flushes. So while memory is not short, a file whose lock is taken
  // or waited for is left alone; its holder flushes it, or the next pass.
  if (!ram_tier_.Pressed()) {
    *flush_lock = std::unique_lock(mu, std::try_to_lock);
    return flush_lock->owns_lock() && !mu.waited();
  }
  // Memory is short and this file must go, even if the lock is another
  // inode's (striped) that is busy for good: let the waiters go first for a
  // moment, then queue up with them.
  for (int i = 0; i < 50 && mu.waited(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  *flush_lock = std::unique_lock(mu);
  return true;
}

Status Filesystem::FlushLocked(InodeNumber ino) {
  if (!ram_tier_.Find(ino)) return Status::OK();
  return FlushChunks(ino, FlushScope::kAll, /*locked=*/true);
}

std::unique_lock<SharedMutex> Filesystem::IoLockUnlessHeld(InodeNumber ino, bool held) {
  return held ? std::unique_lock<SharedMutex>() : std::unique_lock<SharedMutex>(IoLock(ino));
}

Status Filesystem::FlushChunks(InodeNumber ino, FlushScope scope, bool locked) {
  auto file = ram_tier_.Find(ino);
  if (!file) return Status::OK();
  // After a failed sync of the data area no batch of a durable file can be
  // mapped (FlushBeforeMapping): fail before writing it to the SSD again.
  if (Status failed = store_.sync_error(); !failed.ok() && !file->ephemeral()) return failed;
  // The chunks to flush, fixed now (the I/O lock is held only for the short
  // steps): data written later is a later flush's, except that a background
  // flush takes chunks filled meanwhile too, up to kBackgroundFlushBytes.
  std::vector<uint64_t> todo;
  {
    auto lock = IoLockUnlessHeld(ino, locked);
    todo = ram_tier_.ChunksToFlush(*file, scope == FlushScope::kBackground, /*refill=*/false);
  }
  if (todo.empty()) {
    if (scope == FlushScope::kBackground) return Status::OK();
    // No data left (truncated away), but the entry's size and mtime still
    // overlay the inode: commit them and let the entry go.
    auto lock = IoLockUnlessHeld(ino, locked);
    FlushBatch nothing;
    nothing.file = file;
    return CommitBatch(ino, &nothing);
  }
  const uint64_t chunks_per_batch = std::max<uint64_t>(1, options_.flush_batch_bytes / RamTier::kChunkBytes);
  std::deque<std::unique_ptr<FlushBatch>> in_flight;  // oldest first; mapped in that order
  uint64_t started_bytes = 0;
  Status first;
  for (size_t next = 0; first.ok();) {
    if (next == todo.size() && scope == FlushScope::kBackground && !file->ephemeral() &&
        started_bytes < kBackgroundFlushBytes && !FlushLock(ino).waited() && !stopping_) {
      auto lock = IoLockUnlessHeld(ino, locked);
      todo = ram_tier_.ChunksToFlush(*file, scope == FlushScope::kBackground, /*refill=*/true);
      next = 0;
    }
    if (next == todo.size()) break;
    auto batch = std::make_unique<FlushBatch>();
    batch->file = file;
    {
      auto lock = IoLockUnlessHeld(ino, locked);
      size_t stop = std::min(todo.size(), next + chunks_per_batch);
      GatherBatch(std::vector<uint64_t>(todo.begin() + next, todo.begin() + stop), batch.get());
      next = stop;
    }
    if (Status planned = PlanBatch(batch.get(), dedup_); !planned.ok()) {
      auto lock = IoLockUnlessHeld(ino, locked);
      AbandonBatch(batch.get());
      first = planned;
      break;
    }
    started_bytes += batch->total;
    StartBatchWrites(ino, batch.get(), locked);
    in_flight.push_back(std::move(batch));
    if (in_flight.size() >= kFlushBatchesInFlight) {
      first = MapWrittenBatch(ino, std::move(in_flight.front()), locked);
      in_flight.pop_front();
    }
  }
  // Every batch started is written: map it, or give it back (the first error
  // is the one reported).
  for (; !in_flight.empty(); in_flight.pop_front()) {
    Status mapped = MapWrittenBatch(ino, std::move(in_flight.front()), locked);
    if (first.ok()) first = mapped;
  }
  return first;
}

void Filesystem::StartBatchWrites(InodeNumber ino, FlushBatch* batch, bool locked) {
  // The writes, then the flush that must come before the mapping: on their
  // own thread, so that this one gathers and hashes the next batches
  // meanwhile. Dedup hits need the flush too: their blob may be an ephemeral
  // file's, mapped without one. A caller holding the locks runs them when
  // they are waited for.
  const bool maps_data = !batch->plan.extents.empty() || !batch->shared.empty();
  auto write_and_flush = [this, ino, maps_data, slices = batch->plan.slices] {
    return maps_data ? WriteForMapping(ino, slices) : store_.WriteSlices(slices);
  };
  if (!locked) {
    try {
      batch->written = std::async(std::launch::async, [write_and_flush] {
        pthread_setname_np(pthread_self(), "spillfs-write");  // not its creator's (a FUSE worker's) name
        return write_and_flush();
      });
      return;
    } catch (const std::system_error&) {
      // No thread to be had: the writes run when the batch is waited for.
    }
  }
  batch->written = std::async(std::launch::deferred, std::move(write_and_flush));
}

Status Filesystem::MapWrittenBatch(InodeNumber ino, std::unique_ptr<FlushBatch> batch, bool locked) {
  Status written = batch->written.get();  // written and flushed
  auto lock = IoLockUnlessHeld(ino, locked);
  if (!written.ok()) {
    allocator_.Unreserve(batch->plan.space);
    AbandonBatch(batch.get());
    return written;
  }
  Status committed = CommitBatch(ino, batch.get());
  if (committed.code() != EAGAIN) return committed;
  // A dedup target vanished: flush the same chunks again without dedup.
  FlushBatch retry;
  retry.file = batch->file;
  GatherBatch(batch->chunks, &retry);
  if (Status planned = PlanBatch(&retry, /*dedup=*/false); !planned.ok()) {
    AbandonBatch(&retry);
    return planned;
  }
  if (Status rewritten = WriteForMapping(ino, retry.plan.slices); !rewritten.ok()) {
    allocator_.Unreserve(retry.plan.space);
    AbandonBatch(&retry);
    return rewritten;
  }
  return CommitBatch(ino, &retry);
}

void Filesystem::GatherBatch(const std::vector<uint64_t>& chunks, FlushBatch* batch) {
  std::vector<RamTier::Run> runs;
  batch->chunks = ram_tier_.Freeze(*batch->file, chunks, &runs);
  for (const RamTier::Run& run : runs) {
    batch->segments.push_back(Segment{run.file_offset, run.data, run.length, {}, {}, {}});
    batch->total += run.length;
    if (!batch->ranges.empty() && batch->ranges.back().second == run.file_offset) {
      batch->ranges.back().second += run.length;
    } else {
      batch->ranges.emplace_back(run.file_offset, run.file_offset + run.length);
    }
  }
  batch->hold = ram_tier_.TakeHold(*batch->file, batch->total);
}

Status Filesystem::PlanBatch(FlushBatch* batch, bool dedup) {
  deduper_.HashSegments(&batch->segments, dedup);
  if (dedup) deduper_.Deduplicate(&batch->segments, &batch->shared);
  uint64_t fresh_bytes = batch->total - batch->shared.size() * kDedupUnit;
  // Taken from the hold only once the space is reserved: a failed plan
  // leaves the whole hold to AbandonBatch.
  const uint64_t from_hold = std::min(batch->hold, fresh_bytes);
  SPILLFS_ASSIGN_OR_RETURN(batch->plan, PlanSegments(batch->segments, from_hold));
  batch->reserved_from_hold = from_hold;
  allocator_.ReleaseHold(batch->hold - batch->reserved_from_hold);  // dedup hits need no space
  batch->hold = 0;
  return Status::OK();
}

void Filesystem::AbandonBatch(FlushBatch* batch) {
  // Keep the space promise for a retry: a hold not yet used goes back to the
  // file; what became the reservation (returned by the caller) is promised
  // again. A retry without dedup may need more; it reserves that then.
  if (batch->hold > 0) ram_tier_.AddHold(*batch->file, batch->hold);
  if (batch->reserved_from_hold > 0 && allocator_.Hold(batch->reserved_from_hold).ok()) {
    ram_tier_.AddHold(*batch->file, batch->reserved_from_hold);
  }
  batch->hold = batch->reserved_from_hold = 0;
  ram_tier_.Thaw(*batch->file, batch->chunks);
}

Status Filesystem::CommitBatch(InodeNumber ino, FlushBatch* batch) {
  // The bytes stay the same, but read-ahead windows started while they were
  // only in the RAM tier hold the SSD's older bytes.
  ContentChange change(&read_ahead_, ino);
  RamTier::File& file = *batch->file;
  auto& extents = batch->plan.extents;
  MutexLock lock(&mu_);
  // Read under mu_: a chmod or utimens changes the overlay and the record
  // under mu_ without waiting for this flush, and one read before would be
  // put back over it.
  auto overlay = ram_tier_.GetOverlay(ino);
  // GetAttr, which does not take mu_, must not see the record with this
  // batch and the overlay still with it too.
  ram_tier_.BeginCommit(file);
  struct EndCommit {
    RamTier& tier;
    RamTier::File& file;
    ~EndCommit() { tier.EndCommit(file); }
  } end_commit{ram_tier_, file};
  auto record = LoadInode(ino);
  if (!record.ok()) {
    allocator_.Unreserve(batch->plan.space);  // reclaimed while we wrote: never mapped
    ram_tier_.FinishFlush(ino, file, batch->chunks);
    return record.status().code() == ENOENT ? Status::OK() : record.status();
  }
  if (Status shared = deduper_.CheckShared(batch->shared); !shared.ok()) {
    allocator_.Unreserve(batch->plan.space);
    AbandonBatch(batch);
    return shared;
  }
  Txn txn(index_);
  Dedup::NoteNewBlobs(extents, batch->segments, &txn.new_blobs);
  uint64_t unmapped = 0;
  Status unmapped_ok = UnmapRanges(&txn, ino, batch->ranges, &unmapped);
  if (!unmapped_ok.ok()) {
    allocator_.Unreserve(batch->plan.space);
    AbandonBatch(batch);
    return unmapped_ok;
  }
  MapExtents(&txn, ino, extents);
  deduper_.MapShared(ino, batch->shared, &txn.batch, &txn.blob_refs);
  record->allocated_bytes += batch->total - unmapped;
  if (overlay) {
    // Only data of this batch is committed; a size past it is still the
    // overlay's (later chunks keep the file in the cache until they commit).
    uint64_t committed_end = batch->ranges.empty() ? 0 : batch->ranges.back().second;
    record->size = std::max(record->size, std::min(overlay->size, committed_end));
    if (ram_tier_.HoldsOnly(file, batch->chunks)) record->size = overlay->size;  // the last cached data
    record->mtime_ns = overlay->mtime_ns;
    record->ctime_ns = std::max(record->ctime_ns, overlay->mtime_ns);
  }
  PutInode(&txn, ino, *record);
  if (Status committed = CommitTxn(&txn); !committed.ok()) {
    // The chunks stay cached and a later flush takes them again. Their space
    // stays reserved: a failed write may still have reached the WAL, and a
    // remount rebuilds the free list from the index anyway.
    AbandonBatch(batch);
    return committed;
  }
  counters_.bytes_deduplicated.fetch_add(batch->shared.size() * kDedupUnit, std::memory_order_relaxed);
  ram_tier_.FinishFlush(ino, file, batch->chunks);
  return Status::OK();
}

Status Filesystem::Flush(InodeNumber ino) {
  auto file = ram_tier_.Find(ino);
  if (!file || file->ephemeral()) return Status::OK();
  return FlushFile(ino);
}

Status Filesystem::FlushAll() {
  Status first;
  for (InodeNumber ino : ram_tier_.PickVictims(NowNs(), 0, /*all=*/true)) {
    Status s = FlushFile(ino);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

Status Filesystem::WriteForMapping(InodeNumber ino, const std::vector<IoSlice>& slices) {
  SPILLFS_RETURN_IF_ERROR(store_.WriteSlices(slices));
  return FlushBeforeMapping(ino);
}

void Filesystem::FlusherLoop() {
  pthread_setname_np(pthread_self(), "spillfs-flush");
  const int64_t max_age_ns = options_.flush_age_ms * 1000000;
  while (!stopping_) {
    ram_tier_.WaitForWork(std::chrono::milliseconds(200));
    for (InodeNumber ino : ram_tier_.PickVictims(NowNs(), max_age_ns, /*all=*/false)) {
      if (stopping_) break;
      Status s = FlushFile(ino, FlushScope::kBackground);
      if (!s.ok()) fmt::print(stderr, "spillfs: background flush of inode {} failed: {}\n", ino, s.ToString());
    }
  }
}

}  // namespace spillfs
