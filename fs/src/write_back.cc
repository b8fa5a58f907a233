// Filesystem: the write-back RAM tier — cached writes, cached reads, flushes
// and the background flusher.
#include <fmt/format.h>

#include <xxhash.h>

#include <cstring>
#include <set>

#include "spillfs/fs/clock.h"
#include "spillfs/fs/filesystem.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

Result<size_t> Filesystem::WriteCached(InodeNumber ino, uint64_t offset, const char* data, size_t size) {
  std::unique_lock io_lock(IoLock(ino));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "write to a non-regular file");
  auto file = cache_.GetOrCreate(ino, record.size, record.mtime_ns, record.flags & kInodeEphemeral);
  const uint64_t per_chunk = cache_.blocks_per_chunk();
  uint64_t first_block = offset / block_size_;
  uint64_t end = offset + size;
  uint64_t last_block = (end + block_size_ - 1) / block_size_;
  // Every block that becomes dirty needs a new block at flush (redirect-on-
  // write): promise that space now, so a full volume fails this write.
  uint64_t new_blocks = 0;
  for (uint64_t block = first_block; block < last_block; ++block) {
    auto it = file->chunks.find(block / per_chunk);
    if (it == file->chunks.end() || !it->second.valid[block % per_chunk]) ++new_blocks;
  }
  SPILLFS_RETURN_IF_ERROR(allocator_.Hold(new_blocks * block_size_));
  cache_.AddHold(*file, new_blocks * block_size_);
  for (uint64_t block = first_block; block < last_block; ++block) {
    WriteBackCache::Chunk& chunk = cache_.ChunkFor(*file, block);
    char* dst = chunk.data.data() + (block % per_chunk) * block_size_;
    uint64_t block_start = block * block_size_;
    uint64_t from = std::max(offset, block_start);
    uint64_t to = std::min(end, block_start + block_size_);
    bool partial = from != block_start || to != block_start + block_size_;
    if (partial && !chunk.valid[block % per_chunk]) {
      // First touch of a partly written block: start from its current bytes.
      SPILLFS_RETURN_IF_ERROR(ReadBlocks(ino, block, 1, dst));
    }
    std::memcpy(dst + (from - block_start), data + (from - offset), to - from);
  }
  cache_.MarkValid(*file, first_block, last_block - first_block);
  cache_.NoteWrite(*file, end, NowNs());
  counters_.bytes_written.fetch_add(size, std::memory_order_relaxed);
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  if (cache_.OverHighWatermark()) cache_.WakeFlusher();
  return size;
}

