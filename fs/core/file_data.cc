// Filesystem: reading and writing file data, and the extent mapping under
// them. File contents live in block-aligned extents; every change writes new
// blocks (redirect-on-write) and then commits one batch that maps them and
// frees what they replace. Truncate, fallocate and seek: file_space.cc.
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <cstring>

#include "extent_walk.h"
#include "spillfs/common/block_checksum.h"
#include "spillfs/common/clock.h"
#include "spillfs/common/rounding.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {
namespace {

constexpr int64_t kDayNs = 24LL * 3600 * 1000000000;

}  // namespace

std::vector<uint32_t> Filesystem::Checksums(const char* data, uint64_t length) const {
  std::vector<uint32_t> sums;
  if (!checksums_) return sums;
  sums.reserve(length / block_size_);
  for (uint64_t at = 0; at < length; at += block_size_) {
    sums.push_back(BlockChecksum(data + at, block_size_));
  }
  return sums;
}

bool Filesystem::VerifyBlocks(const ExtentRecord& extent, uint64_t first_block, uint64_t count, const char* data) {
  if (extent.block_checksums.empty()) return true;
  for (uint64_t i = 0; i < count; ++i) {
    if (BlockChecksum(data + i * block_size_, block_size_) != extent.block_checksums[first_block + i]) {
      return false;
    }
  }
  return true;
}

Status Filesystem::ReadBlocks(InodeNumber ino, uint64_t first_block, uint64_t count, char* out, bool speculative) {
  ReclaimGate::Reader reader(&gate_);
  uint64_t start = first_block * block_size_;
  uint64_t end = start + count * block_size_;
  std::vector<IoSlice> slices;
  std::vector<MappedExtent> sources;  // parallel to slices
  // Only what no written extent covers (holes, unwritten extents) is zeroed:
  // zeroing all of `out` first cost the read-ahead threads more than their
  // checksums (a 4 MiB memset per window).
  uint64_t zeroed_to = start;  // extents come in file order
  auto zero_to = [&](uint64_t to) {
    if (to > zeroed_to) std::memset(out + (zeroed_to - start), 0, to - zeroed_to);
    zeroed_to = std::max(zeroed_to, to);
  };
  SPILLFS_RETURN_IF_ERROR(ForEachExtentClipped(index_, ino, start, end, block_size_, [&](MappedExtent e) {
    if (e.record.unwritten()) return Status::OK();
    zero_to(e.file_offset);
    zeroed_to = std::max(zeroed_to, e.end());
    slices.push_back(IoSlice{e.record.physical, out + (e.file_offset - start), e.record.length});
    sources.push_back(std::move(e));
    return Status::OK();
  }));
  zero_to(end);
  SPILLFS_RETURN_IF_ERROR(store_.ReadSlices(slices));
  uint64_t blocks_read = 0;
  for (const IoSlice& slice : slices) blocks_read += slice.length / block_size_;
  counters_.ram_tier_misses.fetch_add(blocks_read, std::memory_order_relaxed);
  for (size_t i = 0; i < slices.size(); ++i) {
    const MappedExtent& e = sources[i];
    uint64_t first = (slices[i].offset - e.record.physical) / block_size_;
    if (!VerifyBlocks(e.record, first, slices[i].length / block_size_, slices[i].buffer)) {
      if (speculative) return Status::IOError("checksum mismatch (read-ahead)");
      counters_.checksum_errors.fetch_add(1, std::memory_order_relaxed);
      uint64_t file_offset = start + static_cast<uint64_t>(slices[i].buffer - out);
      fmt::print(stderr, "spillfs: checksum mismatch in inode {} at file offset {} (physical {})\n", ino, file_offset,
                 slices[i].offset);
      return Status::IOError(fmt::format("checksum mismatch in inode {} near offset {}", ino, file_offset));
    }
  }
  return Status::OK();
}

Result<std::vector<std::pair<uint64_t, ExtentRecord>>> Filesystem::WriteBlocks(const InodeRecord& record,
                                                                               const char* data, uint64_t file_offset,
                                                                               uint64_t length) {
  SPILLFS_ASSIGN_OR_RETURN(SegmentPlan plan, PlanSegments(&allocator_, {Segment{file_offset, data, length, {}, {}, {}}},
                                                          /*from_hold=*/0, block_size_, block_sums_));
  Status written = store_.WriteSlices(plan.slices);
  if (written.ok()) written = FlushBeforeMapping(record);
  if (!written.ok()) {
    allocator_.Unreserve(plan.space);
    return written;
  }
  return std::move(plan.extents);
}

