// Filesystem: the direct data path. A client that may open the backing store
// gets a file's committed layout (and reads the blocks itself), or reserves
// fresh space, writes it itself and commits the mapping here.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include "spillfs/common/clock.h"
#include "spillfs/common/rounding.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

Result<DirectLayout> Filesystem::GetDirectLayout(InodeNumber ino) {
  SPILLFS_RETURN_IF_ERROR(flusher_.FlushFile(ino));  // the SSD must hold what the client will read
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
                                const std::vector<uint32_t>& checksums, uint64_t size,
                                const std::vector<DirectUnit>& units) {
  uint64_t length = 0;
  for (const PhysicalExtent& piece : space) length += piece.length;
  if (file_offset + length < file_offset || file_offset + length > (1ull << 62)) {
    return Status::Error(EFBIG, "commit range is past the largest file offset");
  }
  return DirectCommit(ino, FileRanges{{file_offset, file_offset + length}}, space, checksums, size, units);
}

Status Filesystem::DirectCommit(InodeNumber ino, const FileRanges& ranges, const std::vector<PhysicalExtent>& space,
                                const std::vector<uint32_t>& checksums, uint64_t size,
                                const std::vector<DirectUnit>& units) {
  uint64_t length = 0;
  for (const PhysicalExtent& piece : space) length += piece.length;
  if (ranges.empty()) return Status::Error(EINVAL, "a commit needs a file range");
  uint64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto [start, end] = ranges[i];
    if (start % block_size_ != 0 || end % block_size_ != 0) {
      return Status::Error(EINVAL, fmt::format("file range {} [{}, {}) is not block aligned", i, start, end));
    }
    if (end < start) return Status::Error(EINVAL, fmt::format("file range {} ends before it starts", i));
    if (end > (1ull << 62)) {
      return Status::Error(EFBIG, fmt::format("file range {} [{}, {}) is past the largest file offset", i, start, end));
    }
    if (i > 0 && start < ranges[i - 1].second) {
      return Status::Error(EINVAL, fmt::format("file ranges must be sorted without overlap: range {} starts at {}, "
                                               "before range {} ends ({})",
                                               i, start, i - 1, ranges[i - 1].second));
    }
    covered += end - start;
  }
  if (covered != length) {
    return Status::Error(EINVAL, fmt::format("the file ranges hold {} bytes, the reserved space {}", covered, length));
  }
  const uint64_t last_end = ranges.back().second;
  if (checksums_ && checksums.size() != length / block_size_) {
    return Status::Error(EINVAL,
                         fmt::format("expected {} block checksums, got {}", length / block_size_, checksums.size()));
  }
  if (size > last_end) return Status::Error(EINVAL, "size lies past the committed data");
  for (const DirectUnit& unit : units) {
    // The range holding it: the last one starting at or before it.
    auto in = std::upper_bound(ranges.begin(), ranges.end(), unit.file_offset,
                               [](uint64_t v, const std::pair<uint64_t, uint64_t>& r) { return v < r.first; });
    if (unit.hash.size() != 16 || unit.file_offset % kDedupUnit != 0 || in == ranges.begin() ||
        unit.file_offset + kDedupUnit > std::prev(in)->second) {
      return Status::Error(EINVAL, fmt::format("unit at file offset {} is not a whole, aligned dedup unit of a "
                                               "committed range with a 16-byte hash",
                                               unit.file_offset));
    }
  }
  ExclusiveLock flush_lock(&FlushLock(ino));
  WriterLock io_lock(&IoLock(ino));
  ContentChange change(&read_ahead_, ino);           // before io_lock lets readers in
  SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));         // older cached data must not land on top later
  SPILLFS_RETURN_IF_ERROR(FlushBeforeMapping(ino));  // the client's writes have completed
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "commit target is not a regular file");
  // Written blocks past EOF would show through a later truncate up. Checked
  // before MapExtents: that changes the allocator's persisted map, so no
  // return may come between it and the commit.
  if (last_end > RoundUp(std::max(record.size, size), block_size_)) {
    return Status::Error(EINVAL, "commit maps blocks past the end of the file: give size");
  }
  // The units that become blobs (a later write of these bytes shares them):
  // file offset -> hash.
  std::map<uint64_t, const std::string*> blob_units;
  if (dedup_) {
    for (const DirectUnit& unit : units) blob_units.emplace(unit.file_offset, &unit.hash);
  }
  Txn txn(index_);
  // One extent per run (a reserved piece within one file range), cut around
  // the units that become blobs: consecutive ones one blob, one extent of its
  // own (a unit split over two runs stays plain).
  std::vector<std::pair<uint64_t, ExtentRecord>> extents;
  // A run: `n` bytes at file offset `run_file`, physical `physical`, byte
  // `at` of the reserved space (where its checksums start).
  auto run = [&](uint64_t run_file, uint64_t physical, uint64_t n, uint64_t at) {
    auto emit = [&](uint64_t from, uint64_t len, bool blob) {
      ExtentRecord extent;
      extent.physical = physical + from;
      extent.length = len;
      if (blob) extent.blob_id = extent.physical;
      if (checksums_) {
        auto first = checksums.begin() + static_cast<long>((at + from) / block_size_);
        extent.block_checksums.assign(first, first + static_cast<long>(len / block_size_));
      }
      extents.emplace_back(run_file + from, std::move(extent));
    };
    uint64_t cursor = 0;  // of the run
    auto it = blob_units.lower_bound(run_file);
    auto in_run = [&] { return it != blob_units.end() && it->first + kDedupUnit <= run_file + n; };
    while (in_run()) {
      const uint64_t from = it->first - run_file;
      if (from > cursor) emit(cursor, from - cursor, false);
      std::string hashes;
      uint64_t end = from;
      for (; in_run() && it->first - run_file == end; ++it, end += kDedupUnit) hashes += *it->second;
      emit(from, end - from, true);
      const ExtentRecord& blob = extents.back().second;
      txn.new_blobs[blob.physical] = Dedup::NewBlob(std::move(hashes), blob.block_checksums);
      cursor = end;
    }
    if (cursor < n) emit(cursor, n - cursor, false);
  };
  size_t r = 0;
  uint64_t file_at = ranges[0].first;  // where the next reserved byte goes
  uint64_t at = 0;                     // of the reserved space
  for (const PhysicalExtent& piece : space) {
    for (uint64_t used = 0; used < piece.length;) {
      while (file_at == ranges[r].second) file_at = ranges[++r].first;  // sums are equal: r stays in bounds
      const uint64_t n = std::min(piece.length - used, ranges[r].second - file_at);
      run(file_at, piece.offset + used, n, at + used);
      used += n;
      file_at += n;
    }
    at += piece.length;
  }
  uint64_t unmapped = 0;
  SPILLFS_RETURN_IF_ERROR(UnmapRanges(&txn, ino, ranges, &unmapped));
  MapExtents(&txn, ino, extents);
  record.allocated_bytes += length - unmapped;
  record.size = std::max(record.size, size);
  record.mtime_ns = record.ctime_ns = NowNs();
  PutInode(&txn, ino, record);
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  counters_.bytes_written.fetch_add(length, std::memory_order_relaxed);
  counters_.bytes_written_direct.fetch_add(length, std::memory_order_relaxed);
  return Status::OK();
}

