// Filesystem's side of a RAM-tier flush (FlushCommitter): the commit of a
// flushed batch's mapping, the flush at close, and the settling of files
// created since the last sync (kInodeUnsettled). The flush pipeline itself
// is the cache's (spillfs/cache/ram_tier_flusher.h); reads and writes served by the
// tier are in ram_tier_io.cc.
#include <algorithm>

#include "spillfs/core/filesystem.h"

namespace spillfs {

Status Filesystem::Flush(InodeNumber ino) {
  auto file = ram_tier_.Find(ino);
  if (!file || file->ephemeral()) return Status::OK();
  // A small file created since the last sync is not waited for: it is
  // either reclaimed whole after a crash, or its data is durable
  // (kInodeUnsettled). The background flusher takes it with others, sharing
  // their syncs; an fsync of any file, a rename over a name, or a clean stop
  // settles it. A larger one is flushed now, as a file that existed is: its
  // sync costs little beside its writes, and its units are then at once
  // there for dedup (a second checkpoint written after it shares them).
  if (IsUnsettled(ino)) {
    auto overlay = ram_tier_.GetOverlay(ino);
    if (!overlay || overlay->dirty_bytes <= kSettleLaterBytes) return Status::OK();
  }
  return flusher_.FlushFile(ino);
}

Status Filesystem::FlushAll() { return flusher_.FlushAll(); }

bool Filesystem::IsUnsettled(InodeNumber ino) const {
  MutexLock lock(&unsettled_mu_);
  return unsettled_.count(ino) > 0;
}

namespace {
constexpr size_t kFilesSettledAtOnce = 64;
}  // namespace

Status Filesystem::SettleAll() {
  std::vector<InodeNumber> inos;
  {
    MutexLock lock(&unsettled_mu_);
    inos.assign(unsettled_.begin(), unsettled_.end());
  }
  return Settle(inos);
}

Status Filesystem::Settle(const std::vector<InodeNumber>& inos) {
  if (inos.empty()) return Status::OK();
  // Their data first (a flush that maps a file's last cached data clears its
  // flag in the same batch: CommitBatch), then the flag of each file left:
  // no cached data, or data written since. That data is a later flush's;
  // the file keeps what this one made durable, as any settled file does.
  // Many at once: the caller (an fsync) waits for all of them, and each
  // waits mostly for a data sync, which those in flight together share (on
  // a disk whose sync takes 7 ms, eight at a time settled 8,210 small files
  // in 12 s where ext4 took 0.6).
  SPILLFS_RETURN_IF_ERROR(flusher_.FlushFiles(inos, FlushScope::kAll, kFilesSettledAtOnce));
  MutexLock lock(&mu_);
  Txn txn(index_);
  std::vector<InodeNumber> cleared;
  for (InodeNumber ino : inos) {
    if (!IsUnsettled(ino)) continue;
    auto record = LoadInode(ino);
    if (!record.ok()) {
      if (record.status().code() == ENOENT) continue;  // reclaimed meanwhile
      return record.status();
    }
    record->flags &= ~kInodeUnsettled;
    PutInode(&txn, ino, *record);
    cleared.push_back(ino);
  }
  if (cleared.empty()) return Status::OK();
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  MutexLock unsettled_lock(&unsettled_mu_);
  for (InodeNumber ino : cleared) unsettled_.erase(ino);
  return Status::OK();
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
    flusher_.AbandonBatch(batch);
    return shared;
  }
  Txn txn(index_);
  Dedup::NoteNewBlobs(extents, batch->segments, &txn.new_blobs);
  uint64_t unmapped = 0;
  Status unmapped_ok = UnmapRanges(&txn, ino, batch->ranges, &unmapped);
  if (!unmapped_ok.ok()) {
    allocator_.Unreserve(batch->plan.space);
    flusher_.AbandonBatch(batch);
    return unmapped_ok;
  }
  MapExtents(&txn, ino, extents);
  deduper_.MapShared(ino, batch->shared, &txn.batch, &txn.blob_refs);
  record->allocated_bytes += batch->total - unmapped;
  // The file's last cached data: from this batch on its data is durable and
  // mapped, so a crash no longer needs to reclaim it.
  const bool settles = (record->flags & kInodeUnsettled) && ram_tier_.HoldsOnly(file, batch->chunks);
  if (settles) record->flags &= ~kInodeUnsettled;
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
    flusher_.AbandonBatch(batch);
    return committed;
  }
  counters_.bytes_deduplicated.fetch_add(batch->shared.size() * kDedupUnit, std::memory_order_relaxed);
  ram_tier_.FinishFlush(ino, file, batch->chunks);
  if (settles) {
    MutexLock unsettled_lock(&unsettled_mu_);
    unsettled_.erase(ino);
  }
  return Status::OK();
}

}  // namespace spillfs