Status Filesystem::UnmapRanges(Txn* txn, InodeNumber ino, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                               uint64_t* unmapped) {
  uint64_t total = 0;
  if (ranges.empty()) {
    if (unmapped) *unmapped = 0;
    return Status::OK();
  }
  // Each old extent is visited once and cut by every range it overlaps, so a
  // batch never holds two conflicting rewrites of one extent key.
  SPILLFS_RETURN_IF_ERROR(
      ForEachExtent(index_, ino, ranges.front().first, ranges.back().second, [&](const MappedExtent& e) {
        uint64_t keep_from = e.file_offset;  // start of the next surviving piece
        bool touched = false;
        const uint64_t blob = e.record.blob_id;  // shared space is freed by its blob's last reference
        auto keep = [&](uint64_t from, uint64_t to) {
          txn->batch.Put(Family::kExtent, keys::Extent(ino, from),
                         Slice(e.record, from - e.file_offset, to - from, block_size_).Encode());
          if (blob != 0) ++txn->blob_refs[blob];
        };
        for (auto [start, end] : ranges) {
          if (end <= e.file_offset || start >= e.end()) continue;
          if (!touched) {
            txn->batch.Delete(Family::kExtent, keys::Extent(ino, e.file_offset));
            if (blob != 0) --txn->blob_refs[blob];
          }
          touched = true;
          uint64_t from = std::max(start, e.file_offset);
          uint64_t to = std::min(end, e.end());
          if (keep_from < from) keep(keep_from, from);
          if (blob == 0) txn->freed.push_back(PhysicalExtent{e.record.physical + (from - e.file_offset), to - from});
          total += to - from;
          keep_from = to;
        }
        if (touched && keep_from < e.end()) keep(keep_from, e.end());
        return Status::OK();
      }));
  if (unmapped) *unmapped = total;
  return Status::OK();
}

Status Filesystem::UnmapRange(Txn* txn, InodeNumber ino, uint64_t start, uint64_t end, uint64_t* unmapped) {
  return UnmapRanges(txn, ino, {{start, end}}, unmapped);
}

// Maps freshly written extents; one that is a new dedup blob (blob_id set)
// is registered by the caller in txn->new_blobs and gets its first reference.
void Filesystem::MapExtents(Txn* txn, InodeNumber ino, const std::vector<std::pair<uint64_t, ExtentRecord>>& extents) {
  std::vector<PhysicalExtent> space;
  for (const auto& [offset, record] : extents) {
    txn->batch.Put(Family::kExtent, keys::Extent(ino, offset), record.Encode());
    space.push_back(PhysicalExtent{record.physical, record.length});
    if (record.blob_id != 0) ++txn->blob_refs[record.blob_id];
  }
  allocator_.CommitAllocated(space, &txn->batch);
}

// ---- read and write ----

Result<size_t> Filesystem::Read(InodeNumber ino, uint64_t offset, size_t size, AlignedBuffer* scratch,
                                const ReadSink& sink) {
  ReaderLock io_lock(&IoLock(ino));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (S_ISDIR(record.mode)) return Status::Error(EISDIR, "read of a directory");
  if (auto overlay = ram_tier_.GetOverlay(ino)) record.size = overlay->size;
  if (offset >= record.size || size == 0) {
    sink(nullptr, 0);
    return size_t{0};
  }
  uint64_t end = std::min<uint64_t>(record.size, offset + size);
  uint64_t first = RoundDown(offset, block_size_);
  uint64_t last = RoundUp(end, block_size_);
  // Where the bytes are: RAM-tier chunks, a read-ahead window (which holds the
  // SSD's bytes: never for blocks the RAM tier may hold), or read here.
  std::vector<iovec> pieces;
  std::vector<ReadAhead::View> windows;
  bool in_ram_tier = FindCachedChunk(ino, first / block_size_, last / block_size_, /*flushing_only=*/false);
  bool chunks_held = false;  // pieces point into RAM-tier chunks, kept in place by io_lock
  if (in_ram_tier && CachedPieces(ino, offset, end, &pieces)) {
    chunks_held = true;
  } else if (!in_ram_tier && !(windows = read_ahead_.Serve(ino, first, last - first)).empty()) {
    uint64_t skip = offset - first;  // of the first window's bytes
    uint64_t left = end - offset;
    for (const ReadAhead::View& view : windows) {
      const uint64_t n = std::min(view.length - skip, left);
      pieces.push_back(iovec{const_cast<char*>(view.data + skip), n});
      left -= n;
      skip = 0;
    }
  } else {
    SPILLFS_RETURN_IF_ERROR(scratch->Resize(last - first));
    SPILLFS_RETURN_IF_ERROR(ReadBlocksCached(ino, first / block_size_, (last - first) / block_size_, scratch->data()));
    pieces.push_back(iovec{scratch->data() + (offset - first), end - offset});
  }
  read_ahead_.Advance(ino, first, last, RoundUp(record.size, block_size_));
  counters_.bytes_read.fetch_add(end - offset, std::memory_order_relaxed);
  counters_.reads.fetch_add(1, std::memory_order_relaxed);
  // relatime: record an access only when it is newer information.
  int64_t now = NowNs();
  if (record.atime_ns <= record.mtime_ns || record.atime_ns <= record.ctime_ns || now - record.atime_ns > kDayNs) {
    MutexLock lock(&mu_);
    auto fresh = LoadInode(ino);
    if (fresh.ok()) {
      fresh->atime_ns = now;
      Txn txn(index_);
      PutInode(&txn, ino, *fresh);
      SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
    }
  }
  if (!chunks_held) io_lock.Unlock();  // a window is pinned, scratch is the caller's
  sink(pieces.data(), static_cast<int>(pieces.size()));
  return static_cast<size_t>(end - offset);
}

