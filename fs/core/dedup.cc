#include "core/dedup.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <future>
#include <set>
#include <string_view>
#include <system_error>

#include "spillfs/common/block_checksum.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

std::string Dedup::Hash(const char* unit) {
  XXH128_hash_t h = ContentHash128(unit, kDedupUnit);
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

namespace {

// Runs share(k) for k in [0, shares): share 0 on this thread, the others on
// threads of their own (on this one where no thread is to be had).
template <typename Share>
void RunShares(unsigned shares, const char* thread_name, const Share& share) {
  std::vector<std::future<void>> others;
  for (unsigned k = 1; k < shares; ++k) {
    try {
      others.push_back(std::async(std::launch::async, [&share, k, thread_name] {
        pthread_setname_np(pthread_self(), thread_name);
        share(k);
      }));
    } catch (const std::system_error&) {
      share(k);
    }
  }
  share(0);
  for (auto& f : others) f.get();
}

}  // namespace

void Dedup::HashSegments(std::vector<Segment>* segments, bool dedup) const {
  constexpr unsigned kThreads = 4;
  constexpr uint64_t kBytesPerThread = 4 << 20;  // less is hashed here
  auto hash = [&](Segment& segment) {
    segment.block_sums = block_sums_(segment.data, segment.length);
    if (dedup && segment.length == kDedupUnit && segment.file_offset % kDedupUnit == 0) {
      segment.content_hash = Hash(segment.data);
    }
  };
  uint64_t total = 0;
  for (const Segment& segment : *segments) total += segment.length;
  const unsigned helpers = static_cast<unsigned>(std::min<uint64_t>(kThreads, total / kBytesPerThread));
  if (helpers <= 1) {
    for (Segment& segment : *segments) hash(segment);
    return;
  }
  // Segments dealt round-robin.
  RunShares(helpers, "spillfs-hash", [&](unsigned k) {
    for (size_t i = k; i < segments->size(); i += helpers) hash((*segments)[i]);
  });
}

void Dedup::Deduplicate(std::vector<Segment>* segments, std::vector<SharedRef>* shared) const {
  std::vector<Segment> to_write;
  std::set<std::string> new_hashes;  // within one flush, only the first copy becomes a blob
  for (Segment& segment : *segments) {
    if (!segment.content_hash.empty()) {  // a whole dedup unit (HashSegments)
      const std::string& hash = segment.content_hash;
      std::string value;
      if (index_.Get(Family::kBlob, keys::BlobByHash(hash), &value).ok() && value.size() == 8) {
        shared->push_back(SharedRef{segment.file_offset, coding::DecodeFixed64BE(value.data()), hash, segment.data});
        continue;
      }
      if (new_hashes.insert(hash).second) segment.blob_hash = hash;
    }
    to_write.push_back(std::move(segment));
  }
  *segments = std::move(to_write);
}

Status Dedup::CheckShared(const std::vector<SharedRef>& shared) const {
  for (const SharedRef& ref : shared) {
    std::string value;
    auto blob = index_.Get(Family::kBlob, keys::BlobByPhysical(ref.blob), &value).ok()
                    ? BlobRecord::Decode(value)
                    : Result<BlobRecord>(Status::NotFound());
    if (!blob.ok() || blob->hash != ref.hash || blob->length != kDedupUnit) {
      return Status::Error(EAGAIN, "dedup target vanished");
    }
  }
  return Status::OK();
}

void Dedup::NoteNewBlobs(const std::vector<std::pair<uint64_t, ExtentRecord>>& extents,
                         const std::vector<Segment>& segments, std::map<uint64_t, BlobRecord>* new_blobs) {
  for (auto& [offset, extent] : extents) {
    if (extent.blob_id == 0) continue;
    for (const Segment& segment : segments) {
      if (segment.file_offset == offset && !segment.blob_hash.empty()) {
        (*new_blobs)[extent.blob_id] = BlobRecord{segment.blob_hash, extent.length, 0, extent.block_checksums};
      }
    }
  }
}

void Dedup::MapShared(InodeNumber ino, const std::vector<SharedRef>& shared, Index::Batch* batch,
                      std::map<uint64_t, int64_t>* blob_refs) const {
  for (const SharedRef& ref : shared) {
    ExtentRecord extent;
    extent.physical = ref.blob;
    extent.length = kDedupUnit;
    extent.blob_id = ref.blob;
    extent.block_checksums = block_sums_(ref.data, kDedupUnit);
    batch->Put(Family::kExtent, keys::Extent(ino, ref.file_offset), extent.Encode());
    ++(*blob_refs)[ref.blob];
  }
}

std::vector<std::optional<std::pair<uint64_t, BlobRecord>>> Dedup::FindBlobs(
    const std::vector<std::string_view>& hashes) const {
  constexpr unsigned kThreads = 4;
  constexpr size_t kHashesPerThread = 1024;  // fewer are looked up here
  std::vector<std::optional<std::pair<uint64_t, BlobRecord>>> found(hashes.size());
  auto look_up = [&](size_t begin, size_t end) {
    std::vector<std::string> keys;
    keys.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) keys.push_back(keys::BlobByHash(hashes[i]));
    std::vector<std::optional<std::string>> values;
    // A failed look-up finds nothing: the unit is written, not shared.
    if (!index_.MultiGet(Family::kBlob, keys, &values).ok()) return;
    std::vector<size_t> at;      // hashes[at[j]] names blob[j]
    std::vector<uint64_t> blob;  // physical offsets
    keys.clear();
    for (size_t i = begin; i < end; ++i) {
      const std::optional<std::string>& value = values[i - begin];
      if (!value || value->size() != 8) continue;
      at.push_back(i);
      blob.push_back(coding::DecodeFixed64BE(value->data()));
      keys.push_back(keys::BlobByPhysical(blob.back()));
    }
    if (!index_.MultiGet(Family::kBlob, keys, &values).ok()) return;
    for (size_t j = 0; j < at.size(); ++j) {
      if (!values[j]) continue;
      auto record = BlobRecord::Decode(*values[j]);
      if (!record.ok() || record->hash != hashes[at[j]] || record->length != kDedupUnit) continue;
      found[at[j]].emplace(blob[j], std::move(*record));
    }
  };
  const size_t n = hashes.size();
  const unsigned shares = static_cast<unsigned>(std::clamp<size_t>(n / kHashesPerThread, 1, kThreads));
  // Contiguous shares: each one's keys go to RocksDB together.
  RunShares(shares, "spillfs-dedup", [&](unsigned k) { look_up(n * k / shares, n * (k + 1) / shares); });
  return found;
}

