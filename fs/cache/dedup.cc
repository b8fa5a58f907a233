#include "spillfs/cache/dedup.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <future>
#include <set>
#include <string_view>
#include <system_error>

#include "spillfs/common/block_checksum.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

std::string Dedup::Hash(const char* unit) {
  XXH128_hash_t h = ContentHash128(unit, kDedupUnit);
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

bool Dedup::Holds(const BlobRecord& record, uint64_t unit, std::string_view hash) {
  return record.units() > 0 && record.length == record.units() * kDedupUnit && unit < record.units() &&
         record.unit_hash(unit) == hash;
}

Result<BlobRecord> Dedup::LoadBlob(uint64_t physical, bool content) const {
  std::string value;
  SPILLFS_RETURN_IF_ERROR(index_.Get(Family::kBlob, keys::BlobByPhysical(physical), &value));
  SPILLFS_ASSIGN_OR_RETURN(BlobRecord record, BlobRecord::Decode(value));
  if (content && record.needs_content()) {
    Status found = index_.Get(Family::kBlob, keys::BlobContent(physical), &value);
    if (!found.ok()) return Status::Corruption(fmt::format("blob {} has no content record", physical));
    SPILLFS_RETURN_IF_ERROR(record.DecodeContent(value));
  }
  return record;
}

void Dedup::PutBlob(Index::Batch* batch, uint64_t physical, const BlobRecord& record, bool content) {
  batch->Put(Family::kBlob, keys::BlobByPhysical(physical), record.Encode());
  if (content && record.split()) batch->Put(Family::kBlob, keys::BlobContent(physical), record.EncodeContent());
}

void Dedup::DeleteBlob(Index::Batch* batch, uint64_t physical, const BlobRecord& record) {
  batch->Delete(Family::kBlob, keys::BlobByPhysical(physical));
  if (record.split()) batch->Delete(Family::kBlob, keys::BlobContent(physical));
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
      if (index_.Get(Family::kBlob, keys::BlobByHash(hash), &value).ok()) {
        if (auto at = BlobUnitRef::Decode(value); at.ok()) {
          shared->push_back(SharedRef{segment.file_offset, *at, hash, segment.data});
          continue;
        }
      }
      if (new_hashes.insert(hash).second) segment.blob_hash = hash;
    }
    to_write.push_back(std::move(segment));
  }
  *segments = std::move(to_write);
}

Status Dedup::CheckShared(const std::vector<SharedRef>& shared) const {
  for (const SharedRef& ref : shared) {
    auto blob = LoadBlob(ref.at.blob, /*content=*/true);
    if (!blob.ok() || !Holds(*blob, ref.at.unit, ref.hash)) {
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
    extent.physical = ref.at.blob + ref.at.unit * kDedupUnit;
    extent.length = kDedupUnit;
    extent.blob_id = ref.at.blob;
    extent.block_checksums = block_sums_(ref.data, kDedupUnit);
    batch->Put(Family::kExtent, keys::Extent(ino, ref.file_offset), extent.Encode());
    ++(*blob_refs)[ref.at.blob];
  }
}

namespace {

constexpr unsigned kLookUpThreads = 4;
constexpr size_t kKeysPerThread = 1024;  // fewer are looked up on the caller's thread

// Runs look_up(begin, end) over contiguous shares of [0, n): each share's
// keys go to RocksDB together.
template <typename LookUp>
void InShares(size_t n, const LookUp& look_up) {
  const unsigned shares = static_cast<unsigned>(std::clamp<size_t>(n / kKeysPerThread, 1, kLookUpThreads));
  RunShares(shares, "spillfs-dedup", [&](unsigned k) { look_up(n * k / shares, n * (k + 1) / shares); });
}

}  // namespace

void Dedup::LookUpUnits(const std::vector<std::string_view>& hashes, const std::vector<size_t>& which,
                        FoundBlobs* found) const {
  InShares(which.size(), [&](size_t begin, size_t end) {
    std::vector<std::string> keys;
    keys.reserve(end - begin);
    for (size_t j = begin; j < end; ++j) keys.push_back(keys::BlobByHash(hashes[which[j]]));
    std::vector<std::optional<std::string>> values;
    // A failed look-up finds nothing: the unit is written, not shared.
    if (!index_.MultiGet(Family::kBlob, keys, &values).ok()) return;
    for (size_t j = begin; j < end; ++j) {
      if (!values[j - begin]) continue;
      if (auto at = BlobUnitRef::Decode(*values[j - begin]); at.ok()) found->units[which[j]] = *at;
    }
  });
}

void Dedup::LoadRecords(std::vector<uint64_t> blobs, FoundBlobs* found) const {
  std::sort(blobs.begin(), blobs.end());
  blobs.erase(std::unique(blobs.begin(), blobs.end()), blobs.end());
  std::vector<std::optional<BlobRecord>> records(blobs.size());
  std::vector<std::string> sums(blobs.size());
  InShares(blobs.size(), [&](size_t begin, size_t end) {
    std::vector<std::string> keys;
    keys.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) keys.push_back(keys::BlobByPhysical(blobs[i]));
    std::vector<std::optional<std::string>> values;
    if (!index_.MultiGet(Family::kBlob, keys, &values).ok()) return;
    std::vector<size_t> split;  // of records whose content is still to be read
    for (size_t i = begin; i < end; ++i) {
      if (!values[i - begin]) continue;
      auto record = BlobRecord::Decode(*values[i - begin]);
      if (!record.ok()) continue;
      records[i] = std::move(*record);
      if (records[i]->needs_content()) {
        split.push_back(i);
      } else {  // one unit: the record keeps its checksums (ApplyBlobRefs writes it whole)
        sums[i] = ChecksumBytes(records[i]->block_checksums);
      }
    }
    if (split.empty()) return;
    keys.clear();
    for (size_t i : split) keys.push_back(keys::BlobContent(blobs[i]));
    if (!index_.MultiGet(Family::kBlob, keys, &values).ok()) values.assign(split.size(), std::nullopt);
    for (size_t j = 0; j < split.size(); ++j) {
      std::optional<BlobRecord>& record = records[split[j]];
      auto view = values[j] ? BlobContentView::Parse(*values[j]) : Result<BlobContentView>(Status::NotFound());
      if (!view.ok() || !record->SetContent(*view, /*with_checksums=*/false).ok()) {
        record.reset();
        continue;
      }
      sums[split[j]].assign(view->checksums);
    }
  });
  for (size_t i = 0; i < blobs.size(); ++i) {
    if (records[i]) {
      found->records.insert_or_assign(blobs[i], std::move(*records[i]));
      found->checksums.insert_or_assign(blobs[i], std::move(sums[i]));
    } else {
      found->records.erase(blobs[i]);
      found->checksums.erase(blobs[i]);
    }
  }
}

