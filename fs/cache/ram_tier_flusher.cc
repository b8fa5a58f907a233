// RamTierFlusher: the RAM tier's flushes to the SSD (batches written with
// io_uring, synced, then mapped by the committer) and the background thread.
#include "spillfs/cache/ram_tier_flusher.h"

#include <fmt/format.h>

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <system_error>

#include "spillfs/common/clock.h"

namespace spillfs {

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
// Files flushed at once by FlushFiles, at most. A small file's flush is one
// write and one sync of the data area, and concurrent syncs are shared, so N
// files at once cost about one sync where one at a time cost N. Eight: enough
// to hide a sync of several milliseconds behind the others' writes without
// freezing more than eight files' batches of RAM-tier memory at a time; no
// more than the CPUs, whose every other thread a flush competes with (its
// hashing, its commits under the commit lock).
size_t FilesFlushedAtOnce() {
  static const size_t n = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  return n;
}

}  // namespace

RamTierFlusher::RamTierFlusher(RamTier* tier, Dedup* dedup, BlockStore* store, Allocator* allocator, InodeLocks* locks,
                               Dedup::BlockSums block_sums, uint64_t block_size, FlushCommitter* committer,
                               const Options& options)
    : tier_(*tier),
      dedup_(*dedup),
      store_(*store),
      allocator_(*allocator),
      locks_(*locks),
      block_sums_(std::move(block_sums)),
      block_size_(block_size),
      committer_(*committer),
      options_(options) {}

RamTierFlusher::~RamTierFlusher() { Stop(); }

void RamTierFlusher::Start() {
  stopping_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void RamTierFlusher::Stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  tier_.WakeFlusher();
  thread_.join();
}

Status RamTierFlusher::FlushFile(InodeNumber ino, FlushScope scope) {
  if (!tier_.Find(ino)) return Status::OK();
  if (scope == FlushScope::kBackground) {
    std::unique_lock<WaitedMutex> flush_lock;
    if (!BackgroundFlushLock(ino, &flush_lock)) return Status::OK();
    return FlushChunks(ino, scope, /*locked=*/false);
  }
  ExclusiveLock flush_lock(&locks_.Flush(ino));
  return FlushChunks(ino, scope, /*locked=*/false);
}

