// Filesystem: the direct data path. A client that may open the backing store
// gets a file's committed layout (and reads the blocks itself), or reserves
// fresh space, writes it itself and commits the mapping here.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "core/filesystem.h"
#include "spillfs/common/clock.h"
#include "spillfs/common/rounding.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

Result<DirectLayout> Filesystem::GetDirectLayout(InodeNumber ino) {
  SPILLFS_RETURN_IF_ERROR(FlushFile(ino));  // the SSD must hold what the client will read
  std::shared_lock io_lock(IoLock(ino));
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
  if (file_offset % block_size_ != 0) return Status::Error(EINVAL, "file_offset must be block aligned");
  if (checksums_ && checksums.size() != length / block_size_) {
    return Status::Error(EINVAL,
                         fmt::format("expected {} block checksums, got {}", length / block_size_, checksums.size()));
  }
  if (file_offset + length < file_offset || file_offset + length > (1ull << 62)) {
    return Status::Error(EFBIG, "commit range is past the largest file offset");
  }
  if (size > file_offset + length) return Status::Error(EINVAL, "size lies past the committed data");
  for (const DirectUnit& unit : units) {
    if (unit.hash.size() != 16 || unit.file_offset % kDedupUnit != 0 || unit.file_offset < file_offset ||
        unit.file_offset + kDedupUnit > file_offset + length) {
      return Status::Error(EINVAL, fmt::format("unit at file offset {} is not a whole, aligned dedup unit of the "
                                               "committed range with a 16-byte hash",
                                               unit.file_offset));
    }
  }
  std::lock_guard flush_lock(FlushLock(ino));
  std::unique_lock io_lock(IoLock(ino));
  ContentChange change(&read_ahead_, ino);           // before io_lock lets readers in
  SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));         // older cached data must not land on top later
  SPILLFS_RETURN_IF_ERROR(FlushBeforeMapping(ino));  // the client's writes have completed
  std::lock_guard lock(mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "commit target is not a regular file");
  // Written blocks past EOF would show through a later truncate up. Checked
  // before MapExtents: that changes the allocator's persisted map, so no
  // return may come between it and the commit.
  if (file_offset + length > RoundUp(std::max(record.size, size), block_size_)) {
    return Status::Error(EINVAL, "commit maps blocks past the end of the file: give size");
  }
  // The units that become blobs (file offset -> hash): the first of equal
  // hashes, where no blob holds the hash yet (a later write of these bytes
  // shares that one).
  std::map<uint64_t, const std::string*> blob_units;
  if (dedup_) {
    std::set<std::string_view> seen;
    for (const DirectUnit& unit : units) {
      std::string value;
      if (!seen.insert(unit.hash).second || index_.Get(Family::kBlob, keys::BlobByHash(unit.hash), &value).ok()) {
        continue;
      }
      blob_units.emplace(unit.file_offset, &unit.hash);
    }
  }
  Txn txn(index_);
  // One extent per reserved piece, cut around the units that become blobs
  // (a blob is one extent of its own; a unit split over two pieces stays plain).
  std::vector<std::pair<uint64_t, ExtentRecord>> extents;
  uint64_t at = 0;  // of the committed range
  for (const PhysicalExtent& piece : space) {
    const uint64_t piece_file = file_offset + at;
    auto emit = [&](uint64_t from, uint64_t n, bool blob) {
      ExtentRecord extent;
      extent.physical = piece.offset + from;
      extent.length = n;
      if (blob) extent.blob_id = extent.physical;
      if (checksums_) {
        auto first = checksums.begin() + static_cast<long>((at + from) / block_size_);
        extent.block_checksums.assign(first, first + static_cast<long>(n / block_size_));
      }
      extents.emplace_back(piece_file + from, std::move(extent));
    };
    uint64_t cursor = 0;  // of the piece
    for (auto it = blob_units.lower_bound(piece_file);
         it != blob_units.end() && it->first + kDedupUnit <= piece_file + piece.length; ++it) {
      const uint64_t from = it->first - piece_file;
      if (from > cursor) emit(cursor, from - cursor, false);
      emit(from, kDedupUnit, true);
      const ExtentRecord& blob = extents.back().second;
      txn.new_blobs[blob.physical] = BlobRecord{*it->second, kDedupUnit, 0, blob.block_checksums};
      cursor = from + kDedupUnit;
    }
    if (cursor < piece.length) emit(cursor, piece.length - cursor, false);
    at += piece.length;
  }
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
  for (const std::string& hash : hashes) {
    if (hash.size() != 16) return Status::Error(EINVAL, "a dedup hash is not 16 bytes");
  }
  std::vector<bool> mapped(n, false);
  if (n == 0) return mapped;

  // The blob holding each hash, with its block checksums: kept in its record,
  // or (a blob from before they were kept) taken from its bytes, read once
  // and checked against the hash. The pin keeps the blocks of a blob freed
  // meanwhile from reuse while they are read; a blob gone by the commit is
  // not mapped (checked again under mu_).
  struct Hit {
    uint64_t blob = 0;
    BlobRecord record;
    bool sums_taken = false;  // read here: the commit stores them in the record
  };
  std::map<std::string, std::optional<Hit>> hits;  // by hash
  {
    ReclaimGate::Reader pin(&gate_);
    AlignedBuffer unit;
    for (const std::string& hash : hashes) {
      auto [it, fresh] = hits.try_emplace(hash);
      if (!fresh) continue;
      std::string value;
      if (!index_.Get(Family::kBlob, keys::BlobByHash(hash), &value).ok() || value.size() != 8) continue;
      Hit hit;
      hit.blob = coding::DecodeFixed64BE(value.data());
      if (!index_.Get(Family::kBlob, keys::BlobByPhysical(hit.blob), &value).ok()) continue;
      auto record = BlobRecord::Decode(value);
      if (!record.ok() || record->hash != hash || record->length != kDedupUnit) continue;
      hit.record = std::move(*record);
      if (checksums_ && hit.record.block_checksums.size() != kDedupUnit / block_size_) {
        // (No memory for the unit: no hit, as for a unit that cannot be read.)
        if (!unit.Resize(kDedupUnit).ok() || !store_.ReadAt(hit.blob, unit.data(), kDedupUnit).ok() ||
            DedupHash(unit.data()) != hash) {
          continue;
        }
        hit.record.block_checksums = Checksums(unit.data(), kDedupUnit);
        hit.sums_taken = true;
      }
      it->second = std::move(hit);
    }
  }

  std::lock_guard flush_lock(FlushLock(ino));
  std::unique_lock io_lock(IoLock(ino));
  ContentChange change(&read_ahead_, ino);    // before io_lock lets readers in
  SPILLFS_RETURN_IF_ERROR(FlushLocked(ino));  // cached data of the range must not land on top later
  // A blob may be an ephemeral file's, written without a sync of the data area.
  SPILLFS_RETURN_IF_ERROR(FlushBeforeMapping(ino));
  std::lock_guard lock(mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISREG(record.mode)) return Status::Error(EINVAL, "dedup target is not a regular file");
  // Still there, unchanged (a commit of another file may have dropped it).
  for (auto& [hash, hit] : hits) {
    if (!hit) continue;
    std::string value;
    auto now = index_.Get(Family::kBlob, keys::BlobByHash(hash), &value).ok() && value.size() == 8 &&
                       coding::DecodeFixed64BE(value.data()) == hit->blob &&
                       index_.Get(Family::kBlob, keys::BlobByPhysical(hit->blob), &value).ok()
                   ? BlobRecord::Decode(value)
                   : Result<BlobRecord>(Status::NotFound());
    if (!now.ok() || now->hash != hash || now->length != kDedupUnit) {
      hit.reset();
      continue;
    }
    hit->record.refs = now->refs;  // the base ApplyBlobRefs counts from, if it rewrites the record
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // file ranges mapped, sorted and merged
  for (uint64_t i = 0; i < n; ++i) {
    if (!hits[hashes[i]]) continue;
    mapped[i] = true;
    const uint64_t at = file_offset + i * kDedupUnit;
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
    const Hit& hit = *hits[hashes[i]];
    ExtentRecord extent;
    extent.physical = hit.blob;
    extent.length = kDedupUnit;
    extent.blob_id = hit.blob;
    extent.block_checksums = hit.record.block_checksums;
    txn.batch.Put(Family::kExtent, keys::Extent(ino, file_offset + i * kDedupUnit), extent.Encode());
    ++txn.blob_refs[hit.blob];
    if (hit.sums_taken) txn.new_blobs[hit.blob] = hit.record;
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
