#include "spillfs/cache/ram_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "spillfs/common/clock.h"

namespace spillfs {
namespace {

constexpr uint64_t kSlabBytes = 32 << 20;
// A file written within this long is taken to be still appended to.
constexpr int64_t kAppendingNs = 1'000'000'000;

}  // namespace

RamTier::RamTier(uint64_t capacity_bytes, uint64_t block_size, BufferPool::SlabFault slab_fault)
    : capacity_(capacity_bytes), block_size_(block_size), pool_(kChunkBytes, kSlabBytes, std::move(slab_fault)) {}

void RamTier::WarmUp(uint64_t bytes) { pool_.Warm(std::min(bytes, capacity_)); }

std::shared_ptr<RamTier::File> RamTier::Find(InodeNumber ino) const {
  MutexLock lock(&mu_);
  auto it = files_.find(ino);
  return it == files_.end() ? nullptr : it->second;
}

std::shared_ptr<RamTier::File> RamTier::GetOrCreate(InodeNumber ino, uint64_t size, int64_t mtime_ns, bool ephemeral) {
  MutexLock lock(&mu_);
  auto& file = files_[ino];
  if (!file) {
    file = std::make_shared<File>();
    file->size = size;
    file->mtime_ns = mtime_ns;
    file->is_ephemeral = ephemeral;
    file->id = ++files_made_;
  }
  return file;
}

uint64_t RamTier::CachedSize(const File& file) const {
  MutexLock lock(&mu_);
  return file.size;
}

std::optional<RamTier::Overlay> RamTier::GetOverlay(InodeNumber ino) const {
  MutexLock lock(&mu_);
  auto it = files_.find(ino);
  if (it == files_.end()) return std::nullopt;
  const File& file = *it->second;
  return Overlay{file.size, file.mtime_ns, file.dirty_bytes, {file.id, file.commit_seq}};
}

std::optional<std::pair<uint64_t, uint64_t>> RamTier::CommitMark(InodeNumber ino) const {
  MutexLock lock(&mu_);
  auto it = files_.find(ino);
  if (it == files_.end()) return std::nullopt;
  return std::make_pair(it->second->id, it->second->commit_seq);
}

void RamTier::BeginCommit(File& file) {
  MutexLock lock(&mu_);
  ++file.commit_seq;
}

void RamTier::EndCommit(File& file) {
  MutexLock lock(&mu_);
  ++file.commit_seq;
}

Result<RamTier::Chunk*> RamTier::ChunkFor(File& file, uint64_t block) {
  uint64_t index = block / blocks_per_chunk();
  auto it = file.chunks.find(index);
  if (it != file.chunks.end()) return &it->second;
  SPILLFS_ASSIGN_OR_RETURN(PooledBuffer buffer, PooledBuffer::Take(&pool_));
  Chunk fresh(std::move(buffer));
  fresh.valid.assign(blocks_per_chunk(), false);  // whole before it is in the table
  Chunk& chunk = file.chunks.try_emplace(index, std::move(fresh)).first->second;
  MutexLock lock(&mu_);
  used_bytes_ += kChunkBytes;
  ++file.chunk_count;
  return &chunk;
}

void RamTier::DropEmptyChunks(File& file, uint64_t first_block, uint64_t last_block) {
  uint64_t freed_chunks = 0;
  auto end = file.chunks.lower_bound((last_block + blocks_per_chunk() - 1) / blocks_per_chunk());
  for (auto it = file.chunks.lower_bound(first_block / blocks_per_chunk()); it != end;) {
    if (it->second.valid_blocks == 0 && !it->second.flushing) {
      it = file.chunks.erase(it);
      ++freed_chunks;
    } else {
      ++it;
    }
  }
  if (freed_chunks == 0) return;
  MutexLock lock(&mu_);
  used_bytes_ -= freed_chunks * kChunkBytes;
  file.chunk_count -= freed_chunks;
  room_.SignalAll();
}

char* RamTier::CachedBlock(File& file, uint64_t block) const {
  auto it = file.chunks.find(block / blocks_per_chunk());
  if (it == file.chunks.end() || !it->second.valid[block % blocks_per_chunk()]) return nullptr;
  return it->second.data.data() + (block % blocks_per_chunk()) * block_size_;
}

uint64_t RamTier::CountMissingBlocks(const File& file, uint64_t first_block, uint64_t last_block) const {
  const uint64_t per_chunk = blocks_per_chunk();
  uint64_t missing = 0;
  for (uint64_t block = first_block; block < last_block; ++block) {
    auto it = file.chunks.find(block / per_chunk);
    if (it == file.chunks.end() || !it->second.valid[block % per_chunk]) ++missing;
  }
  return missing;
}

Status RamTier::MakeChunks(File& file, uint64_t first_block, uint64_t last_block) {
  const uint64_t per_chunk = blocks_per_chunk();
  for (uint64_t chunk = first_block / per_chunk; chunk <= (last_block - 1) / per_chunk; ++chunk) {
    if (auto made = ChunkFor(file, chunk * per_chunk); !made.ok()) {
      DropEmptyChunks(file, first_block, last_block);
      return made.status();
    }
  }
  return Status::OK();
}

char* RamTier::BlockSlot(File& file, uint64_t block) {
  return file.chunks.at(block / blocks_per_chunk()).data.data() + (block % blocks_per_chunk()) * block_size_;
}

void RamTier::CopyIn(File& file, uint64_t offset, const char* data, uint64_t size) {
  const uint64_t end = offset + size;
  for (uint64_t chunk = offset / kChunkBytes; chunk <= (end - 1) / kChunkBytes; ++chunk) {
    uint64_t chunk_start = chunk * kChunkBytes;
    uint64_t from = std::max(offset, chunk_start);
    uint64_t to = std::min(end, chunk_start + kChunkBytes);
    char* dst = file.chunks.at(chunk).data.data();
    std::memcpy(dst + (from - chunk_start), data + (from - offset), to - from);
  }
}

void RamTier::ZeroBlockTail(File& file, uint64_t offset) {
  const uint64_t in_block = offset % block_size_;
  if (in_block == 0) return;
  if (char* bytes = CachedBlock(file, offset / block_size_)) std::memset(bytes + in_block, 0, block_size_ - in_block);
}

bool RamTier::HasChunkIn(const File& file, uint64_t first_block, uint64_t last_block, bool flushing_only) const {
  const uint64_t per_chunk = blocks_per_chunk();
  auto it = file.chunks.lower_bound(first_block / per_chunk);
  for (; it != file.chunks.end() && it->first <= (last_block - 1) / per_chunk; ++it) {
    if (!flushing_only || it->second.flushing) return true;
  }
  return false;
}

void RamTier::MarkValid(File& file, uint64_t block, uint64_t count) {
  uint64_t added = 0;
  for (uint64_t b = block; b < block + count; ++b) {
    Chunk& chunk = file.chunks.at(b / blocks_per_chunk());
    auto bit = chunk.valid[b % blocks_per_chunk()];
    if (!bit) {
      chunk.valid[b % blocks_per_chunk()] = true;
      ++chunk.valid_blocks;
      ++added;
    }
  }
  MutexLock lock(&mu_);
  file.dirty_bytes += added * block_size_;
  dirty_bytes_ += added * block_size_;
}

void RamTier::NoteWrite(File& file, uint64_t end_offset, int64_t mtime_ns) {
  MutexLock lock(&mu_);
  file.size = std::max(file.size, end_offset);
  file.mtime_ns = mtime_ns;
  file.last_write_ns = SteadyNowNs();
  if (file.first_dirty_ns == 0) file.first_dirty_ns = mtime_ns;
}

void RamTier::SetAttrs(File& file, std::optional<uint64_t> size, std::optional<int64_t> mtime_ns) {
  MutexLock lock(&mu_);
  if (size) file.size = *size;
  if (mtime_ns) file.mtime_ns = *mtime_ns;
}

void RamTier::AddHold(File& file, uint64_t bytes) {
  MutexLock lock(&mu_);
  file.held_bytes += bytes;
}

uint64_t RamTier::TakeHold(File& file, uint64_t max_bytes) {
  MutexLock lock(&mu_);
  uint64_t taken = std::min(file.held_bytes, max_bytes);
  file.held_bytes -= taken;
  return taken;
}

uint64_t RamTier::DropFrom(InodeNumber ino, File& file, uint64_t block, bool cancelled) {
  uint64_t dropped_blocks = 0;
  uint64_t freed_chunks = 0;
  for (auto it = file.chunks.lower_bound(block / blocks_per_chunk()); it != file.chunks.end();) {
    Chunk& chunk = it->second;
    uint64_t base = it->first * blocks_per_chunk();
    for (uint64_t i = block > base ? block - base : 0; i < blocks_per_chunk(); ++i) {
      if (chunk.valid[i]) {
        chunk.valid[i] = false;
        --chunk.valid_blocks;
        ++dropped_blocks;
      }
    }
    if (chunk.valid_blocks == 0) {
      it = file.chunks.erase(it);
      ++freed_chunks;
    } else {
      ++it;
    }
  }
  MutexLock lock(&mu_);
  uint64_t bytes = dropped_blocks * block_size_;
  file.dirty_bytes -= bytes;
  dirty_bytes_ -= bytes;
  used_bytes_ -= freed_chunks * kChunkBytes;
  file.chunk_count -= freed_chunks;
  if (cancelled) cancelled_bytes_ += bytes;
  if (file.chunk_count == 0) file.first_dirty_ns = 0;
  if (freed_chunks > 0) room_.SignalAll();
  uint64_t hold = std::min(file.held_bytes, bytes);
  file.held_bytes -= hold;
  return hold;
}

uint64_t RamTier::Remove(InodeNumber ino, bool cancelled) {
  MutexLock lock(&mu_);
  auto it = files_.find(ino);
  if (it == files_.end()) return 0;
  File& file = *it->second;
  uint64_t bytes = file.dirty_bytes;
  uint64_t hold = std::exchange(file.held_bytes, 0);
  dirty_bytes_ -= bytes;
  used_bytes_ -= file.chunk_count * kChunkBytes;
  if (cancelled) cancelled_bytes_ += bytes;
  file.dirty_bytes = 0;
  file.chunk_count = 0;
  files_.erase(it);  // a flush in progress keeps the buffers alive through its shared_ptr
  room_.SignalAll();
  return hold;
}

std::vector<uint64_t> RamTier::ChunksToFlush(const File& file, bool background, bool refill) const {
  // A partly filled last chunk stays while a writer is likely filling it; an
  // idle file's goes too, or files that each end in one (small ephemeral
  // files, which close does not flush) would hold the tier full for good.
  // A refill skips the chunks already on their way (this flush's batches).
  std::vector<uint64_t> chunks;
  for (const auto& [index, chunk] : file.chunks) {
    if (!refill || !chunk.flushing) chunks.push_back(index);
  }
  if (background && !chunks.empty() && file.chunks.at(chunks.back()).valid_blocks < blocks_per_chunk() &&
      SteadyNowNs() - file.last_write_ns < kAppendingNs) {
    chunks.pop_back();
  }
  return chunks;
}

std::vector<uint64_t> RamTier::Freeze(File& file, const std::vector<uint64_t>& chunks, std::vector<Run>* runs) {
  const uint64_t per_chunk = blocks_per_chunk();
  std::vector<uint64_t> frozen;
  for (uint64_t index : chunks) {
    auto it = file.chunks.find(index);
    if (it == file.chunks.end()) continue;
    Chunk& chunk = it->second;
    chunk.flushing = true;
    frozen.push_back(index);
    for (uint64_t i = 0; i < per_chunk;) {
      if (!chunk.valid[i]) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < per_chunk && chunk.valid[j]) ++j;
      runs->push_back(
          Run{(index * per_chunk + i) * block_size_, chunk.data.data() + i * block_size_, (j - i) * block_size_});
      i = j;
    }
  }
  return frozen;
}