Status Filesystem::FetchAhead(InodeNumber ino, uint64_t offset, uint64_t length, char* out) {
  return ReadBlocks(ino, offset / block_size_, length / block_size_, out, /*speculative=*/true);
}

Result<Filesystem::PrivilegesRemoved> Filesystem::RemovePrivilegesForWrite(InodeNumber ino, bool privileged) {
  PrivilegesRemoved removed;
  SPILLFS_ASSIGN_OR_RETURN(Entry entry, GetAttr(ino));
  const mode_t mode = entry.attr.st_mode;
  const mode_t setid = (mode & S_ISUID) | ((mode & S_IXGRP) ? (mode & S_ISGID) : 0);
  if (setid != 0 && !privileged) {
    SetAttrRequest request;
    request.mode = mode & 07777 & ~setid;
    SPILLFS_RETURN_IF_ERROR(SetAttr(ino, request).status());
    removed.mode_changed = true;
  }
  constexpr const char* kCapabilities = "security.capability";
  auto capabilities = GetXattr(ino, kCapabilities);  // without the namespace lock: most files have none
  if (capabilities.ok()) {
    SPILLFS_RETURN_IF_ERROR(RemoveXattr(ino, kCapabilities));
  } else if (capabilities.status().code() != ENODATA) {
    return capabilities.status();
  } else {
    removed.none_found = setid == 0;
  }
  return removed;
}

Result<size_t> Filesystem::Write(InodeNumber ino, uint64_t offset, const char* data, size_t size,
                                 const WriteAccepted* accepted) {
  if (size == 0) return size_t{0};
  if (offset + size < offset || offset + size > (1ull << 62)) return Status::Error(EFBIG, "file too large");
  // The RAM tier takes the write when it has room (waiting briefly for the
  // flusher to make some); otherwise the write goes straight to new blocks.
  // At most the chunks the write spans (some may be there already).
  const uint64_t chunks = DivideRoundingUp(offset % RamTier::kChunkBytes + size, RamTier::kChunkBytes);
  if (ram_tier_.capacity() > 0 && ram_tier_.WaitForRoom(chunks * RamTier::kChunkBytes, std::chrono::seconds(5))) {
    return WriteCached(ino, offset, data, size, accepted);
  }
  return WriteThrough(ino, offset, data, size);
}

Result<size_t> Filesystem::WriteThrough(InodeNumber ino, uint64_t offset, const char* data, size_t size) {
  ExclusiveLock flush_lock(&FlushLock(ino));
  WriterLock io_lock(&IoLock(ino));
  ContentChange change(&read_ahead_, ino);    // before io_lock lets readers in
  SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));  // cached blocks must not later overwrite this write
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  uint64_t first = RoundDown(offset, block_size_);
  uint64_t last = RoundUp(offset + size, block_size_);
  AlignedBuffer& buffer = WriteScratch();
  SPILLFS_RETURN_IF_ERROR(buffer.Resize(last - first));
  // Edge blocks keep their old bytes (zeros past EOF, by invariant).
  if (offset != first) {
    SPILLFS_RETURN_IF_ERROR(ReadBlocks(ino, first / block_size_, 1, buffer.data()));
  }
  if (offset + size != last && (last - block_size_ != first || offset == first)) {
    SPILLFS_RETURN_IF_ERROR(
        ReadBlocks(ino, (last - block_size_) / block_size_, 1, buffer.data() + (last - first - block_size_)));
  }
  std::memcpy(buffer.data() + (offset - first), data, size);
  SPILLFS_ASSIGN_OR_RETURN(auto extents, WriteBlocks(record, buffer.data(), first, last - first));

  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(record, LoadInode(ino));
  Txn txn(index_);
  uint64_t unmapped = 0;
  SPILLFS_RETURN_IF_ERROR(UnmapRange(&txn, ino, first, last, &unmapped));
  MapExtents(&txn, ino, extents);
  record.allocated_bytes += (last - first) - unmapped;
  record.size = std::max<uint64_t>(record.size, offset + size);
  record.mtime_ns = record.ctime_ns = NowNs();
  PutInode(&txn, ino, record);
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  counters_.bytes_written.fetch_add(size, std::memory_order_relaxed);
  counters_.writes.fetch_add(1, std::memory_order_relaxed);
  return size;
}

}  // namespace spillfs