std::map<uint64_t, const std::string*> Dedup::NewBlobUnits(const std::vector<DirectUnit>& units) const {
  std::map<uint64_t, const std::string*> blob_units;
  std::set<std::string_view> seen;
  for (const DirectUnit& unit : units) {
    std::string value;
    if (!seen.insert(unit.hash).second || index_.Get(Family::kBlob, keys::BlobByHash(unit.hash), &value).ok()) {
      continue;
    }
    blob_units.emplace(unit.file_offset, &unit.hash);
  }
  return blob_units;
}

bool Dedup::TakeChecksums(const char* unit, BlobRecord* record) const {
  if (Hash(unit) != record->hash) return false;
  record->block_checksums = block_sums_(unit, kDedupUnit);
  return true;
}

void Dedup::MapBlob(InodeNumber ino, uint64_t file_offset, uint64_t blob, const BlobRecord& record, Index::Batch* batch,
                    std::map<uint64_t, int64_t>* blob_refs) {
  ExtentRecord extent;
  extent.physical = blob;
  extent.length = kDedupUnit;
  extent.blob_id = blob;
  extent.block_checksums = record.block_checksums;
  batch->Put(Family::kExtent, keys::Extent(ino, file_offset), extent.Encode());
  ++(*blob_refs)[blob];
}

Status Dedup::ApplyBlobRefs(const std::map<uint64_t, int64_t>& blob_refs,
                            const std::map<uint64_t, BlobRecord>& new_blobs,
                            const std::unordered_map<uint64_t, const BlobRecord*>& current, Index::Batch* batch,
                            std::vector<PhysicalExtent>* freed, bool* blobs_changed) const {
  for (auto& [physical, delta] : blob_refs) {
    if (delta == 0) continue;
    if (blobs_changed) *blobs_changed = true;
    BlobRecord blob;
    auto fresh = new_blobs.find(physical);
    auto known = current.find(physical);
    if (fresh != new_blobs.end()) {
      blob = fresh->second;
    } else if (known != current.end()) {
      blob = *known->second;
    } else {
      std::string value;
      Status found = index_.Get(Family::kBlob, keys::BlobByPhysical(physical), &value);
      if (!found.ok()) return Status::Corruption(fmt::format("extent names blob {} that does not exist", physical));
      SPILLFS_ASSIGN_OR_RETURN(blob, BlobRecord::Decode(value));
    }
    int64_t refs = static_cast<int64_t>(blob.refs) + delta;
    if (refs > 0) {
      blob.refs = static_cast<uint64_t>(refs);
      batch->Put(Family::kBlob, keys::BlobByPhysical(physical), blob.Encode());
      if (fresh != new_blobs.end()) batch->Put(Family::kBlob, keys::BlobByHash(blob.hash), EncodeMetaU64(physical));
      continue;
    }
    batch->Delete(Family::kBlob, keys::BlobByPhysical(physical));
    std::string owner;
    if (index_.Get(Family::kBlob, keys::BlobByHash(blob.hash), &owner).ok() && owner == EncodeMetaU64(physical)) {
      batch->Delete(Family::kBlob, keys::BlobByHash(blob.hash));
    }
    freed->push_back(PhysicalExtent{physical, blob.length});
  }
  return Status::OK();
}

}  // namespace spillfs