void RamTier::Thaw(File& file, const std::vector<uint64_t>& chunks) {
  for (uint64_t index : chunks) {
    auto it = file.chunks.find(index);
    if (it != file.chunks.end()) it->second.flushing = false;
  }
}

bool RamTier::HoldsOnly(const File& file, const std::vector<uint64_t>& chunks) const {
  return file.chunks.size() == chunks.size();
}

void RamTier::FinishFlush(InodeNumber ino, File& file, const std::vector<uint64_t>& flushed_chunks) {
  uint64_t bytes = 0, erased = 0;
  for (uint64_t index : flushed_chunks) {
    auto it = file.chunks.find(index);
    if (it == file.chunks.end()) continue;
    bytes += it->second.valid_blocks * block_size_;
    file.chunks.erase(it);
    ++erased;
  }
  MutexLock lock(&mu_);
  auto entry = files_.find(ino);
  bool live = entry != files_.end() && entry->second.get() == &file;
  if (live) {
    file.dirty_bytes -= bytes;
    dirty_bytes_ -= bytes;
    used_bytes_ -= erased * kChunkBytes;
    file.chunk_count -= erased;
    if (file.chunk_count == 0) files_.erase(entry);  // size and mtime are committed now
  }
  room_.SignalAll();
}

std::vector<InodeNumber> RamTier::PickVictims(int64_t now_ns, int64_t max_age_ns, bool all) const {
  MutexLock lock(&mu_);
  std::vector<std::pair<int64_t, InodeNumber>> candidates;
  // A waiting writer is pressure too: below the watermark, nothing would be
  // flushed for it until files grew old.
  bool pressure = PressedLocked();
  for (const auto& [ino, file] : files_) {
    if (file->chunk_count == 0) continue;
    bool old =
        !file->is_ephemeral && (now_ns - file->first_dirty_ns > max_age_ns || file->dirty_bytes >= kWriteBehindBytes);
    if (all || old || pressure) candidates.emplace_back(file->first_dirty_ns, ino);
  }
  std::sort(candidates.begin(), candidates.end());
  std::vector<InodeNumber> out;
  uint64_t target = std::min(capacity_ / 2, capacity_ - std::min(capacity_, room_wanted_bytes_));
  uint64_t projected = used_bytes_;
  for (auto& [when, ino] : candidates) {
    const File& file = *files_.at(ino);
    bool old =
        !file.is_ephemeral && (now_ns - file.first_dirty_ns > max_age_ns || file.dirty_bytes >= kWriteBehindBytes);
    if (!all && !old && projected <= target) continue;
    out.push_back(ino);
    projected -= std::min(projected, file.chunk_count * kChunkBytes);
  }
  return out;
}

