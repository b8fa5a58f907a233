// Filesystem: reads and writes served by the write-back RAM tier (cached
// writes, cached reads, the overlay of a cached file's attributes). The
// flushes that take its data to the SSD are the cache's (spillfs/cache/ram_tier_flusher.h).
#include <chrono>
#include <cstring>
#include <thread>

#include "spillfs/core/filesystem.h"
#include "spillfs/common/clock.h"
#include "spillfs/common/rounding.h"

namespace spillfs {

namespace {

// Takes `mu` exclusively, spinning for up to `limit` before it sleeps. A
// sequential writer's previous request was answered before its copy into the
// RAM tier and holds the lock for that copy (tens of microseconds): sleeping
// on it would add a wake-up to every request. Spins only where a CPU is to
// spare.
void LockSpinning(SharedMutex* mu, std::chrono::microseconds limit) ACQUIRE(mu) {
  static const bool spin = std::thread::hardware_concurrency() >= 4;
  if (spin) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (mu->TryLock()) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();  // let the sibling hyperthread run
#endif
    }
  }
  mu->Lock();
}

}  // namespace

Result<size_t> Filesystem::WriteCached(InodeNumber ino, uint64_t offset, const char* data, size_t size,
                                       const WriteAccepted* accepted) {
  uint64_t first_block = offset / block_size_;
  uint64_t end = offset + size;
  uint64_t last_block = DivideRoundingUp(end, block_size_);
  LockSpinning(&IoLock(ino), std::chrono::microseconds(200));
  WriterLock io_lock(&IoLock(ino), kAdoptLock);
  ContentChange change(&read_ahead_, ino);  // before io_lock lets readers in
  // Chunks being written to the SSD are frozen: wait for that flush (it
  // holds the flush lock throughout), then look again.
  for (auto frozen = FindCachedChunk(ino, first_block, last_block, /*flushing_only=*/true); frozen;
       frozen = FindCachedChunk(ino, first_block, last_block, /*flushing_only=*/true)) {
    io_lock.Unlock();
    { ExclusiveLock wait_for_flush(&FlushLock(ino)); }
    io_lock.Lock();
  }
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "write to a non-regular file");
  auto file = ram_tier_.GetOrCreate(ino, record.size, record.mtime_ns, record.flags & kInodeEphemeral);
  // Every block that becomes dirty needs a new block at flush (redirect-on-
  // write): promise that space now, so a full volume fails this write.
  uint64_t new_blocks = ram_tier_.CountMissingBlocks(*file, first_block, last_block);
  SPILLFS_RETURN_IF_ERROR(allocator_.Hold(new_blocks * block_size_));
  ram_tier_.AddHold(*file, new_blocks * block_size_);
  // Everything that can fail first: the chunks, and the old bytes of an edge
  // block that is only partly written and touched for the first time.
  if (Status made = ram_tier_.MakeChunks(*file, first_block, last_block); !made.ok()) {  // ENOMEM: no memory
    // Nothing was written: the space it was promised goes back (MakeChunks
    // gave back the chunks it made).
    allocator_.ReleaseHold(ram_tier_.TakeHold(*file, new_blocks * block_size_));
    return made;
  }
  // Edge blocks (their chunks made above): the old bytes of a block past
  // both the committed and the cached size are zeros: no index lookup (an
  // unaligned sequential writer, such as a direct_io handle under
  // torch.save, has such a block at the end of every write).
  const uint64_t size_before = std::max(record.size, ram_tier_.CachedSize(*file));
  auto prime_edge = [&](uint64_t block) -> Status {
    uint64_t block_start = block * block_size_;
    if (offset <= block_start && end >= block_start + block_size_) return Status::OK();  // wholly written
    if (ram_tier_.CachedBlock(*file, block) != nullptr) return Status::OK();
    char* old_bytes = ram_tier_.BlockSlot(*file, block);
    if (block_start >= size_before) {
      std::memset(old_bytes, 0, block_size_);
      return Status::OK();
    }
    return ReadBlocks(ino, block, 1, old_bytes);
  };
  SPILLFS_RETURN_IF_ERROR(prime_edge(first_block));
  if (last_block - 1 != first_block) SPILLFS_RETURN_IF_ERROR(prime_edge(last_block - 1));
  // The size first: getattr (which takes neither lock) may see it before
  // the blocks, never blocks past the size.
  ram_tier_.NoteWrite(*file, end, NowNs());
  ram_tier_.MarkValid(*file, first_block, last_block - first_block);
  // The write cannot fail now: let the caller answer it, and copy while the
  // next request is on its way. Readers and the flusher wait for the I/O
  // lock, so nobody sees the blocks before the copy is done.
  if (accepted != nullptr) (*accepted)(size);
  ram_tier_.CopyIn(*file, offset, data, size);
  counters_.bytes_written.fetch_add(size, std::memory_order_relaxed);
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  if (ram_tier_.WantsFlush(*file)) ram_tier_.WakeFlusher();
  return size;
}

