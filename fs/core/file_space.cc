// Filesystem: the operations that change which bytes a file has without
// writing them: setattr (truncate and the other attributes), fallocate
// (preallocate, punch, zero, collapse, insert) and lseek's SEEK_DATA/HOLE.
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <cstring>

#include "extent_walk.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/common/block_checksum.h"
#include "spillfs/common/clock.h"
#include "spillfs/common/rounding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

// ---- size changes ----

namespace {

// The extents a partial-block rewrite produced, to map under the commit lock.
struct BlockRewrite {
  uint64_t block_offset = 0;
  std::vector<std::pair<uint64_t, ExtentRecord>> extents;
};

}  // namespace

Result<Entry> Filesystem::SetAttr(InodeNumber ino, const SetAttrRequest& request) {
  // Advanced on the way out (after the commit, or a failure: harmless).
  struct EpochAdvance {
    std::atomic<uint64_t>* epoch;
    ~EpochAdvance() {
      if (epoch != nullptr) epoch->fetch_add(1, std::memory_order_acq_rel);
    }
  } advance{request.mode || request.uid || request.gid ? &privilege_epoch_ : nullptr};
  // A size change drops or rewrites cached chunks and mapped blocks: it keeps
  // flushes and readers out. Attributes alone (chmod, chown, utimens) change
  // the record under mu_ only, as a flush's commit does, and need not wait
  // for a flush in progress.
  ExclusiveLock flush_lock(&FlushLock(ino), kDeferLock);
  WriterLock io_lock(&IoLock(ino), kDeferLock);
  std::optional<ContentChange> change;  // before io_lock lets readers in
  std::optional<BlockRewrite> tail;
  if (request.size) {
    flush_lock.Lock();
    io_lock.Lock();
    change.emplace(&read_ahead_, ino);
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
    if (auto overlay = ram_tier_.GetOverlay(ino)) record.size = overlay->size;
    if (S_ISDIR(record.mode)) return Status::Error(EISDIR, "truncate of a directory");
    if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "truncate of a special file");
    if (*request.size > (1ull << 62)) return Status::Error(EFBIG, "file too large");
    uint64_t size = *request.size;
    // Shrinking into the middle of a block: zero its tail so the bytes past
    // EOF read as zeros if the file grows again.
    if (size < record.size && size % block_size_ != 0) {
      uint64_t block = RoundDown(size, block_size_);
      bool mapped = false;
      SPILLFS_RETURN_IF_ERROR(ForEachExtent(index_, ino, block, block + block_size_, [&](const MappedExtent& e) {
        mapped = !e.record.unwritten();
        return Status::OK();
      }));
      if (mapped) {
        AlignedBuffer& buffer = WriteScratch();
        SPILLFS_RETURN_IF_ERROR(buffer.Resize(block_size_));
        SPILLFS_RETURN_IF_ERROR(ReadBlocks(ino, block / block_size_, 1, buffer.data()));
        std::memset(buffer.data() + (size - block), 0, block_size_ - (size - block));
        SPILLFS_ASSIGN_OR_RETURN(auto extents, WriteBlocks(record, buffer.data(), block, block_size_));
        tail = BlockRewrite{block, std::move(extents)};
      }
    }
    // Cached data past the new size is cancelled, never written; a cached
    // partial last block gets its tail zeroed.
    if (auto file = ram_tier_.Find(ino)) {
      uint64_t keep_blocks = RoundUp(size, block_size_) / block_size_;
      allocator_.ReleaseHold(ram_tier_.DropFrom(ino, *file, keep_blocks, /*cancelled=*/true));
      ram_tier_.ZeroBlockTail(*file, size);
    }
  }

  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  int64_t now = NowNs();
  Txn txn(index_);
  if (request.mode) record.mode = (record.mode & S_IFMT) | (*request.mode & 07777);
  if (request.uid) record.uid = *request.uid;
  if (request.gid) record.gid = *request.gid;
  if (request.size) {
    uint64_t size = *request.size;
    if (size < record.size) {
      // One unmap covers the rewritten tail block too: two unmaps in one
      // batch could both rewrite the same old extent.
      uint64_t unmapped = 0;
      uint64_t cut = tail ? tail->block_offset : RoundUp(size, block_size_);
      SPILLFS_RETURN_IF_ERROR(UnmapRange(&txn, ino, cut, UINT64_MAX, &unmapped));
      record.allocated_bytes -= unmapped;
      if (tail) {
        MapExtents(&txn, ino, tail->extents);
        record.allocated_bytes += block_size_;
      }
    }
    if (auto overlay = ram_tier_.GetOverlay(ino)) record.size = overlay->size;
    if (size != record.size) record.mtime_ns = now;
    record.size = size;
  }
  auto resolve = [now](int64_t t) { return t == SetAttrRequest::kTimeNow ? now : t; };
  if (request.atime_ns) record.atime_ns = resolve(*request.atime_ns);
  if (request.mtime_ns) record.mtime_ns = resolve(*request.mtime_ns);
  if (auto file = ram_tier_.Find(ino)) {
    // Only what the request changed moves the overlay: a chmod must not pull
    // a cached file back to its committed size.
    std::optional<uint64_t> size;
    std::optional<int64_t> mtime;
    if (request.size) size = record.size;
    if (request.size || request.mtime_ns) mtime = record.mtime_ns;
    ram_tier_.SetAttrs(*file, size, mtime);
  }
  record.ctime_ns = request.ctime_ns ? resolve(*request.ctime_ns) : now;
  PutInode(&txn, ino, record);
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  return MakeEntry(ino, record);
}

