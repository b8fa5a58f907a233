// Walks over a file's extents in the index, for the data operations of
// Filesystem (file_data.cc, file_space.cc): internal to fs/src.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "spillfs/common/aligned_buffer.h"
#include "spillfs/common/status.h"
#include "spillfs/kvindex/index.h"
#include "spillfs/kvindex/keys.h"
#include "spillfs/kvindex/records.h"

namespace spillfs {
// A decoded extent with its file offset.
struct MappedExtent {
  uint64_t file_offset;
  ExtentRecord record;
  uint64_t end() const { return file_offset + record.length; }
};

// Visits the extents of `ino` overlapping [start, end) in file order, as
// parsed views (no checksum decoded): fn(file_offset, view).
template <typename Fn>
Status ForEachExtentView(const Index& index, InodeNumber ino, uint64_t start, uint64_t end, Fn&& fn) {
  auto cursor = index.NewCursor(Family::kExtent, keys::Ino(ino));
  cursor->SeekForPrev(keys::Extent(ino, start));
  if (!cursor->Valid()) cursor->Seek(keys::Extent(ino, start));
  for (; cursor->Valid(); cursor->Next()) {
    if (cursor->key().size() != 16) return Status::Corruption("malformed extent key");
    uint64_t offset = keys::ExtentOffset(cursor->key());
    if (offset >= end) break;
    SPILLFS_ASSIGN_OR_RETURN(ExtentView view, ExtentView::Parse(cursor->value()));
    if (offset + view.length <= start) continue;
    SPILLFS_RETURN_IF_ERROR(fn(offset, view));
  }
  return cursor->status();
}

// Visits the extents of `ino` overlapping [start, end) in file order, whole.
template <typename Fn>
Status ForEachExtent(const Index& index, InodeNumber ino, uint64_t start, uint64_t end, Fn&& fn) {
  return ForEachExtentView(index, ino, start, end, [&](uint64_t offset, const ExtentView& view) {
    return fn(MappedExtent{offset, view.Record()});
  });
}

// The same, each extent clipped to [start, end) with only the checksums of
// the clipped blocks decoded (ExtentView says why). `start` and `end` are
// block aligned; so are extents.
template <typename Fn>
Status ForEachExtentClipped(const Index& index, InodeNumber ino, uint64_t start, uint64_t end, uint64_t block,
                            Fn&& fn) {
  return ForEachExtentView(index, ino, start, end, [&](uint64_t offset, const ExtentView& view) -> Status {
    if (view.checksum_count != 0 && view.checksum_count != view.length / block) {
      return Status::Corruption(fmt::format("extent of inode {} at {} has {} checksums for {} bytes", ino, offset,
                                            view.checksum_count, view.length));
    }
    const uint64_t from = std::max(start, offset);
    const uint64_t to = std::min(end, offset + view.length);
    return fn(MappedExtent{from, view.Slice(from - offset, to - from, block)});
  });
}

// The part of `record` from byte `skip` on, `length` bytes long.
inline ExtentRecord Slice(const ExtentRecord& record, uint64_t skip, uint64_t length, uint64_t block) {
  ExtentRecord out = record;
  out.physical += skip;
  out.length = length;
  if (!record.block_checksums.empty()) {
    auto first = record.block_checksums.begin() + static_cast<long>(skip / block);
    out.block_checksums.assign(first, first + static_cast<long>(length / block));
  }
  return out;
}

// A scratch buffer of the calling thread for writes that rewrite blocks.
inline AlignedBuffer& WriteScratch() {
  thread_local AlignedBuffer buffer;
  return buffer;
}

}  // namespace spillfs