Status Filesystem::ReadBlocksCached(InodeNumber ino, uint64_t first_block, uint64_t count, char* out) {
  auto file = cache_.Find(ino);
  if (!file) return ReadBlocks(ino, first_block, count, out);
  const uint64_t per_chunk = cache_.blocks_per_chunk();
  auto cached = [&](uint64_t block) -> const char* {
    auto it = file->chunks.find(block / per_chunk);
    if (it == file->chunks.end() || !it->second.valid[block % per_chunk]) return nullptr;
    return it->second.data.data() + (block % per_chunk) * block_size_;
  };
  // Copy cached blocks; read each run of uncached blocks from the SSD.
  uint64_t run_start = 0, run_length = 0;
  auto read_run = [&]() -> Status {
    if (run_length == 0) return Status::OK();
    Status s = ReadBlocks(ino, run_start, run_length, out + (run_start - first_block) * block_size_);
    run_length = 0;
    return s;
  };
  for (uint64_t block = first_block; block < first_block + count; ++block) {
    if (const char* bytes = cached(block)) {
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

Status Filesystem::FlushFile(InodeNumber ino) {
  if (!cache_.Find(ino)) return Status::OK();
  std::unique_lock io_lock(IoLock(ino));
  return FlushLocked(ino);
}

Status Filesystem::FlushLocked(InodeNumber ino) {
  // A dedup hit can vanish between lookup and commit; then flush again, and
  // the last time without dedup.
  for (int attempt = 0;; ++attempt) {
    Status s = FlushOnce(ino, dedup_ && attempt < 2);
    if (s.code() != EAGAIN) return s;
  }
}

void Filesystem::Deduplicate(std::vector<Segment>* segments, std::vector<SharedRef>* shared) {
  std::vector<Segment> to_write;
  std::set<std::string> new_hashes;  // within one flush, only the first copy becomes a blob
  for (Segment& segment : *segments) {
    if (segment.length == kDedupUnit && segment.file_offset % kDedupUnit == 0) {
      XXH128_hash_t h = XXH3_128bits(segment.data, segment.length);
      std::string hash(reinterpret_cast<const char*>(&h), sizeof(h));
      std::string value;
      if (index_.Get(Family::kBlob, keys::BlobByHash(hash), &value).ok() && value.size() == 8) {
        shared->push_back(SharedRef{segment.file_offset, coding::DecodeFixed64BE(value.data()), hash, segment.data});
        continue;
      }
      if (new_hashes.insert(hash).second) segment.blob_hash = hash;
    }
    to_write.push_back(segment);
  }
  *segments = std::move(to_write);
}

Status Filesystem::FlushOnce(InodeNumber ino, bool dedup) {
  auto file = cache_.Find(ino);
  if (!file) return Status::OK();
  const uint64_t per_chunk = cache_.blocks_per_chunk();
  std::vector<Segment> segments;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<uint64_t> flushed_chunks;
  uint64_t total = 0;
  for (auto& [index, chunk] : file->chunks) {
    flushed_chunks.push_back(index);
    for (uint64_t i = 0; i < per_chunk;) {
      if (!chunk.valid[i]) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < per_chunk && chunk.valid[j]) ++j;
      uint64_t file_offset = (index * per_chunk + i) * block_size_;
      uint64_t length = (j - i) * block_size_;
      segments.push_back(Segment{file_offset, chunk.data.data() + i * block_size_, length, {}});
      total += length;
      if (!ranges.empty() && ranges.back().second == file_offset) {
        ranges.back().second += length;
      } else {
        ranges.emplace_back(file_offset, file_offset + length);
      }
      i = j;
    }
  }
  std::vector<SharedRef> shared;
  if (dedup) Deduplicate(&segments, &shared);
  uint64_t fresh_bytes = total - shared.size() * kDedupUnit;
  uint64_t hold = cache_.TakeHold(*file);
  auto written_extents = WriteSegments(segments, std::min(hold, fresh_bytes));
  if (!written_extents.ok()) {
    if (allocator_.Hold(hold).ok()) cache_.AddHold(*file, hold);  // keep the promise for a retry
    return written_extents.status();
  }
  auto extents = std::move(written_extents).value();
  allocator_.ReleaseHold(hold - std::min(hold, fresh_bytes));  // dedup hits need no space
  auto give_back = [&]() {
    std::vector<PhysicalExtent> space;
    for (auto& [offset, extent] : extents) space.push_back(PhysicalExtent{extent.physical, extent.length});
    allocator_.Unreserve(space);
  };
  auto overlay = cache_.GetOverlay(ino);

  std::lock_guard lock(mu_);
  auto record = LoadInode(ino);
  if (!record.ok()) {
    give_back();  // reclaimed while we wrote: the new blocks were never mapped
    cache_.FinishFlush(ino, *file, flushed_chunks);
    return record.status().code() == ENOENT ? Status::OK() : record.status();
  }
  Txn txn(index_);
  for (const SharedRef& ref : shared) {
    std::string value;
    auto blob = index_.Get(Family::kBlob, keys::BlobByPhysical(ref.blob), &value).ok() ? BlobRecord::Decode(value)
                                                                                      : Result<BlobRecord>(Status::NotFound());
    if (!blob.ok() || blob->hash != ref.hash || blob->length != kDedupUnit) {
      give_back();
      if (allocator_.Hold(hold).ok()) cache_.AddHold(*file, hold);  // the retry needs the whole promise again
      return Status::Error(EAGAIN, "dedup target vanished");
    }
  }
  for (auto& [offset, extent] : extents) {
    if (extent.blob_id == 0) continue;
    for (const Segment& segment : segments) {
      if (segment.file_offset == offset && !segment.blob_hash.empty()) {
        txn.new_blobs[extent.blob_id] = BlobRecord{segment.blob_hash, extent.length, 0};
      }
    }
  }
  uint64_t unmapped = 0;
  SPILLFS_RETURN_IF_ERROR(UnmapRanges(&txn, ino, ranges, &unmapped));
  MapExtents(&txn, ino, extents);
  for (const SharedRef& ref : shared) {
    ExtentRecord extent;
    extent.physical = ref.blob;
    extent.length = kDedupUnit;
    extent.blob_id = ref.blob;
    extent.block_checksums = Checksums(ref.data, kDedupUnit);
    txn.batch.Put(Family::kExtent, keys::Extent(ino, ref.file_offset), extent.Encode());
    ++txn.blob_refs[ref.blob];
  }
  record->allocated_bytes += total - unmapped;
  if (overlay) {
    record->size = overlay->size;
    record->mtime_ns = overlay->mtime_ns;
    record->ctime_ns = std::max(record->ctime_ns, overlay->mtime_ns);
  }
  PutInode(&txn, ino, *record);
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  counters_.bytes_deduplicated.fetch_add(shared.size() * kDedupUnit, std::memory_order_relaxed);
  cache_.FinishFlush(ino, *file, flushed_chunks);
  return Status::OK();
}

Status Filesystem::Flush(InodeNumber ino) {
  auto file = cache_.Find(ino);
  if (!file || file->ephemeral) return Status::OK();
  return FlushFile(ino);
}

Status Filesystem::FlushAll() {
  Status first;
  for (InodeNumber ino : cache_.PickVictims(NowNs(), 0, /*all=*/true)) {
    Status s = FlushFile(ino);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

void Filesystem::FlusherLoop() {
  const int64_t max_age_ns = options_.flush_age_ms * 1000000;
  while (!stopping_) {
    cache_.WaitForWork(std::chrono::milliseconds(200));
    for (InodeNumber ino : cache_.PickVictims(NowNs(), max_age_ns, /*all=*/false)) {
      if (stopping_) break;
      Status s = FlushFile(ino);
      if (!s.ok()) fmt::print(stderr, "spillfs: background flush of inode {} failed: {}\n", ino, s.ToString());
    }
  }
}

void Filesystem::ApplyOverlay(InodeNumber ino, Entry* entry) const {
  auto overlay = cache_.GetOverlay(ino);
  if (!overlay) return;
  struct stat& st = entry->attr;
  st.st_size = static_cast<off_t>(overlay->size);
  st.st_mtim.tv_sec = overlay->mtime_ns / 1000000000;
  st.st_mtim.tv_nsec = overlay->mtime_ns % 1000000000;
  if (overlay->mtime_ns > st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec) st.st_ctim = st.st_mtim;
  st.st_blocks += static_cast<blkcnt_t>(overlay->dirty_bytes / 512);
}

}  // namespace spillfs
