// ReclaimGate: holds freed space back until no reader can still read it.
//
// A reader looks up a mapping, then reads the physical blocks without locks.
// If a concurrent overwrite frees those blocks and another write reuses them,
// the reader would see another file's bytes. So readers enter the gate before
// looking up a mapping and leave after their I/O; space freed while a reader
// is inside is released only once every reader that entered before the free
// has left (an epoch scheme: no starvation under a steady stream of readers).
//
// Space is retired with the commit number of the index batch that freed it
// (Index::Batch::commit_number) and released with it: the allocator keeps it
// back further until that batch is durable (allocator.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "spillfs/common/mutex.h"
#include "spillfs/store/block_store.h"

namespace spillfs {

class ReclaimGate {
 public:
  // Called once per Retire(), with its extents and commit number.
  using ReleaseWithCommitFn = std::function<void(const std::vector<PhysicalExtent>&, uint64_t commit)>;
  // The same for callers that have no use for commit numbers.
  using ReleaseFn = std::function<void(const std::vector<PhysicalExtent>&)>;
  explicit ReclaimGate(ReleaseWithCommitFn release) : release_(std::move(release)) {}
  explicit ReclaimGate(ReleaseFn release)
      : release_([release = std::move(release)](const std::vector<PhysicalExtent>& extents, uint64_t) {
          release(extents);
        }) {}

  // RAII reader registration.
  class Reader {
   public:
    explicit Reader(ReclaimGate* gate) : gate_(gate), epoch_(gate->Enter()) {}
    ~Reader() { gate_->Leave(epoch_); }
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

   private:
    ReclaimGate* gate_;
    uint64_t epoch_;
  };

  // Space freed by committed batch number `commit` (0: a batch already
  // durable, or none): released now if no reader is inside, else once the
  // readers present now have left.
  void Retire(std::vector<PhysicalExtent> extents, uint64_t commit = 0) EXCLUDES(mu_);

 private:
  struct Retired {
    std::vector<PhysicalExtent> extents;
    uint64_t commit;
  };

  uint64_t Enter() EXCLUDES(mu_);
  void Leave(uint64_t epoch) EXCLUDES(mu_);
  // Takes out what was retired in an epoch older than every reader inside,
  // for release_ once mu_ is let go.
  std::vector<Retired> TakeReady() REQUIRES(mu_);
  void ReleaseAll(const std::vector<Retired>& ready) EXCLUDES(mu_);

  ReleaseWithCommitFn release_;  // called without mu_ (it takes the allocator's lock)
  // A leaf in the lock order (core/filesystem.h): nothing is taken under it.
  Mutex mu_;
  uint64_t epoch_ GUARDED_BY(mu_) = 1;
  std::map<uint64_t, uint64_t> readers_ GUARDED_BY(mu_);      // epoch -> readers that entered in it
  std::multimap<uint64_t, Retired> retired_ GUARDED_BY(mu_);  // epoch of retirement -> space
};

}  // namespace spillfs