// ---- fallocate and seek ----

Status Filesystem::Fallocate(InodeNumber ino, int mode, uint64_t offset, uint64_t length) {
  if (length == 0) return Status::Error(EINVAL, "fallocate of zero bytes");
  if (offset + length < offset || offset + length > (1ull << 62)) return Status::Error(EFBIG, "file too large");
  bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
  bool punch = mode & FALLOC_FL_PUNCH_HOLE;
  bool zero = mode & FALLOC_FL_ZERO_RANGE;
  if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
    return Status::Error(EOPNOTSUPP, "unsupported fallocate mode");
  }
  if (punch && (!keep_size || zero)) return Status::Error(EOPNOTSUPP, "PUNCH_HOLE needs KEEP_SIZE alone");
  SPILLFS_RETURN_IF_ERROR(flusher_.FlushFile(ino));  // work on the committed mapping only
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (S_ISDIR(record.mode)) return Status::Error(EISDIR, "fallocate on a directory");
  if (!S_ISREG(record.mode)) return Status::Error(ENODEV, "fallocate on a special file");

  uint64_t end = offset + length;
  if (punch || zero) {
    // Partial edge blocks are rewritten with zeros through the write path;
    // whole blocks are unmapped (zero range maps them again below).
    uint64_t inner_start = RoundUp(offset, block_size_);
    uint64_t inner_end = RoundDown(end, block_size_);
    uint64_t limit = std::min(end, record.size);  // past EOF reads as zeros already
    auto zero_span = [&](uint64_t from, uint64_t to) -> Status {
      to = std::min(to, std::max(limit, from));
      if (from >= to || from >= record.size) return Status::OK();
      std::string zeros(to - from, '\0');
      auto written = Write(ino, from, zeros.data(), zeros.size());
      return written.status();
    };
    if (inner_start > inner_end) {  // inside one block
      SPILLFS_RETURN_IF_ERROR(zero_span(offset, end));
    } else {
      SPILLFS_RETURN_IF_ERROR(zero_span(offset, inner_start));
      SPILLFS_RETURN_IF_ERROR(zero_span(inner_end, end));
      if (inner_start < inner_end) {
        ExclusiveLock flush_lock(&FlushLock(ino));
        WriterLock io_lock(&IoLock(ino));
        ContentChange change(&read_ahead_, ino);
        SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));  // the edges just went through the RAM tier
        MutexLock lock(&mu_);
        SPILLFS_ASSIGN_OR_RETURN(record, LoadInode(ino));
        Txn txn(index_);
        uint64_t unmapped = 0;
        SPILLFS_RETURN_IF_ERROR(UnmapRange(&txn, ino, inner_start, inner_end, &unmapped));
        record.allocated_bytes -= unmapped;
        record.mtime_ns = record.ctime_ns = NowNs();
        PutInode(&txn, ino, record);
        SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
      }
    }
    if (punch) return Status::OK();
  }

  // Allocate unwritten extents over the holes of [offset, end).
  ExclusiveLock flush_lock(&FlushLock(ino));
  WriterLock io_lock(&IoLock(ino));
  ContentChange change(&read_ahead_, ino);  // before io_lock lets readers in
  SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));
  uint64_t start = RoundDown(offset, block_size_);
  uint64_t stop = RoundUp(end, block_size_);
  std::vector<std::pair<uint64_t, uint64_t>> holes;
  uint64_t at = start;
  SPILLFS_RETURN_IF_ERROR(ForEachExtent(index_, ino, start, stop, [&](const MappedExtent& e) {
    if (e.file_offset > at) holes.emplace_back(at, e.file_offset);
    at = std::max(at, e.end());
    return Status::OK();
  }));
  if (at < stop) holes.emplace_back(at, stop);
  std::vector<std::pair<uint64_t, ExtentRecord>> extents;
  std::vector<PhysicalExtent> reserved;
  for (auto [from, to] : holes) {
    auto space = allocator_.Reserve(to - from);
    if (!space.ok()) {
      allocator_.Unreserve(reserved);
      return space.status();
    }
    uint64_t piece_offset = from;
    for (const PhysicalExtent& piece : *space) {
      ExtentRecord record_piece;
      record_piece.physical = piece.offset;
      record_piece.length = piece.length;
      record_piece.flags = kExtentUnwritten;
      extents.emplace_back(piece_offset, std::move(record_piece));
      piece_offset += piece.length;
      reserved.push_back(piece);
    }
  }
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(record, LoadInode(ino));
  Txn txn(index_);
  MapExtents(&txn, ino, extents);
  for (const PhysicalExtent& piece : reserved) record.allocated_bytes += piece.length;
  int64_t now = NowNs();
  if (!keep_size && end > record.size) {
    record.size = end;
    record.mtime_ns = now;
  }
  record.ctime_ns = now;
  PutInode(&txn, ino, record);
  return CommitTxn(&txn);
}

Result<uint64_t> Filesystem::Lseek(InodeNumber ino, uint64_t offset, int whence) {
  SPILLFS_RETURN_IF_ERROR(flusher_.FlushFile(ino));  // holes and data as the SSD will hold them
  ReaderLock io_lock(&IoLock(ino));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (offset >= record.size) return Status::Error(ENXIO, "offset is past the end of the file");
  std::optional<uint64_t> data;
  uint64_t hole = offset;
  bool hole_found = false;
  SPILLFS_RETURN_IF_ERROR(ForEachExtent(index_, ino, offset, UINT64_MAX, [&](const MappedExtent& e) {
    if (!data) data = std::max(offset, e.file_offset);
    if (!hole_found) {
      if (e.file_offset > hole) {
        hole_found = true;
      } else {
        hole = std::max(hole, e.end());
      }
    }
    return Status::OK();
  }));
  if (whence == SEEK_DATA) {
    if (!data || *data >= record.size) return Status::Error(ENXIO, "no data past the offset");
    return *data;
  }
  if (whence == SEEK_HOLE) return std::min(hole, record.size);
  return Status::Error(EINVAL, "unsupported whence");
}

}  // namespace spillfs
