// Filesystem's side of a RAM-tier flush (FlushCommitter): the commit of a
// flushed batch's mapping, and the flush at close. The flush pipeline itself
// is the cache's (spillfs/cache/ram_tier_flusher.h); reads and writes served by the
// tier are in ram_tier_io.cc.
#include <algorithm>

#include "spillfs/core/filesystem.h"

namespace spillfs {

Status Filesystem::Flush(InodeNumber ino) {
  auto file = ram_tier_.Find(ino);
  if (!file || file->ephemeral()) return Status::OK();
  return flusher_.FlushFile(ino);
}

Status Filesystem::FlushAll() { return flusher_.FlushAll(); }

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
  return Status::OK();
}

}  // namespace spillfs
