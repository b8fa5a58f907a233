#include "spillfs/store/allocator.h"

#include <fmt/format.h>

#include <algorithm>

#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {
namespace {

std::string EncodeLength(uint64_t length) {
  std::string out;
  coding::PutVarint64(&out, length);
  return out;
}

}  // namespace

Status Allocator::Load(const Index& index) {
  MutexLock lock(&mu_);
  persisted_.clear();
  persisted_bytes_ = 0;
  auto cursor = index.NewCursor(Family::kFree, "");
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    uint64_t length = 0;
    coding::Reader reader(cursor->value());
    if (cursor->key().size() != 8 || !reader.GetVarint64(&length) || length == 0) {
      return Status::Corruption("malformed free-space record");
    }
    uint64_t offset = keys::DecodeIno(cursor->key());
    if (offset % unit_ != 0 || length % unit_ != 0) {
      return Status::Corruption(fmt::format("free extent [{}, +{}) is not block aligned", offset, length));
    }
    if (!persisted_.empty()) {
      auto last = std::prev(persisted_.end());
      if (last->first + last->second > offset) {
        return Status::Corruption(fmt::format("free extents overlap at {}", offset));
      }
    }
    persisted_.emplace(offset, length);
    persisted_bytes_ += length;
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  // Everything the index holds now counts as durable: RocksDB's recovery
  // writes the replayed WAL to synced tables at open.
  available_ = persisted_;
  available_bytes_ = persisted_bytes_;
  parked_.clear();
  parked_bytes_ = 0;
  cursor_ = 0;
  return Status::OK();
}

// Adds [offset, +length) to `map`, merging with neighbours; mirrors the key
// changes into `batch` when given.
void Allocator::Insert(std::map<uint64_t, uint64_t>* map, uint64_t offset, uint64_t length, Index::Batch* batch) {
  auto next = map->lower_bound(offset);
  if (next != map->begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      if (batch) batch->Delete(Family::kFree, keys::Free(prev->first));
      map->erase(prev);
    }
  }
  if (next != map->end() && offset + length == next->first) {
    length += next->second;
    if (batch) batch->Delete(Family::kFree, keys::Free(next->first));
    map->erase(next);
  }
  (*map)[offset] = length;
  if (batch) batch->Put(Family::kFree, keys::Free(offset), EncodeLength(length));
}

// Removes [offset, +length), which must lie inside one extent of `map`.
void Allocator::Remove(std::map<uint64_t, uint64_t>* map, uint64_t offset, uint64_t length, Index::Batch* batch) {
  auto it = map->upper_bound(offset);
  --it;  // the extent containing offset
  uint64_t start = it->first, end = it->first + it->second;
  map->erase(it);
  if (batch) batch->Delete(Family::kFree, keys::Free(start));
  if (start < offset) {
    (*map)[start] = offset - start;
    if (batch) batch->Put(Family::kFree, keys::Free(start), EncodeLength(offset - start));
  }
  if (offset + length < end) {
    (*map)[offset + length] = end - offset - length;
    if (batch) batch->Put(Family::kFree, keys::Free(offset + length), EncodeLength(end - offset - length));
  }
}

Status Allocator::Hold(uint64_t bytes) {
  MutexLock lock(&mu_);
  // Parked space counts: a reservation that needs it syncs the index first.
  if (held_bytes_ + bytes > available_bytes_ + parked_bytes_) return Status::NoSpace();
  held_bytes_ += bytes;
  return Status::OK();
}

void Allocator::ReleaseHold(uint64_t bytes) {
  MutexLock lock(&mu_);
  held_bytes_ -= std::min(held_bytes_, bytes);
}

Result<std::vector<PhysicalExtent>> Allocator::Reserve(uint64_t length, uint64_t from_hold) {
  bool short_of_parked = false;
  auto reserved = TryReserve(length, from_hold, &short_of_parked);
  if (reserved.ok() || !short_of_parked || !shortage_) return reserved;
  SPILLFS_RETURN_IF_ERROR(shortage_());
  return TryReserve(length, from_hold, &short_of_parked);
}

