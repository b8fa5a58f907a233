// RamTier: the write-back RAM tier (README "RAM tier", --ram-tier, the
// ram_tier_* stats). Dirty file data waits here in aligned host
// memory and is written to the SSD later as large extents (flush by fsync,
// close, age or memory pressure). Data truncated away or unlinked before it
// was flushed costs no SSD I/O at all.
//
// Locking. Two locks guard the tier's state:
//  - RamTier::mu_ (below) guards the table of files, each file's size/mtime
//    overlay, accounting and commit mark, and the tier's totals. A leaf in
//    the lock order (filesystem.h states it): taken last, held briefly,
//    nothing is taken under it but BufferPool::mu_ (a dropped file's chunks
//    go back to the pool).
//  - The inode's I/O lock (Filesystem::IoLock, outside the tier) guards a
//    file's chunks: their bytes, valid bits and frozen marks. The methods
//    over blocks and flushes say which mode they need.
// The guards of File's fields (which Clang's analysis cannot name: the lock
// is the owning RamTier's, or a stripe chosen by inode) are said beside them.
// Files are shared_ptr so a flush in progress keeps its buffers alive even if
// the inode is reclaimed meanwhile.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"
#include "spillfs/common/thread_annotations.h"
#include "spillfs/kvindex/records.h"
#include "spillfs/store/buffer_pool.h"

namespace spillfs {

class RamTier {
 public:
  static constexpr uint64_t kChunkBytes = 256 << 10;
  // A non-ephemeral file with this much dirty data is flushed in the
  // background at once (write-behind), so a long sequential write keeps the
  // SSD busy instead of waiting for fsync or memory pressure.
  static constexpr uint64_t kWriteBehindBytes = 64 << 20;

  // One file's data in the tier (defined below). Outside the tier it is only
  // a handle: Filesystem finds or makes it, holds it (a flush in progress
  // keeps the buffers alive through it) and hands it back to these methods.
  class File;

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

  // `slab_fault`: the test seam of BufferPool (none in the product).
  RamTier(uint64_t capacity_bytes, uint64_t block_size, BufferPool::SlabFault slab_fault = nullptr);

  uint64_t capacity() const { return capacity_; }
  // Faults in `bytes` (at most the capacity) of chunk memory now, so the
  // first writes after a mount do not pay for fresh pages (buffer_pool.h).
  void WarmUp(uint64_t bytes);
  uint64_t block_size() const { return block_size_; }
  uint64_t blocks_per_chunk() const { return kChunkBytes / block_size_; }

  // --- files and their attribute overlay ---
  // The file's entry, or null.
  std::shared_ptr<File> Find(InodeNumber ino) const;
  // The file's entry, created with the given committed size/mtime.
  std::shared_ptr<File> GetOrCreate(InodeNumber ino, uint64_t size, int64_t mtime_ns, bool ephemeral);
  // The file's logical size, its cached data included.
  uint64_t CachedSize(const File& file) const;
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
  // Updates the overlay after a write.
  void NoteWrite(File& file, uint64_t end_offset, int64_t mtime_ns);
  // Sets the overlay after setattr (truncate, utimens).
  void SetAttrs(File& file, std::optional<uint64_t> size, std::optional<int64_t> mtime_ns);

  // --- blocks: the caller holds the inode's I/O lock, exclusively to change
  // them, shared to read them ---
  // How many blocks of [first_block, last_block) the file does not hold yet.
  uint64_t CountMissingBlocks(const File& file, uint64_t first_block, uint64_t last_block) const;
  // Makes the chunks that blocks [first_block, last_block) fall in (all
  // blocks invalid in a new one). ENOMEM when there is no memory for one:
  // the chunks of the range that hold no valid block are then dropped again.
  Status MakeChunks(File& file, uint64_t first_block, uint64_t last_block);
  // Where `block` lives in its chunk (made by MakeChunks), valid or not.
  char* BlockSlot(File& file, uint64_t block);
  // The bytes of `block` when `file` holds them (valid), else null.
  char* CachedBlock(File& file, uint64_t block) const;
  // Marks `count` blocks from `block` valid and accounts for the new ones.
  void MarkValid(File& file, uint64_t block, uint64_t count);
  // Copies `size` bytes to file offset `offset`, into chunks MakeChunks made.
  void CopyIn(File& file, uint64_t offset, const char* data, uint64_t size);
  // Zeroes the bytes from `offset` to the end of its block, where the file
  // holds that block (a truncate into the middle of a cached block).
  void ZeroBlockTail(File& file, uint64_t offset);
  // True when a chunk (with `flushing_only`: one being flushed) holds a block
  // of [first_block, last_block).
  bool HasChunkIn(const File& file, uint64_t first_block, uint64_t last_block, bool flushing_only) const;

  // --- space holds ---
  // Added after Allocator::Hold succeeds; taken by a flush that converts
  // them into a reservation; returned if the flush fails.
  void AddHold(File& file, uint64_t bytes);
  // Takes at most `max_bytes` of the file's hold.
  uint64_t TakeHold(File& file, uint64_t max_bytes = UINT64_MAX);
  // Drops cached blocks at or past `block` (truncate). Returns the hold to
  // give back to the allocator. I/O lock exclusive.
  uint64_t DropFrom(InodeNumber ino, File& file, uint64_t block, bool cancelled);
  // Removes the whole entry (reclaimed inode). Returns the hold to give back.
  uint64_t Remove(InodeNumber ino, bool cancelled);

