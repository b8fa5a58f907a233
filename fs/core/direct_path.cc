// Filesystem: the direct data path. A client that may open the backing store
// gets a file's committed layout (and reads the blocks itself), or reserves
// fresh space, writes it itself and commits the mapping here.
#include <fmt/format.h>

#include "spillfs/common/rounding.h"
#include "spillfs/common/clock.h"
#include "core/filesystem.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

Result<DirectLayout> Filesystem::GetDirectLayout(InodeNumber ino) {
  SPILLFS_RETURN_IF_ERROR(FlushFile(ino));  // the SSD must hold what the client will read
  ReaderLock io_lock(&IoLock(ino));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "layouts exist only for regular files");
  DirectLayout layout;
  layout.ino = ino;
  layout.size = record.size;
  auto cursor = index_.NewCursor(Family::kExtent, keys::Ino(ino));
  for (cursor->Seek(keys::Ino(ino)); cursor->Valid(); cursor->Next()) {
    SPILLFS_ASSIGN_OR_RETURN(ExtentRecord extent, ExtentRecord::Decode(cursor->value()));
    layout.extents.emplace_back(keys::ExtentOffset(cursor->key()), std::move(extent));
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  return layout;
}

Result<std::vector<PhysicalExtent>> Filesystem::DirectReserve(uint64_t length) {
  if (length == 0 || length % block_size_ != 0) {
    return Status::Error(EINVAL, fmt::format("reserve length must be a positive multiple of {}", block_size_));
  }
  return allocator_.Reserve(length);
}

void Filesystem::DirectUnreserve(const std::vector<PhysicalExtent>& space) { allocator_.Unreserve(space); }

Status Filesystem::DirectCommit(InodeNumber ino, uint64_t file_offset, const std::vector<PhysicalExtent>& space,
                                const std::vector<uint32_t>& checksums, uint64_t size) {
  uint64_t length = 0;
  for (const PhysicalExtent& piece : space) length += piece.length;
  if (file_offset % block_size_ != 0) return Status::Error(EINVAL, "file_offset must be block aligned");
  if (checksums_ && checksums.size() != length / block_size_) {
    return Status::Error(EINVAL,
                         fmt::format("expected {} block checksums, got {}", length / block_size_, checksums.size()));
  }
  if (file_offset + length < file_offset || file_offset + length > (1ull << 62)) {
    return Status::Error(EFBIG, "commit range is past the largest file offset");
  }
  if (size > file_offset + length) return Status::Error(EINVAL, "size lies past the committed data");
  ExclusiveLock flush_lock(&FlushLock(ino));
  WriterLock io_lock(&IoLock(ino));
  ContentChange change(&read_ahead_, ino);    // before io_lock lets readers in
  SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));  // older cached data must not land on top later
  std::vector<std::pair<uint64_t, ExtentRecord>> extents;
  uint64_t at = 0;
  for (const PhysicalExtent& piece : space) {
    ExtentRecord record;
    record.physical = piece.offset;
    record.length = piece.length;
    if (checksums_) {
      auto first = checksums.begin() + static_cast<long>(at / block_size_);
      record.block_checksums.assign(first, first + static_cast<long>(piece.length / block_size_));
    }
    extents.emplace_back(file_offset + at, std::move(record));
    at += piece.length;
  }
  SPILLFS_RETURN_IF_ERROR(FlushBeforeMapping(ino));  // the client's writes have completed
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "commit target is not a regular file");
  // Written blocks past EOF would show through a later truncate up. Checked
  // before MapExtents: that changes the allocator's persisted map, so no
  // return may come between it and the commit.
  if (file_offset + length > RoundUp(std::max(record.size, size), block_size_)) {
    return Status::Error(EINVAL, "commit maps blocks past the end of the file: give size");
  }
  Txn txn(index_);
  uint64_t unmapped = 0;
  SPILLFS_RETURN_IF_ERROR(UnmapRange(&txn, ino, file_offset, file_offset + length, &unmapped));
  MapExtents(&txn, ino, extents);
  record.allocated_bytes += length - unmapped;
  record.size = std::max(record.size, size);
  record.mtime_ns = record.ctime_ns = NowNs();
  PutInode(&txn, ino, record);
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  counters_.bytes_written.fetch_add(length, std::memory_order_relaxed);
  return Status::OK();
}

}  // namespace spillfs
