// Filesystem: the direct data path. A client that may open the backing store
// gets a file's committed layout (and reads the blocks itself), or reserves
// fresh space, writes it itself and commits the mapping here.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "core/filesystem.h"
#include "spillfs/common/clock.h"
#include "spillfs/common/rounding.h"
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
  // The units that become blobs (a later write of these bytes shares them).
  std::map<uint64_t, const std::string*> blob_units;
  if (dedup_) blob_units = deduper_.NewBlobUnits(units);
  Txn txn(index_);
  // One extent per run (a reserved piece within one file range), cut around
  // the units that become blobs (a blob is one extent of its own; a unit
  // split over two runs stays plain).
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
    for (auto it = blob_units.lower_bound(run_file); it != blob_units.end() && it->first + kDedupUnit <= run_file + n;
         ++it) {
      const uint64_t from = it->first - run_file;
      if (from > cursor) emit(cursor, from - cursor, false);
      emit(from, kDedupUnit, true);
      const ExtentRecord& blob = extents.back().second;
      txn.new_blobs[blob.physical] = Dedup::NewBlob(*it->second, blob.block_checksums);
      cursor = from + kDedupUnit;
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

  // The blob holding each hash, with its block checksums: kept in its record,
  // or (a blob from before they were kept) taken from its bytes, read once
  // and checked against the hash. The pin keeps the blocks of a blob freed
  // meanwhile from reuse while they are read; a blob gone by the commit is
  // not mapped (looked up again under mu_ where blob_epoch_ moved meanwhile).
  // One look-up per distinct hash: hits[of[i]] is unit i's.
  struct Hit {
    uint64_t blob = 0;
    BlobRecord record;
    bool sums_taken = false;  // read here: the commit stores them in the record
  };
  std::vector<std::string_view> distinct;  // views of units' hashes
  std::vector<size_t> of(n);
  {
    std::unordered_map<std::string_view, size_t> by_hash;
    by_hash.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      auto [it, fresh] = by_hash.try_emplace(units[i].hash, distinct.size());
      if (fresh) distinct.push_back(units[i].hash);
      of[i] = it->second;
    }
  }
  const uint64_t epoch = blob_epoch_.load(std::memory_order_acquire);  // before the look-ups
  std::vector<std::optional<Hit>> hits(distinct.size());
  bool any = false;
  {
    ReclaimGate::Reader pin(&gate_);
    auto found = deduper_.FindBlobs(distinct);
    AlignedBuffer unit;
    for (size_t h = 0; h < distinct.size(); ++h) {
      if (!found[h]) continue;
      Hit hit;
      hit.blob = found[h]->first;
      hit.record = std::move(found[h]->second);
      if (checksums_ && hit.record.block_checksums.size() != kDedupUnit / block_size_) {
        // No memory for the read: not mapped (the caller writes the unit).
        if (!unit.Resize(kDedupUnit).ok()) continue;
        if (!store_.ReadAt(hit.blob, unit.data(), kDedupUnit).ok() ||
            !deduper_.TakeChecksums(unit.data(), &hit.record)) {
          continue;
        }
        hit.sums_taken = true;
      }
      hits[h] = std::move(hit);
      any = true;
    }
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
    std::vector<size_t> again;
    std::vector<std::string_view> hashes;
    for (size_t h = 0; h < hits.size(); ++h) {
      if (!hits[h]) continue;
      again.push_back(h);
      hashes.push_back(distinct[h]);
    }
    auto now = deduper_.FindBlobs(hashes);
    for (size_t j = 0; j < again.size(); ++j) {
      std::optional<Hit>& hit = hits[again[j]];
      if (!now[j] || now[j]->first != hit->blob) {
        hit.reset();
        continue;
      }
      hit->record.refs = now[j]->second.refs;
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // file ranges mapped, sorted and merged
  for (uint64_t i = 0; i < n; ++i) {
    if (!hits[of[i]]) continue;
    mapped[i] = true;
    const uint64_t at = units[i].file_offset;
    if (!ranges.empty() && ranges.back().second == at) {
      ranges.back().second += kDedupUnit;
    } else {
      ranges.emplace_back(at, at + kDedupUnit);
    }
  }
  if (ranges.empty()) return mapped;
  Txn txn(index_);
  uint64_t unmapped = 0;
  SPILLFS_RETURN_IF_ERROR(UnmapRanges(&txn, ino, ranges, &unmapped));
  uint64_t shared = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (!mapped[i]) continue;
    const Hit& hit = *hits[of[i]];
    Dedup::MapBlob(ino, units[i].file_offset, hit.blob, hit.record, &txn.batch, &txn.blob_refs);
    if (hit.sums_taken) {
      txn.new_blobs[hit.blob] = hit.record;
    } else {
      txn.current_blobs.emplace(hit.blob, &hit.record);
    }
    shared += kDedupUnit;
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