namespace {

// The record of the blob found for unit i where it holds `hash` there; else
// the unit is dropped from `found` (its blob gone or rewritten) and nullptr.
const BlobRecord* HolderOrDropped(FoundBlobs* found, size_t i, std::string_view hash) {
  std::optional<BlobUnitRef>& at = found->units[i];
  if (!at) return nullptr;
  auto record = found->records.find(at->blob);
  if (record != found->records.end() && Dedup::Holds(record->second, at->unit, hash)) return &record->second;
  at.reset();
  return nullptr;
}

}  // namespace

FoundBlobs Dedup::FindBlobs(const std::vector<std::string_view>& hashes, const std::vector<bool>& follows) const {
  const size_t n = hashes.size();
  FoundBlobs found;
  found.units.resize(n);
  std::vector<bool> done(n, false);  // looked up, or found by following a run
  // Looks `which` up, loads the blobs found, drops what they do not hold,
  // and follows each unit found along its blob: unit i + 1, where it comes
  // right after unit i in the file, is most likely the blob's next unit (a
  // tensor saved again); taken where the blob's record holds its hash there.
  auto round = [&](const std::vector<size_t>& which) {
    LookUpUnits(hashes, which, &found);
    std::vector<uint64_t> blobs;
    for (size_t i : which) {
      done[i] = true;
      if (found.units[i] && !found.records.count(found.units[i]->blob)) blobs.push_back(found.units[i]->blob);
    }
    LoadRecords(std::move(blobs), &found);
    for (size_t i : which) {
      const BlobRecord* record = HolderOrDropped(&found, i, hashes[i]);
      if (record == nullptr) continue;
      const BlobUnitRef at = *found.units[i];
      for (size_t j = i + 1; j < n && !done[j] && follows[j]; ++j) {
        const BlobUnitRef next{at.blob, found.units[j - 1]->unit + 1};
        if (!Holds(*record, next.unit, hashes[j])) break;
        found.units[j] = next;
        done[j] = true;
      }
    }
  };
  // First the units that start a run of the file, then all the others that
  // no run reached.
  std::vector<size_t> which;
  for (size_t i = 0; i < n; ++i) {
    if (i == 0 || !follows[i]) which.push_back(i);
  }
  round(which);
  which.clear();
  for (size_t i = 0; i < n; ++i) {
    if (!done[i]) which.push_back(i);
  }
  if (!which.empty()) round(which);
  return found;
}

void Dedup::CheckFound(const std::vector<std::string_view>& hashes, FoundBlobs* found) const {
  std::vector<uint64_t> blobs;
  for (const auto& [blob, record] : found->records) blobs.push_back(blob);
  LoadRecords(std::move(blobs), found);
  for (size_t i = 0; i < hashes.size(); ++i) HolderOrDropped(found, i, hashes[i]);
}

