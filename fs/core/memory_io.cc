// Filesystem: memory I/O. The daemon moves a file's bytes between the data
// area and memory a client shares with it (the control plane maps the
// client's memfd: fs/control/caller_files.h), for callers that may not open
// the data area themselves (docs/design.md, "Memory I/O"). Beside the direct
// path (direct_path.cc), whose reserve, dedup and commit it uses.
//
// The memory stays the client's: it may change while the daemon hashes,
// checksums or writes it. What others may come to rely on must not follow
// such a change, so a dedup unit that becomes a blob (a later write of the
// same bytes, anyone's, is mapped to it by its hash) is copied out of the
// shared memory first and hashed, checksummed and written from the copy: its
// bytes are the bytes its hash names. The other bytes, which only this file
// maps, go to the data area straight from the shared memory (O_DIRECT, no
// copy), with block checksums taken just before: a client that changes them
// meanwhile reads checksum errors (EIO) from its own file, as a direct-path
// client whose checksums are wrong does, and nobody else is affected. The
// hashes that decide which units are mapped by reference are taken from the
// memory too: a client that changes a unit meanwhile gets the blob of bytes
// its memory held when hashed, which it had.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "spillfs/common/block_checksum.h"
#include "spillfs/common/rounding.h"
#include "spillfs/core/filesystem.h"

namespace spillfs {
namespace {

constexpr uint64_t kLargestFileEnd = 1ull << 62;

// Writes to the data area in batches of parallel transfers: from the shared
// memory as it is, or from a private copy (staging) of what is handed over.
class DataAreaWriter {
 public:
  explicit DataAreaWriter(BlockStore* store) : store_(store) {}

  // `n` bytes at `data` (the shared memory) to `physical`.
  Status FromMemory(uint64_t physical, const char* data, uint64_t n) {
    slices_.push_back(IoSlice{physical, const_cast<char*>(data), n});
    pending_ += n;
    return pending_ >= kBatchBytes ? Flush() : Status::OK();
  }
  // `n` bytes (at most kStagingBytes) copied from `data` first; the copy,
  // valid until the next call, goes to `physical`.
  Result<const char*> Copied(uint64_t physical, const char* data, uint64_t n) {
    if (staged_ + n > staging_.size()) {
      SPILLFS_RETURN_IF_ERROR(Flush());
      if (staging_.size() < kStagingBytes) SPILLFS_RETURN_IF_ERROR(staging_.Resize(kStagingBytes));
    }
    char* copy = staging_.data() + staged_;
    std::memcpy(copy, data, n);
    staged_ += n;
    slices_.push_back(IoSlice{physical, copy, n});
    pending_ += n;
    return copy;
  }
  Status Flush() {
    if (slices_.empty()) return Status::OK();
    Status written = store_->WriteSlices(slices_);
    slices_.clear();
    pending_ = staged_ = 0;
    return written;
  }

  static constexpr uint64_t kStagingBytes = 16ull << 20;  // 64 dedup units
  static constexpr uint64_t kBatchBytes = 64ull << 20;