  // --- flushes: the caller holds the inode's I/O lock exclusively ---
  // The file's chunks that a flush takes now, in file order. A `background`
  // flush leaves a partly filled last chunk while a writer is likely still
  // filling it; a `refill` skips the chunks already on their way (frozen).
  std::vector<uint64_t> ChunksToFlush(const File& file, bool background, bool refill) const;
  // A run of valid blocks of a frozen chunk: the bytes to write.
  struct Run {
    uint64_t file_offset;
    const char* data;
    uint64_t length;
  };
  // Freezes those of `chunks` the file still holds: their bytes and valid
  // bits do not change until FinishFlush or Thaw (a writer waits on
  // Filesystem::FlushLock). Appends their valid runs, in file order, to
  // `runs`; returns the chunks frozen.
  std::vector<uint64_t> Freeze(File& file, const std::vector<uint64_t>& chunks, std::vector<Run>* runs);
  // Lets frozen chunks change again (a flush that will not commit them).
  void Thaw(File& file, const std::vector<uint64_t>& chunks);
  // True when `chunks` (frozen) are all the file holds: the last cached data.
  bool HoldsOnly(const File& file, const std::vector<uint64_t>& chunks) const;
  // After a flush wrote every valid block it saw: releases those chunks.
  void FinishFlush(InodeNumber ino, File& file, const std::vector<uint64_t>& flushed_chunks);

  // --- the flusher ---
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
  // A fixed, chunk-aligned window of a file; `valid` marks blocks whose bytes
  // here are the file's current contents.
  struct Chunk {
    explicit Chunk(PooledBuffer buffer) : data(std::move(buffer)) {}
    PooledBuffer data;
    std::vector<bool> valid;
    uint64_t valid_blocks = 0;
    // Being written to the SSD: its bytes and valid bits must not change
    // until the flush commits (Freeze).
    bool flushing = false;
  };

  // Chunk for block `block` of `file`, created (all blocks invalid) if absent;
  // ENOMEM when there is no memory for a new one.
  Result<Chunk*> ChunkFor(File& file, uint64_t block);
  // Removes the chunks of blocks [first_block, last_block) that hold no
  // valid block (a write that failed after making them).
  void DropEmptyChunks(File& file, uint64_t first_block, uint64_t last_block);
  // Chunk memory above 3/4 of the tier.
  bool OverHighWatermarkLocked() const REQUIRES(mu_) { return used_bytes_ > capacity_ / 4 * 3; }
  // Over the high watermark, or a writer waits for room.
  bool PressedLocked() const REQUIRES(mu_) { return OverHighWatermarkLocked() || room_wanted_bytes_ > 0; }

  const uint64_t capacity_;
  const uint64_t block_size_;
  BufferPool pool_;  // declared before files_: outlives every chunk
  mutable Mutex mu_;
  CondVar room_{&mu_};  // signalled when memory is released
  CondVar work_{&mu_};  // signalled when the flusher should look
  bool work_pending_ GUARDED_BY(mu_) = false;
  std::unordered_map<InodeNumber, std::shared_ptr<File>> files_ GUARDED_BY(mu_);
  uint64_t used_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t files_made_ GUARDED_BY(mu_) = 0;         // File::id of the last entry made
  uint64_t room_wanted_bytes_ GUARDED_BY(mu_) = 0;  // the bytes writers in WaitForRoom wait for, in all (each > 0)
  uint64_t dirty_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t cancelled_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t room_wait_timeouts_ GUARDED_BY(mu_) = 0;
};

// Only RamTier reads or changes a File's state. Guards: "I/O lock" is the
// inode's Filesystem::IoLock (exclusive to change, shared to read), "mu_" the
// owning RamTier's.
class RamTier::File {
 public:
  bool ephemeral() const { return is_ephemeral; }

 private:
  friend class RamTier;

  std::map<uint64_t, Chunk> chunks;  // I/O lock. Chunk index -> chunk
  uint64_t size = 0;                 // mu_. Logical size including cached data
  int64_t mtime_ns = 0;              // mu_
  int64_t first_dirty_ns = 0;        // mu_. When the oldest unflushed data arrived
  // mu_ and the I/O lock to change, either to read. SteadyNowNs() of the last
  // write (utimes does not move it).
  int64_t last_write_ns = 0;
  bool is_ephemeral = false;  // fixed when the entry is made (under mu_)
  uint64_t dirty_bytes = 0;   // mu_. Valid bytes held (accounting)
  uint64_t chunk_count = 0;   // mu_. chunks.size(), readable without the I/O lock
  uint64_t held_bytes = 0;    // mu_. Space promised by Allocator::Hold for this data
  // mu_. Odd while a flush of the file commits its mapping (BeginCommit to
  // EndCommit): a reader of the overlay and the committed record that
  // straddled a commit sees it changed. With `id` (unique among the entries
  // ever made, fixed when the entry is made), since an entry whose data is all
  // committed goes, and the next write makes a new one.
  uint64_t commit_seq = 0;
  uint64_t id = 0;
};

}  // namespace spillfs
