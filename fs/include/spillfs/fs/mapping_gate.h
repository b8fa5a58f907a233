// MappingGate: keeps commits that map freshly written data out of the index
// while an fsync makes the data area and then the index durable.
//
// Why: crash order rule 2 (DESIGN.md) says a mapping becomes durable only
// after its data is flushed. Filesystem::SyncAll flushes the data area
// (fdatasync) and then syncs the index's WAL. A mapping committed between the
// two would be made durable by the WAL sync although its data was written
// after the fdatasync began, so a power cut could leave it pointing at bytes
// that never reached the media (and its old blocks freed). With the default
// image file one device flush covers both and this is benign; with the data
// on its own device (mkfs --device) it is not.
//
// What it does not cover, in device mode: the kernel may write the WAL file
// back before any sync, and RocksDB syncs a closed WAL before a memtable
// flush (Index::SetSealListener flushes the data area at the seal, but a
// flush of another family may sync that WAL while that runs). Either can make
// a mapping durable before its data; tests/RELIABILITY.md, "Still open".
//
// Commits hold the gate shared (many at once), taken before Filesystem::mu_;
// SyncAll holds it exclusive. It prefers the exclusive side, so a steady
// stream of commits cannot starve an fsync; therefore a thread must never
// take it shared twice.
#pragma once

#include <pthread.h>

#include <cstdlib>

namespace spillfs {

class MappingGate {
 public:
  MappingGate() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attr);  // glibc's cannot fail: it allocates nothing
    pthread_rwlockattr_destroy(&attr);
  }
  ~MappingGate() { pthread_rwlock_destroy(&lock_); }
  MappingGate(const MappingGate&) = delete;
  MappingGate& operator=(const MappingGate&) = delete;

  // Shared: one mapping commit (std::shared_lock).
  void lock_shared() { Check(pthread_rwlock_rdlock(&lock_)); }
  void unlock_shared() { Check(pthread_rwlock_unlock(&lock_)); }
  // Exclusive: SyncAll (std::unique_lock).
  void lock() { Check(pthread_rwlock_wrlock(&lock_)); }
  void unlock() { Check(pthread_rwlock_unlock(&lock_)); }

 private:
  // A failure here is a locking bug (EDEADLK: this thread holds the gate
  // already), and going on would unlock someone else's hold: stop.
  static void Check(int rc) {
    if (rc != 0) std::abort();
  }

  pthread_rwlock_t lock_;
};

}  // namespace spillfs