Result<std::vector<PhysicalExtent>> Allocator::TryReserve(uint64_t length, uint64_t from_hold, bool* short_of_parked) {
  MutexLock lock(&mu_);
  if (length == 0 || length % unit_ != 0) {
    return Status::Invalid(fmt::format("allocation of {} bytes is not a positive multiple of {}", length, unit_));
  }
  from_hold = std::min(from_hold, held_bytes_);
  uint64_t others = held_bytes_ - from_hold;  // promises that must stay keepable
  if (length + others > available_bytes_ + parked_bytes_) return Status::NoSpace();
  if (length > available_bytes_) {
    *short_of_parked = true;  // fits once parked space is durable
    return Status::NoSpace();
  }
  std::vector<PhysicalExtent> out;
  // First choice: one run big enough, at or after the cursor, then anywhere.
  auto fits = [&](auto begin, auto end) {
    for (auto it = begin; it != end; ++it) {
      if (it->second >= length) return it;
    }
    return end;
  };
  auto it = fits(available_.lower_bound(cursor_), available_.end());
  if (it == available_.end()) it = fits(available_.begin(), available_.end());
  if (it != available_.end()) {
    out.push_back(PhysicalExtent{it->first, length});
  } else {
    // Fragmented: take the largest runs first.
    std::vector<std::pair<uint64_t, uint64_t>> runs(available_.begin(), available_.end());
    std::sort(runs.begin(), runs.end(), [](auto& a, auto& b) { return a.second > b.second; });
    uint64_t need = length;
    for (auto& [offset, run] : runs) {
      uint64_t take = std::min(run, need);
      out.push_back(PhysicalExtent{offset, take});
      need -= take;
      if (need == 0) break;
    }
    if (need > 0) {  // the byte count disagrees with the runs: never hand out less
      return Status::Corruption(fmt::format("free-space total {} exceeds the free runs", available_bytes_));
    }
  }
  for (const PhysicalExtent& e : out) Remove(&available_, e.offset, e.length, nullptr);
  available_bytes_ -= length;
  held_bytes_ -= from_hold;
  cursor_ = out.back().offset + out.back().length;
  return out;
}

void Allocator::Unreserve(const std::vector<PhysicalExtent>& extents) {
  MutexLock lock(&mu_);
  MakeAvailable(extents);
}

void Allocator::CommitAllocated(const std::vector<PhysicalExtent>& extents, Index::Batch* batch) {
  MutexLock lock(&mu_);
  for (const PhysicalExtent& e : extents) {
    Remove(&persisted_, e.offset, e.length, batch);
    persisted_bytes_ -= e.length;
  }
}

void Allocator::CommitFreed(const std::vector<PhysicalExtent>& extents, Index::Batch* batch) {
  MutexLock lock(&mu_);
  for (const PhysicalExtent& e : extents) {
    Insert(&persisted_, e.offset, e.length, batch);
    persisted_bytes_ += e.length;
  }
}

void Allocator::Release(const std::vector<PhysicalExtent>& extents, uint64_t commit) {
  MutexLock lock(&mu_);
  if (commit <= durable_) {
    MakeAvailable(extents);
    return;
  }
  auto now = std::chrono::steady_clock::now();
  if (parked_.empty()) oldest_parked_ = now;
  for (const PhysicalExtent& e : extents) parked_bytes_ += e.length;
  parked_.emplace(commit, Parked{extents, now});
}

void Allocator::Durable(uint64_t commit) {
  MutexLock lock(&mu_);
  if (commit <= durable_) return;
  durable_ = commit;
  auto end = parked_.upper_bound(commit);
  if (end == parked_.begin()) return;
  for (auto it = parked_.begin(); it != end; ++it) {
    for (const PhysicalExtent& e : it->second.extents) parked_bytes_ -= e.length;
    MakeAvailable(it->second.extents);
  }
  parked_.erase(parked_.begin(), end);
  if (!parked_.empty()) {
    oldest_parked_ = parked_.begin()->second.since;
    for (const auto& [number, space] : parked_) oldest_parked_ = std::min(oldest_parked_, space.since);
  }
}

void Allocator::MakeAvailable(const std::vector<PhysicalExtent>& extents) {
  for (const PhysicalExtent& e : extents) {
    Insert(&available_, e.offset, e.length, nullptr);
    available_bytes_ += e.length;
  }
}

uint64_t Allocator::available_bytes() const {
  MutexLock lock(&mu_);
  uint64_t free = available_bytes_ + parked_bytes_;
  return free - std::min(free, held_bytes_);
}

uint64_t Allocator::parked_bytes() const {
  MutexLock lock(&mu_);
  return parked_bytes_;
}

std::chrono::steady_clock::duration Allocator::parked_for() const {
  MutexLock lock(&mu_);
  if (parked_.empty()) return std::chrono::steady_clock::duration::zero();
  return std::chrono::steady_clock::now() - oldest_parked_;
}

uint64_t Allocator::persisted_free_bytes() const {
  MutexLock lock(&mu_);
  return persisted_bytes_;
}

std::map<uint64_t, uint64_t> Allocator::persisted() const {
  MutexLock lock(&mu_);
  return persisted_;
}

}  // namespace spillfs