bool Filesystem::FindCachedChunk(InodeNumber ino, uint64_t first_block, uint64_t last_block, bool flushing_only) {
  auto file = ram_tier_.Find(ino);
  return file && ram_tier_.HasChunkIn(*file, first_block, last_block, flushing_only);
}

bool Filesystem::CachedPieces(InodeNumber ino, uint64_t offset, uint64_t end, std::vector<iovec>* pieces) {
  pieces->clear();
  auto file = ram_tier_.Find(ino);
  if (!file) return false;
  uint64_t blocks = 0;
  for (uint64_t block = offset / block_size_; block * block_size_ < end; ++block, ++blocks) {
    char* cached = ram_tier_.CachedBlock(*file, block);
    if (cached == nullptr) {
      pieces->clear();
      return false;
    }
    const uint64_t block_start = block * block_size_;
    const uint64_t from = std::max(offset, block_start);
    const uint64_t to = std::min(end, block_start + block_size_);
    char* bytes = cached + (from - block_start);
    iovec* last = pieces->empty() ? nullptr : &pieces->back();
    if (last != nullptr && static_cast<char*>(last->iov_base) + last->iov_len == bytes) {
      last->iov_len += to - from;
    } else {
      pieces->push_back(iovec{bytes, to - from});
    }
  }
  counters_.ram_tier_hits.fetch_add(blocks, std::memory_order_relaxed);
  return true;
}

Status Filesystem::ReadBlocksCached(InodeNumber ino, uint64_t first_block, uint64_t count, char* out) {
  auto file = ram_tier_.Find(ino);
  if (!file) return ReadBlocks(ino, first_block, count, out);
  // Copy cached blocks; read each run of uncached blocks from the SSD.
  uint64_t run_start = 0, run_length = 0;
  auto read_run = [&]() -> Status {
    if (run_length == 0) return Status::OK();
    Status s = ReadBlocks(ino, run_start, run_length, out + (run_start - first_block) * block_size_);
    run_length = 0;
    return s;
  };
  for (uint64_t block = first_block; block < first_block + count; ++block) {
    if (const char* bytes = ram_tier_.CachedBlock(*file, block)) {
      counters_.ram_tier_hits.fetch_add(1, std::memory_order_relaxed);
      SPILLFS_RETURN_IF_ERROR(read_run());
      std::memcpy(out + (block - first_block) * block_size_, bytes, block_size_);
    } else {
      if (run_length == 0) run_start = block;
      ++run_length;
    }
  }
  return read_run();
}

void Filesystem::ApplyOverlay(const RamTier::Overlay& overlay, Entry* entry) {
  struct stat& st = entry->attr;
  st.st_size = static_cast<off_t>(overlay.size);
  st.st_mtim.tv_sec = overlay.mtime_ns / 1000000000;
  st.st_mtim.tv_nsec = overlay.mtime_ns % 1000000000;
  if (overlay.mtime_ns > st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec) st.st_ctim = st.st_mtim;
  st.st_blocks += static_cast<blkcnt_t>(overlay.dirty_bytes / 512);
}

}  // namespace spillfs
