// RamTier: the write-back RAM tier (README "RAM tier", --ram-tier, the
// ram_tier_* stats). Dirty file data waits here in aligned host
// memory and is written to the SSD later as large extents (flush by fsync,
// close, age or memory pressure). Data truncated away or unlinked before it
// was flushed costs no SSD I/O at all.
//
// Locking: the tier's own mutex guards the table of files, their logical
// size/mtime overlay and the byte accounting. A file's chunk contents are
// guarded by that inode's I/O lock in Filesystem (exclusive to change,
// shared to read). Files are shared_ptr so a flush in progress keeps its
// buffers alive even if the inode is reclaimed meanwhile.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "spillfs/kvindex/records.h"
#include "store/buffer_pool.h"

namespace spillfs {

class RamTier {
 public:
  static constexpr uint64_t kChunkBytes = 256 << 10;
  // A non-ephemeral file with this much dirty data is flushed in the
  // background at once (write-behind), so a long sequential write keeps the
  // SSD busy instead of waiting for fsync or memory pressure.
  static constexpr uint64_t kWriteBehindBytes = 64 << 20;

  // A fixed, chunk-aligned window of a file; `valid` marks blocks whose bytes
  // here are the file's current contents.
  struct Chunk {
    explicit Chunk(BufferPool* pool) : data(pool) {}
    PooledBuffer data;
    std::vector<bool> valid;
    uint64_t valid_blocks = 0;
    // Being written to the SSD: its bytes and valid bits must not change
    // until the flush commits (a writer waits on Filesystem::FlushLock).
    bool flushing = false;
  };

  struct File {
    std::map<uint64_t, Chunk> chunks;  // chunk index -> chunk
    uint64_t size = 0;                 // logical size including cached data
    int64_t mtime_ns = 0;
    int64_t first_dirty_ns = 0;  // when the oldest unflushed data arrived
    int64_t last_write_ns = 0;   // SteadyNowNs() of the last write (utimes does not move it)
    bool ephemeral = false;
    uint64_t dirty_bytes = 0;  // valid bytes held (accounting)
    uint64_t chunk_count = 0;  // chunks.size(), readable under the tier's mutex
    uint64_t held_bytes = 0;   // space promised by Allocator::Hold for this data
    // Odd while a flush of the file commits its mapping (BeginCommit to
    // EndCommit), under the tier's mutex: a reader of the overlay and the
    // committed record that straddled a commit sees it changed. With `id`
    // (unique among the entries ever made), since an entry whose data is
    // all committed goes, and the next write makes a new one.
    uint64_t commit_seq = 0;
    uint64_t id = 0;
  };

  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t used_bytes = 0;       // chunk memory held
    uint64_t dirty_bytes = 0;      // valid bytes awaiting flush
    uint64_t cancelled_bytes = 0;  // dirty bytes dropped by unlink/truncate (never written)
    uint64_t files = 0;
    // Writes that waited for room in vain (WaitForRoom timed out): the tier
    // is too small for the write rate or for the writes.
    uint64_t room_wait_timeouts = 0;
  };

  RamTier(uint64_t capacity_bytes, uint64_t block_size);

  uint64_t capacity() const { return capacity_; }
  // Faults in `bytes` (at most the capacity) of chunk memory now, so the
  // first writes after a mount do not pay for fresh pages (buffer_pool.h).
  void WarmUp(uint64_t bytes);
  uint64_t block_size() const { return block_size_; }
  uint64_t blocks_per_chunk() const { return kChunkBytes / block_size_; }

  // The file's entry, or null.
  std::shared_ptr<File> Find(InodeNumber ino) const;
  // The file's entry, created with the given committed size/mtime.
  std::shared_ptr<File> GetOrCreate(InodeNumber ino, uint64_t size, int64_t mtime_ns, bool ephemeral);
  // Size and mtime overlay for getattr; nullopt when nothing is cached.
  struct Overlay {
    uint64_t size;
    int64_t mtime_ns;
    uint64_t dirty_bytes;
    // The entry's File::id and File::commit_seq when it was taken.
    std::pair<uint64_t, uint64_t> commit_mark;
  };
  std::optional<Overlay> GetOverlay(InodeNumber ino) const;
  // The commit mark of the file's entry now (see Overlay); nullopt without one.
  std::optional<std::pair<uint64_t, uint64_t>> CommitMark(InodeNumber ino) const;
  // Around the commit of a flush batch of `file` (FinishFlush, if any, in
  // between).
  void BeginCommit(File& file);
  void EndCommit(File& file);

