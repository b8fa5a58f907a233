#include "spillfs/store/reclaim_gate.h"

namespace spillfs {

uint64_t ReclaimGate::Enter() {
  MutexLock lock(&mu_);
  ++readers_[epoch_];
  return epoch_;
}

void ReclaimGate::Leave(uint64_t epoch) {
  std::vector<Retired> ready;
  {
    MutexLock lock(&mu_);
    auto it = readers_.find(epoch);
    if (--it->second == 0) readers_.erase(it);
    ready = TakeReady();
  }
  ReleaseAll(ready);
}

void ReclaimGate::Retire(std::vector<PhysicalExtent> extents, uint64_t commit) {
  if (extents.empty()) return;
  std::vector<Retired> ready;
  {
    MutexLock lock(&mu_);
    // Readers that entered up to now may hold the old mapping: tag with the
    // current epoch and start a new one for later readers.
    retired_.emplace(epoch_, Retired{std::move(extents), commit});
    ++epoch_;
    ready = TakeReady();
  }
  ReleaseAll(ready);
}

std::vector<ReclaimGate::Retired> ReclaimGate::TakeReady() {
  uint64_t oldest_reader = readers_.empty() ? UINT64_MAX : readers_.begin()->first;
  std::vector<Retired> ready;
  for (auto it = retired_.begin(); it != retired_.end() && it->first < oldest_reader;) {
    ready.push_back(std::move(it->second));
    it = retired_.erase(it);
  }
  return ready;
}

void ReclaimGate::ReleaseAll(const std::vector<Retired>& ready) {
  for (const Retired& r : ready) release_(r.extents, r.commit);
}

}  // namespace spillfs