 private:
  BlockStore* store_;
  std::vector<IoSlice> slices_;
  uint64_t pending_ = 0;
  AlignedBuffer staging_;
  uint64_t staged_ = 0;
};

// The checks both directions share: a length, the memory range (EFAULT) and
// the file range (EFBIG), each without overflow.
Status CheckPiece(size_t i, const Filesystem::MemoryPiece& p, uint64_t memory_size) {
  if (p.length == 0) return Status::Error(EINVAL, fmt::format("piece {} has length 0", i));
  if (p.length > memory_size || p.memory > memory_size - p.length) {
    return Status::Error(EFAULT, fmt::format("piece {} (memory offset {}, length {}) lies past the end of the shared "
                                             "memory ({} bytes)",
                                             i, p.memory, p.length, memory_size));
  }
  if (p.length > kLargestFileEnd || p.file > kLargestFileEnd - p.length) {
    return Status::Error(EFBIG, fmt::format("piece {} (file offset {}, length {}) ends past the largest file offset "
                                            "(2^62)",
                                            i, p.file, p.length));
  }
  return Status::OK();
}

// The pieces add up to at most the shared memory's size: what a client with
// its pieces in distinct buffers asks, and a bound on one request's work
// (pieces may overlap in memory; a read of the same range a million times
// would hold a FUSE worker for hours).
Status CheckTotal(const std::vector<Filesystem::MemoryPiece>& pieces, uint64_t memory_size) {
  uint64_t total = 0;
  for (const Filesystem::MemoryPiece& p : pieces) {
    total += p.length;  // each at most memory_size (CheckPiece): no overflow below 2^20 pieces
    if (total > memory_size) {
      return Status::Error(E2BIG,
                           fmt::format("the pieces add up to more than the shared memory ({} bytes)", memory_size));
    }
  }
  return Status::OK();
}

// Pins `ino` as an open handle does (Filesystem::Open): an unlinked file
// whose last descriptor the client closes meanwhile is reclaimed only after.
class OpenInode {
 public:
  OpenInode(Filesystem* fs, InodeNumber ino) : fs_(fs), ino_(ino) {}
  Status Open() {
    SPILLFS_RETURN_IF_ERROR(fs_->Open(ino_));
    open_ = true;
    return Status::OK();
  }
  ~OpenInode() {
    if (open_) (void)fs_->Release(ino_);
  }
  OpenInode(const OpenInode&) = delete;
  OpenInode& operator=(const OpenInode&) = delete;