bool RamTier::WantsFlush(const File& file) const {
  MutexLock lock(&mu_);
  return OverHighWatermarkLocked() || (!file.is_ephemeral && file.dirty_bytes >= kWriteBehindBytes);
}

bool RamTier::WaitForRoom(uint64_t bytes, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  if (used_bytes_ + bytes <= capacity_) return true;
  if (bytes > capacity_) return false;
  work_pending_ = true;
  work_.SignalAll();
  room_wanted_bytes_ += bytes;
  bool room = false;
  while (!(room = used_bytes_ + bytes <= capacity_) && room_.WaitUntil(deadline)) {
  }
  if (!room) room = used_bytes_ + bytes <= capacity_;  // freed as the wait timed out
  room_wanted_bytes_ -= bytes;
  if (!room) ++room_wait_timeouts_;
  return room;
}

bool RamTier::Pressed() const {
  MutexLock lock(&mu_);
  return PressedLocked();
}

void RamTier::WakeFlusher() {
  MutexLock lock(&mu_);
  work_pending_ = true;
  work_.SignalAll();
}

bool RamTier::WaitForWork(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (!work_pending_ && work_.WaitUntil(deadline)) {
  }
  const bool woken = work_pending_;
  work_pending_ = false;
  return woken;
}

RamTier::Stats RamTier::stats() const {
  MutexLock lock(&mu_);
  return Stats{capacity_, used_bytes_, dirty_bytes_, cancelled_bytes_, files_.size(), room_wait_timeouts_};
}

}  // namespace spillfs