bool Dedup::TakeChecksums(const char* unit, BlobRecord* record) const {
  if (record->units() != 1 || Hash(unit) != record->hash) return false;
  record->block_checksums = block_sums_(unit, kDedupUnit);
  return true;
}

void Dedup::MapBlob(InodeNumber ino, uint64_t file_offset, BlobUnitRef first_unit, uint64_t units,
                    const BlobRecord& record, std::string_view checksums, Index::Batch* batch,
                    std::map<uint64_t, int64_t>* blob_refs) {
  const uint64_t per_unit = checksums.size() / record.units();  // bytes
  batch->Put(Family::kExtent, keys::Extent(ino, file_offset),
             EncodeExtent(first_unit.blob + first_unit.unit * kDedupUnit, units * kDedupUnit, 0, first_unit.blob,
                          checksums.substr(first_unit.unit * per_unit, units * per_unit)));
  ++(*blob_refs)[first_unit.blob];
}

std::string Dedup::ChecksumBytes(const std::vector<uint32_t>& sums) {
  std::string out;
  AppendChecksums(&out, sums);
  return out;
}

Status Dedup::ApplyBlobRefs(const std::map<uint64_t, int64_t>& blob_refs,
                            const std::map<uint64_t, BlobRecord>& new_blobs,
                            const std::unordered_map<uint64_t, const BlobRecord*>& current, Index::Batch* batch,
                            std::vector<PhysicalExtent>* freed, bool* blobs_changed) const {
  // The hash keys to write (a new blob's units) and to drop (a freed blob's),
  // each with the unit it names: looked up together, at the end.
  std::vector<std::pair<std::string, BlobUnitRef>> to_index, to_drop;
  for (const auto& entry : blob_refs) {
    const uint64_t physical = entry.first;  // not a structured binding: the lambda below names it
    const int64_t delta = entry.second;
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
      auto found = LoadBlob(physical, /*content=*/false);
      if (!found.ok() && found.status().code() == ENOENT) {
        return Status::Corruption(fmt::format("extent names blob {} that does not exist", physical));
      }
      SPILLFS_ASSIGN_OR_RETURN(blob, std::move(found));
    }
    int64_t refs = static_cast<int64_t>(blob.refs) + delta;
    auto each_unit = [&](std::vector<std::pair<std::string, BlobUnitRef>>* keys) {
      for (uint64_t k = 0; k < blob.units(); ++k) {
        keys->emplace_back(keys::BlobByHash(blob.unit_hash(k)), BlobUnitRef{physical, k});
      }
    };
    if (refs > 0) {
      blob.refs = static_cast<uint64_t>(refs);
      PutBlob(batch, physical, blob, /*content=*/fresh != new_blobs.end());
      if (fresh != new_blobs.end()) each_unit(&to_index);
      continue;
    }
    if (blob.needs_content()) {  // its unit hashes name the keys to drop
      std::string content;
      Status found = index_.Get(Family::kBlob, keys::BlobContent(physical), &content);
      if (found.ok()) found = blob.DecodeContent(content);
      if (!found.ok()) return Status::Corruption(fmt::format("blob {} content: {}", physical, found.ToString()));
    }
    DeleteBlob(batch, physical, blob);
    each_unit(&to_drop);
    freed->push_back(PhysicalExtent{physical, blob.length});
  }
  if (to_index.empty() && to_drop.empty()) return Status::OK();
  // One look-up for both: a new blob's hash is indexed where no blob holds it
  // yet (within the batch, the first unit of equal hashes), a freed blob's
  // key dropped where it names that blob.
  std::vector<std::string> keys;
  keys.reserve(to_index.size() + to_drop.size());
  for (const auto* list : {&to_index, &to_drop}) {
    for (const auto& [key, at] : *list) keys.push_back(key);
  }
  std::vector<std::optional<std::string>> values;
  SPILLFS_RETURN_IF_ERROR(index_.MultiGet(Family::kBlob, keys, &values));
  std::set<std::string_view> dropped, indexed;
  for (size_t j = 0; j < to_drop.size(); ++j) {
    const std::optional<std::string>& owner = values[to_index.size() + j];
    if (owner && *owner == to_drop[j].second.Encode()) {
      batch->Delete(Family::kBlob, to_drop[j].first);
      dropped.insert(to_drop[j].first);
    }
  }
  for (size_t i = 0; i < to_index.size(); ++i) {
    const std::string& key = to_index[i].first;
    if ((values[i] && !dropped.count(key)) || !indexed.insert(key).second) continue;
    batch->Put(Family::kBlob, key, to_index[i].second.Encode());  // after a Delete of it: the Put stands
  }
  return Status::OK();
}

}  // namespace spillfs