 private:
  Filesystem* fs_;
  InodeNumber ino_;
  bool open_ = false;
};

}  // namespace

Result<Filesystem::MemoryWritten> Filesystem::MemoryWrite(InodeNumber ino, const char* memory, uint64_t memory_size,
                                                          const std::vector<MemoryPiece>& pieces, uint64_t size,
                                                          bool dedup, bool privileged) {
  if (pieces.empty()) return Status::Error(EINVAL, "mem_write needs at least one piece");
  for (size_t i = 0; i < pieces.size(); ++i) {
    const MemoryPiece& p = pieces[i];
    if (p.memory % block_size_ != 0 || p.file % block_size_ != 0 || p.length % block_size_ != 0) {
      return Status::Error(EINVAL, fmt::format("piece {} (memory offset {}, file offset {}, length {}) is not block "
                                               "aligned ({} bytes)",
                                               i, p.memory, p.file, p.length, block_size_));
    }
    SPILLFS_RETURN_IF_ERROR(CheckPiece(i, p, memory_size));
    if (i > 0 && p.file < pieces[i - 1].file + pieces[i - 1].length) {
      return Status::Error(EINVAL, fmt::format("pieces must be sorted by file offset without overlap: piece {} at {} "
                                               "starts before piece {} ends ({})",
                                               i, p.file, i - 1, pieces[i - 1].file + pieces[i - 1].length));
    }
  }
  SPILLFS_RETURN_IF_ERROR(CheckTotal(pieces, memory_size));
  if (reinterpret_cast<uintptr_t>(memory) % BlockStore::kDirectAlignment != 0) {
    return Status::Error(EINVAL, "the shared memory is not page aligned");
  }
  const uint64_t end = pieces.back().file + pieces.back().length;
  if (size > end) {
    return Status::Error(EINVAL, fmt::format("size {} lies past the end of the last piece ({})", size, end));
  }
  OpenInode pin(this, ino);
  SPILLFS_RETURN_IF_ERROR(pin.Open());
  SPILLFS_ASSIGN_OR_RETURN(Entry entry, GetAttr(ino));
  if (!S_ISREG(entry.attr.st_mode)) return Status::Error(EINVAL, fmt::format("inode {} is not a regular file", ino));
  // DirectCommit refuses it too, but only after the units were mapped.
  if (end > RoundUp(std::max<uint64_t>(entry.attr.st_size, size), block_size_)) {
    return Status::Error(EINVAL, fmt::format("size {} leaves blocks of the pieces (which end at {}) past the end of "
                                             "the file",
                                             size, end));
  }
  SPILLFS_RETURN_IF_ERROR(RemovePrivilegesForWrite(ino, privileged).status());

  // Whole dedup units of the file within one piece and within `size`, hashed
  // from the memory, in file order; those a blob holds are mapped to it.
  std::vector<DirectUnit> units;
  if (dedup && dedup_) {
    for (const MemoryPiece& p : pieces) {
      const uint64_t piece_end = std::min(p.file + p.length, size);
      for (uint64_t at = RoundUp(p.file, kDedupUnit); at + kDedupUnit <= piece_end; at += kDedupUnit) {
        units.push_back(DirectUnit{at, Dedup::Hash(memory + p.memory + (at - p.file))});
      }
    }
  }
  MemoryWritten written;
  std::vector<bool> mapped(units.size(), false);
  if (!units.empty()) {
    SPILLFS_ASSIGN_OR_RETURN(mapped, DirectDedup(ino, units));
    for (bool m : mapped) written.mapped_bytes += m ? kDedupUnit : 0;
  }

  // The rest: the pieces less the units mapped, in file order, with where
  // their bytes are; the units among them become blobs (`blob_units`).
  struct Run {
    uint64_t file, length;
    const char* data;
  };
  std::vector<Run> rest;
  std::vector<uint64_t> blob_units;
  size_t k = 0;
  for (const MemoryPiece& p : pieces) {
    const uint64_t piece_end = p.file + p.length;
    uint64_t cursor = p.file;
    auto keep = [&](uint64_t to) {
      if (to > cursor) rest.push_back(Run{cursor, to - cursor, memory + p.memory + (cursor - p.file)});
    };
    for (; k < units.size() && units[k].file_offset < piece_end; ++k) {
      if (!mapped[k]) {
        blob_units.push_back(units[k].file_offset);
        continue;
      }
      keep(units[k].file_offset);
      cursor = units[k].file_offset + kDedupUnit;
    }
    keep(piece_end);
  }
  uint64_t length = 0;
  for (const Run& run : rest) length += run.length;  // at most 2^62 (disjoint file ranges)
  if (length == 0) return written;

  SPILLFS_ASSIGN_OR_RETURN(std::vector<PhysicalExtent> space, DirectReserve(length));
  // Returned unless committed.
  struct Reservation {
    Filesystem* fs;
    const std::vector<PhysicalExtent>* space;
    bool held = true;
    ~Reservation() {
      if (held) fs->DirectUnreserve(*space);
    }
  } reservation{this, &space};

  // The reserved space goes back to back over the runs (as DirectCommit maps
  // it); each stretch that lies in one run and one reserved extent is
  // written, its block checksums in the order of the space.
  DataAreaWriter writer(&store_);
  std::vector<uint32_t> checksums;
  if (checksums_) checksums.reserve(length / block_size_);
  std::vector<DirectUnit> committed_units;
  auto sum = [&](const char* data, uint64_t n) {
    if (!checksums_) return;
    for (uint64_t at = 0; at < n; at += block_size_) checksums.push_back(BlockChecksum(data + at, block_size_));
  };
  size_t next_blob = 0;  // of blob_units: the first not yet passed
  // `n` bytes of the file at `file` (bytes at `data`) to `physical`: a unit
  // that becomes a blob from a copy (one split over two reserved extents
  // stays plain: DirectCommit makes no blob of it), the rest from the memory.
  auto stretch = [&](uint64_t file, const char* data, uint64_t physical, uint64_t n) -> Status {
    const uint64_t stretch_end = file + n;
    uint64_t at = file;
    while (at < stretch_end) {
      while (next_blob < blob_units.size() && blob_units[next_blob] < at) ++next_blob;
      const bool blob = next_blob < blob_units.size() && blob_units[next_blob] + kDedupUnit <= stretch_end;
      const uint64_t upto = blob ? blob_units[next_blob] : stretch_end;
      if (upto > at) {
        sum(data + (at - file), upto - at);
        SPILLFS_RETURN_IF_ERROR(writer.FromMemory(physical + (at - file), data + (at - file), upto - at));
        at = upto;
      }
      if (blob) {
        SPILLFS_ASSIGN_OR_RETURN(const char* copy,
                                 writer.Copied(physical + (at - file), data + (at - file), kDedupUnit));
        sum(copy, kDedupUnit);
        committed_units.push_back(DirectUnit{at, Dedup::Hash(copy)});
        at += kDedupUnit;
        ++next_blob;
      }
    }
    return Status::OK();
  };
  size_t s = 0;
  uint64_t used = 0;  // of space[s]
  for (const Run& run : rest) {
    for (uint64_t done = 0; done < run.length;) {
      const uint64_t n = std::min(run.length - done, space[s].length - used);
      SPILLFS_RETURN_IF_ERROR(stretch(run.file + done, run.data + done, space[s].offset + used, n));
      done += n;
      used += n;
      if (used == space[s].length) {
        ++s;
        used = 0;
      }
    }
  }
  SPILLFS_RETURN_IF_ERROR(writer.Flush());

  FileRanges ranges;
  ranges.reserve(rest.size());
  for (const Run& run : rest) ranges.emplace_back(run.file, run.file + run.length);
  // Units mapped past the last range already grew the size (DirectDedup).
  const uint64_t commit_size = std::min(size, ranges.back().second);
  SPILLFS_RETURN_IF_ERROR(DirectCommit(ino, ranges, space, checksums, commit_size, committed_units));
  reservation.held = false;
  counters_.bytes_written_memory.fetch_add(length, std::memory_order_relaxed);
  written.written_bytes = length;
  return written;
}

Result<uint64_t> Filesystem::MemoryRead(InodeNumber ino, char* memory, uint64_t memory_size,
                                        const std::vector<MemoryPiece>& pieces) {
  if (pieces.empty()) return Status::Error(EINVAL, "mem_read needs at least one piece");
  for (size_t i = 0; i < pieces.size(); ++i) SPILLFS_RETURN_IF_ERROR(CheckPiece(i, pieces[i], memory_size));
  SPILLFS_RETURN_IF_ERROR(CheckTotal(pieces, memory_size));
  OpenInode pin(this, ino);
  SPILLFS_RETURN_IF_ERROR(pin.Open());
  SPILLFS_ASSIGN_OR_RETURN(Entry entry, GetAttr(ino));
  if (!S_ISREG(entry.attr.st_mode)) return Status::Error(EINVAL, fmt::format("inode {} is not a regular file", ino));
  AlignedBuffer scratch;
  for (const MemoryPiece& p : pieces) {
    for (uint64_t done = 0; done < p.length;) {
      const uint64_t n = std::min(p.length - done, kMemoryReadStep);
      char* out = memory + p.memory + done;
      const ReadSink copy = [out](const iovec* parts, int count) {
        uint64_t copied = 0;
        for (int c = 0; c < count; ++c) {
          std::memcpy(out + copied, parts[c].iov_base, parts[c].iov_len);
          copied += parts[c].iov_len;
        }
      };
      SPILLFS_ASSIGN_OR_RETURN(size_t got, Read(ino, p.file + done, n, &scratch, copy));
      if (got < n) std::memset(out + got, 0, n - got);  // past the end of the file
      done += n;
    }
  }
  SPILLFS_ASSIGN_OR_RETURN(entry, GetAttr(ino));
  return static_cast<uint64_t>(entry.attr.st_size);
}

}  // namespace spillfs