bool RamTierFlusher::BackgroundFlushLock(InodeNumber ino, std::unique_lock<WaitedMutex>* flush_lock) {
  WaitedMutex& mu = locks_.Flush(ino);
  // The lock is not fair: a flusher that took it again and again could keep
  // an fsync (or truncate, or a writer of a chunk being flushed) out for
  // many flushes. So while memory is not short, a file whose lock is taken
  // or waited for is left alone; its holder flushes it, or the next pass.
  if (!tier_.Pressed()) {
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

Status RamTierFlusher::FlushLocked(InodeNumber ino) {
  if (!tier_.Find(ino)) return Status::OK();
  return FlushChunks(ino, FlushScope::kAll, /*locked=*/true);
}

std::unique_lock<SharedMutex> RamTierFlusher::IoLockUnlessHeld(InodeNumber ino, bool held) {
  return held ? std::unique_lock<SharedMutex>() : std::unique_lock<SharedMutex>(locks_.Io(ino));
}

Status RamTierFlusher::FlushAll() { return FlushFiles(tier_.PickVictims(NowNs(), 0, /*all=*/true), FlushScope::kAll); }

Status RamTierFlusher::FlushFiles(const std::vector<InodeNumber>& inos, FlushScope scope, size_t at_once) {
  if (at_once == 0) at_once = FilesFlushedAtOnce();
  std::atomic<size_t> next{0};
  std::vector<Status> results(inos.size());
  auto work = [&] {
    for (size_t i = next++; i < inos.size(); i = next++) {
      if (scope == FlushScope::kBackground && stopping_) break;
      results[i] = FlushFile(inos[i], scope);
      if (!results[i].ok() && scope == FlushScope::kBackground) {
        fmt::print(stderr, "spillfs: background flush of inode {} failed: {}\n", inos[i], results[i].ToString());
      }
    }
  };
  std::vector<std::future<void>> helpers;
  for (size_t i = 1; i < std::min(inos.size(), at_once); ++i) {
    try {
      helpers.push_back(std::async(std::launch::async, [&work] {
        pthread_setname_np(pthread_self(), "spillfs-flush");
        work();
      }));
    } catch (const std::system_error&) {
      break;  // no thread to be had: fewer files at once
    }
  }
  work();
  for (auto& helper : helpers) helper.get();
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status RamTierFlusher::FlushChunks(InodeNumber ino, FlushScope scope, bool locked) {
  auto file = tier_.Find(ino);
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
    todo = tier_.ChunksToFlush(*file, scope == FlushScope::kBackground, /*refill=*/false);
  }
  if (todo.empty()) {
    if (scope == FlushScope::kBackground) return Status::OK();
    // No data left (truncated away), but the entry's size and mtime still
    // overlay the inode: commit them and let the entry go.
    auto lock = IoLockUnlessHeld(ino, locked);
    FlushBatch nothing;
    nothing.file = file;
    return committer_.CommitBatch(ino, &nothing);
  }
  const uint64_t chunks_per_batch = std::max<uint64_t>(1, options_.batch_bytes / RamTier::kChunkBytes);
  std::deque<std::unique_ptr<FlushBatch>> in_flight;  // oldest first; mapped in that order
  uint64_t started_bytes = 0;
  Status first;
  for (size_t next = 0; first.ok();) {
    if (next == todo.size() && scope == FlushScope::kBackground && !file->ephemeral() &&
        started_bytes < kBackgroundFlushBytes && !locks_.Flush(ino).waited() && !stopping_) {
      auto lock = IoLockUnlessHeld(ino, locked);
      todo = tier_.ChunksToFlush(*file, scope == FlushScope::kBackground, /*refill=*/true);
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
    if (Status planned = PlanBatch(batch.get(), options_.dedup); !planned.ok()) {
      auto lock = IoLockUnlessHeld(ino, locked);
      AbandonBatch(batch.get());
      first = planned;
      break;
    }
    started_bytes += batch->total;
    // A batch with none before or after it (a small file's) gains nothing
    // from a thread of its own: its writes run when it is waited for.
    const bool alone = in_flight.empty() && next == todo.size();
    StartBatchWrites(ino, batch.get(), locked || alone);
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

void RamTierFlusher::StartBatchWrites(InodeNumber ino, FlushBatch* batch, bool deferred) {
  // The writes, then the flush that must come before the mapping: on their
  // own thread, so that this one gathers and hashes the next batches
  // meanwhile. Dedup hits need the flush too: their blob may be an ephemeral
  // file's, mapped without one. Deferred writes run when the batch is waited
  // for.
  const bool maps_data = !batch->plan.extents.empty() || !batch->shared.empty();
  auto write_and_flush = [this, ino, maps_data, slices = batch->plan.slices] {
    return maps_data ? WriteForMapping(ino, slices) : store_.WriteSlices(slices);
  };
  if (!deferred) {
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

Status RamTierFlusher::MapWrittenBatch(InodeNumber ino, std::unique_ptr<FlushBatch> batch, bool locked) {
  Status written = batch->written.get();  // written and flushed
  auto lock = IoLockUnlessHeld(ino, locked);
  if (!written.ok()) {
    allocator_.Unreserve(batch->plan.space);
    AbandonBatch(batch.get());
    return written;
  }
  Status committed = committer_.CommitBatch(ino, batch.get());
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
  return committer_.CommitBatch(ino, &retry);
}

void RamTierFlusher::GatherBatch(const std::vector<uint64_t>& chunks, FlushBatch* batch) {
  std::vector<RamTier::Run> runs;
  batch->chunks = tier_.Freeze(*batch->file, chunks, &runs);
  for (const RamTier::Run& run : runs) {
    batch->segments.push_back(Segment{run.file_offset, run.data, run.length, {}, {}, {}});
    batch->total += run.length;
    if (!batch->ranges.empty() && batch->ranges.back().second == run.file_offset) {
      batch->ranges.back().second += run.length;
    } else {
      batch->ranges.emplace_back(run.file_offset, run.file_offset + run.length);
    }
  }
  batch->hold = tier_.TakeHold(*batch->file, batch->total);
}

Status RamTierFlusher::PlanBatch(FlushBatch* batch, bool dedup) {
  dedup_.HashSegments(&batch->segments, dedup);
  if (dedup) dedup_.Deduplicate(&batch->segments, &batch->shared);
  uint64_t fresh_bytes = batch->total - batch->shared.size() * kDedupUnit;
  // Taken from the hold only once the space is reserved: a failed plan
  // leaves the whole hold to AbandonBatch.
  const uint64_t from_hold = std::min(batch->hold, fresh_bytes);
  SPILLFS_ASSIGN_OR_RETURN(batch->plan,
                           PlanSegments(&allocator_, batch->segments, from_hold, block_size_, block_sums_));
  batch->reserved_from_hold = from_hold;
  allocator_.ReleaseHold(batch->hold - batch->reserved_from_hold);  // dedup hits need no space
  batch->hold = 0;
  return Status::OK();
}

void RamTierFlusher::AbandonBatch(FlushBatch* batch) {
  // Keep the space promise for a retry: a hold not yet used goes back to the
  // file; what became the reservation (returned by the caller) is promised
  // again. A retry without dedup may need more; it reserves that then.
  if (batch->hold > 0) tier_.AddHold(*batch->file, batch->hold);
  if (batch->reserved_from_hold > 0 && allocator_.Hold(batch->reserved_from_hold).ok()) {
    tier_.AddHold(*batch->file, batch->reserved_from_hold);
  }
  batch->hold = batch->reserved_from_hold = 0;
  tier_.Thaw(*batch->file, batch->chunks);
}

Status RamTierFlusher::WriteForMapping(InodeNumber ino, const std::vector<IoSlice>& slices) {
  SPILLFS_RETURN_IF_ERROR(store_.WriteSlices(slices));
  return committer_.FlushBeforeMapping(ino);
}

void RamTierFlusher::Loop() {
  pthread_setname_np(pthread_self(), "spillfs-flush");
  const int64_t max_age_ns = options_.age_ms * 1000000;
  while (!stopping_) {
    tier_.WaitForWork(std::chrono::milliseconds(200));
    if (stopping_) break;
    (void)FlushFiles(tier_.PickVictims(NowNs(), max_age_ns, /*all=*/false), FlushScope::kBackground);
  }
}

}  // namespace spillfs