Result<std::vector<bool>> Filesystem::DirectDedup(InodeNumber ino, uint64_t file_offset,
                                                  const std::vector<std::string>& hashes) {
  if (!dedup_) {
    return Status::Error(EOPNOTSUPP, "deduplication is off on this volume (made with --no-dedup or mounted so)");
  }
  if (file_offset % kDedupUnit != 0) {
    return Status::Error(
        EINVAL, fmt::format("file_offset {} is not a multiple of the dedup unit ({} bytes)", file_offset, kDedupUnit));
  }
  const uint64_t n = hashes.size();
  if (n > (1ull << 62) / kDedupUnit || file_offset > (1ull << 62) - n * kDedupUnit) {
    return Status::Error(EFBIG, "dedup range is past the largest file offset");
  }
  std::vector<DirectUnit> units;
  units.reserve(n);
  for (uint64_t i = 0; i < n; ++i) units.push_back(DirectUnit{file_offset + i * kDedupUnit, hashes[i]});
  return DirectDedup(ino, units);
}

Result<std::vector<bool>> Filesystem::DirectDedup(InodeNumber ino, const std::vector<DirectUnit>& units) {
  if (!dedup_) {
    return Status::Error(EOPNOTSUPP, "deduplication is off on this volume (made with --no-dedup or mounted so)");
  }
  const uint64_t n = units.size();
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t at = units[i].file_offset;
    if (at % kDedupUnit != 0) {
      return Status::Error(EINVAL, fmt::format("dedup unit {} at file offset {} is not at a multiple of the dedup "
                                               "unit ({} bytes)",
                                               i, at, kDedupUnit));
    }
    if (at > (1ull << 62) - kDedupUnit) {
      return Status::Error(EFBIG,
                           fmt::format("dedup unit {} at file offset {} is past the largest file offset", i, at));
    }
    if (i > 0 && at <= units[i - 1].file_offset) {
      return Status::Error(
          EINVAL,
          fmt::format("dedup units must be sorted by file offset without overlap: unit {} at {} {} unit {} at {}", i,
                      at, at == units[i - 1].file_offset ? "repeats" : "comes after", i - 1, units[i - 1].file_offset));
    }
    if (units[i].hash.size() != 16) {
      return Status::Error(EINVAL, fmt::format("the hash of dedup unit {} is not 16 bytes", i));
    }
  }
  std::vector<bool> mapped(n, false);
  if (n == 0) return mapped;

  // The blob unit holding each unit's hash, with the blob's block checksums:
  // kept in its record, or (a one-unit blob from before they were kept)
  // taken from its bytes, read once and checked against the hash. The pin
  // keeps the blocks of a blob freed meanwhile from reuse while they are
  // read; a blob gone by the commit is not mapped (checked again under mu_
  // where blob_epoch_ moved meanwhile).
  std::vector<std::string_view> hashes;
  std::vector<bool> follows(n, false);
  hashes.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    hashes.push_back(units[i].hash);
    follows[i] = i > 0 && units[i].file_offset == units[i - 1].file_offset + kDedupUnit;
  }
  const uint64_t epoch = blob_epoch_.load(std::memory_order_acquire);  // before the look-ups
  FoundBlobs found;
  // One-unit blobs whose checksums were read here (the commit stores them in their records).
  std::map<uint64_t, std::vector<uint32_t>> sums_taken;
  {
    ReclaimGate::Reader pin(&gate_);
    found = deduper_.FindBlobs(hashes, follows);
    AlignedBuffer unit;
    for (auto it = found.records.begin(); it != found.records.end();) {
      auto& [blob, record] = *it;
      std::string& sums = found.checksums[blob];
      if (!checksums_ || sums.size() == record.length / block_size_ * 4) {
        ++it;
        continue;
      }
      // No memory for the read, or no sums to be had: not mapped (the caller writes its units).
      if (unit.Resize(kDedupUnit).ok() && store_.ReadAt(blob, unit.data(), kDedupUnit).ok() &&
          deduper_.TakeChecksums(unit.data(), &record)) {
        sums = Dedup::ChecksumBytes(record.block_checksums);
        sums_taken.emplace(blob, record.block_checksums);
        ++it;
      } else {
        found.checksums.erase(blob);
        it = found.records.erase(it);
      }
    }
  }
  bool any = false;
  for (std::optional<BlobUnitRef>& at : found.units) {
    if (at && !found.records.count(at->blob)) at.reset();
    any = any || at.has_value();
  }
  // Nothing to map (a first save): no flush, no batch.
  if (!any) return mapped;
  if (options_.dedup_looked_up) options_.dedup_looked_up();

  ExclusiveLock flush_lock(&FlushLock(ino));
  WriterLock io_lock(&IoLock(ino));
  ContentChange change(&read_ahead_, ino);    // before io_lock lets readers in
  SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));  // cached data of the range must not land on top later
  // A blob may be an ephemeral file's, written without a sync of the data area.
  SPILLFS_RETURN_IF_ERROR(FlushBeforeMapping(ino));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "dedup target is not a regular file");
  // Still there with the records found (a commit of another file may have
  // dropped a blob or changed its reference count): certain where no batch
  // changed a blob record since the look-ups began (blob_epoch_), else
  // looked up again, here, where they cannot change before this commit.
  if (blob_epoch_.load(std::memory_order_relaxed) != epoch) {
    deduper_.CheckFound(hashes, &found);
    for (auto& [blob, sums] : sums_taken) {
      auto it = found.records.find(blob);
      if (it == found.records.end()) continue;
      it->second.block_checksums = sums;
      found.checksums[blob] = Dedup::ChecksumBytes(sums);
    }
  }
  // Runs of units that follow each other both in the file and in one blob
  // become one extent each: [first, end) of `units`, mapped from unit `at`.
  struct Run {
    uint64_t first, end;
    BlobUnitRef at;
  };
  std::vector<Run> runs;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // file ranges mapped, sorted and merged
  for (uint64_t i = 0; i < n; ++i) {
    const std::optional<BlobUnitRef>& at = found.units[i];
    if (!at) continue;
    mapped[i] = true;
    const uint64_t file_at = units[i].file_offset;
    if (!runs.empty()) {
      Run& last = runs.back();
      const uint64_t count = last.end - last.first;
      if (last.end == i && last.at.blob == at->blob && last.at.unit + count == at->unit &&
          units[last.first].file_offset + count * kDedupUnit == file_at) {
        ++last.end;
      } else {
        runs.push_back(Run{i, i + 1, *at});
      }
    } else {
      runs.push_back(Run{i, i + 1, *at});
    }
    if (!ranges.empty() && ranges.back().second == file_at) {
      ranges.back().second += kDedupUnit;
    } else {
      ranges.emplace_back(file_at, file_at + kDedupUnit);
    }
  }
  if (ranges.empty()) return mapped;
  size_t batch_bytes = 4096;  // the extents' checksums, and a little for the rest
  for (const Run& run : runs) {
    batch_bytes +=
        64 + found.checksums.at(run.at.blob).size() / found.records.at(run.at.blob).units() * (run.end - run.first);
  }
  Txn txn(index_, batch_bytes);
  uint64_t unmapped = 0;
  SPILLFS_RETURN_IF_ERROR(UnmapRanges(&txn, ino, ranges, &unmapped));
  uint64_t shared = 0;
  for (const Run& run : runs) {
    const BlobRecord& blob = found.records.at(run.at.blob);
    Dedup::MapBlob(ino, units[run.first].file_offset, run.at, run.end - run.first, blob,
                   found.checksums.at(run.at.blob), &txn.batch, &txn.blob_refs);
    if (sums_taken.count(run.at.blob)) {
      txn.new_blobs[run.at.blob] = blob;
    } else {
      txn.current_blobs.emplace(run.at.blob, &blob);
    }
    shared += (run.end - run.first) * kDedupUnit;
  }
  record.allocated_bytes += shared - unmapped;
  record.size = std::max(record.size, ranges.back().second);
  record.mtime_ns = record.ctime_ns = NowNs();
  PutInode(&txn, ino, record);
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  counters_.bytes_deduplicated.fetch_add(shared, std::memory_order_relaxed);
  return mapped;
}

}  // namespace spillfs