  // Chunk for block `block` of `file`, created (all blocks invalid) if absent.
  // Caller holds the inode's I/O lock exclusively.
  Chunk& ChunkFor(File& file, uint64_t block);
  // The bytes of `block` when `file` holds them (valid), else null. Caller
  // holds the inode's I/O lock (shared is enough).
  char* CachedBlock(File& file, uint64_t block) const;
  // Marks `count` blocks from `block` valid and accounts for the new ones.
  void MarkValid(File& file, uint64_t block, uint64_t count);
  // Updates the overlay after a write.
  void NoteWrite(File& file, uint64_t end_offset, int64_t mtime_ns);
  // Sets the overlay after setattr (truncate, utimens).
  void SetAttrs(File& file, std::optional<uint64_t> size, std::optional<int64_t> mtime_ns);

  // Space holds: added after Allocator::Hold succeeds; taken by a flush that
  // converts them into a reservation; returned if the flush fails.
  void AddHold(File& file, uint64_t bytes);
  // Takes at most `max_bytes` of the file's hold.
  uint64_t TakeHold(File& file, uint64_t max_bytes = UINT64_MAX);
  // Drops cached blocks at or past `block` (truncate). Returns the hold to
  // give back to the allocator.
  uint64_t DropFrom(InodeNumber ino, File& file, uint64_t block, bool cancelled);
  // Removes the whole entry (reclaimed inode). Returns the hold to give back.
  uint64_t Remove(InodeNumber ino, bool cancelled);
  // After a flush wrote every valid block it saw: releases those chunks.
  void FinishFlush(InodeNumber ino, File& file, const std::vector<uint64_t>& flushed_chunks);

  // Files to flush now, oldest first: all when `all`, else those dirty for
  // longer than `max_age_ns` or holding kWriteBehindBytes (non-ephemeral)
  // plus, while memory is above the high watermark or a writer waits for
  // room, the oldest of any kind, until half the tier (or what the waiting
  // writers need, if more) is free.
  std::vector<InodeNumber> PickVictims(int64_t now_ns, int64_t max_age_ns, bool all) const;
  // Over the high watermark, or a writer waits for room: the flusher must
  // free memory now.
  bool Pressed() const;
  // True when the flusher should look at `file` now (memory pressure, or
  // write-behind of a large non-ephemeral file).
  bool WantsFlush(const File& file) const;
  // Blocks until `bytes` (> 0) more fit or `timeout` passes; false on
  // timeout, and at once where `bytes` exceeds the whole capacity (they
  // never fit). A waiter is pressure on the flusher (PickVictims).
  bool WaitForRoom(uint64_t bytes, std::chrono::milliseconds timeout);
  // Wakes the flusher (it waits on this with a timeout).
  void WakeFlusher();
  bool WaitForWork(std::chrono::milliseconds timeout);
  Stats stats() const;

 private:
  // mu_ held. Chunk memory above 3/4 of the tier.
  bool OverHighWatermarkLocked() const { return used_bytes_ > capacity_ / 4 * 3; }
  // mu_ held. Over the high watermark, or a writer waits for room.
  bool PressedLocked() const { return OverHighWatermarkLocked() || room_wanted_bytes_ > 0; }

  void AccountChunk(int64_t delta);

  const uint64_t capacity_;
  const uint64_t block_size_;
  BufferPool pool_;  // declared before files_: outlives every chunk
  mutable std::mutex mu_;
  std::condition_variable room_;  // signalled when memory is released
  std::condition_variable work_;  // signalled when the flusher should look
  bool work_pending_ = false;
  std::unordered_map<InodeNumber, std::shared_ptr<File>> files_;
  uint64_t used_bytes_ = 0;
  uint64_t files_made_ = 0;         // File::id of the last entry made
  uint64_t room_wanted_bytes_ = 0;  // the bytes writers in WaitForRoom wait for, in all (each > 0)
  uint64_t dirty_bytes_ = 0;
  uint64_t cancelled_bytes_ = 0;
  uint64_t room_wait_timeouts_ = 0;
};

}  // namespace spillfs
