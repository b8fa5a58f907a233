// Volume: the on-disk pair of an index (VOLUME/index/, RocksDB) and a data
// area (VOLUME/data.img, or a block device named at mkfs), tied together by a
// superblock kept in both. Opening a volume takes an exclusive lock on
// VOLUME/lock, so a volume is mounted (or inspected) by one process at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "spillfs/common/status.h"
#include "spillfs/kvindex/index.h"
#include "spillfs/store/block_store.h"

namespace spillfs {

class Volume {
 public:
  static constexpr uint64_t kBlockSize = 4096;
  static constexpr uint64_t kDataOffset = 1 << 20;  // block 0 holds the superblock
  static constexpr uint64_t kMinimumSize = 16 << 20;

  struct CreateOptions {
    uint64_t size = 0;   // 0 with a device: the whole device
    std::string device;  // block device (or file) to hold the data; empty: VOLUME/data.img
    bool force = false;  // replace an existing (unmounted) volume
    bool checksums = true;
    bool dedup = true;
  };
  // What a test puts around the volume's parts when it is opened read-write,
  // as RocksDB's tests put FaultInjectionTestFS around a FileSystem: the
  // power-cut simulation's journals (testing/include/spillfs/testing/powercut.h),
  // handed in by the test-only daemon spillfs-faulty. The product sets none.
  struct Wrappers {
    // Takes the opened data area and returns what the volume uses instead.
    std::function<Result<std::unique_ptr<BlockStore>>(std::unique_ptr<BlockStore>)> data_area = nullptr;
    // The file system RocksDB opens the index at `index_dir` through
    // (Index::Options::file_system).
    std::function<Result<std::shared_ptr<rocksdb::FileSystem>>(const std::string& index_dir)> index_file_system =
        nullptr;
  };
  struct OpenOptions {
    bool read_only = false;  // inspection: no writes, index opened read-only
    // A lock on this volume that the caller took (LockVolume) and hands over,
    // so that nobody can take the volume between a check and the open
    // (spillfs mount waits for the lock, then forks the daemon). -1: Open
    // takes the lock itself. The volume owns it from the call on, failed
    // or not.
    int lock_fd = -1;
    Wrappers wrappers = {};  // ignored when read_only
  };

  ~Volume();
  Volume(const Volume&) = delete;
  Volume& operator=(const Volume&) = delete;

  // mkfs: lays out a new volume in directory `dir` (created if missing).
  static Result<Superblock> Create(const std::string& dir, const CreateOptions& options);
  // Locks, opens and cross-checks index and data area.
  static Result<std::unique_ptr<Volume>> Open(const std::string& dir, const OpenOptions& options);
  // True when `dir` holds a spillfs index.
  static bool Exists(const std::string& dir);

  static std::string IndexPath(const std::string& dir) { return dir + "/index"; }
  static std::string ImagePath(const std::string& dir) { return dir + "/data.img"; }
  static std::string LockPath(const std::string& dir) { return dir + "/lock"; }

  Index& index() { return *index_; }
  BlockStore& store() { return *store_; }
  const Superblock& superblock() const { return superblock_; }
  const std::string& dir() const { return dir_; }

 private:
  Volume() = default;

  std::string dir_;
  int lock_fd_ = -1;
  Superblock superblock_;
  std::unique_ptr<Index> index_;
  std::unique_ptr<BlockStore> store_;
};

// Takes the exclusive volume lock (flock, so a forked child shares it) and
// writes this process's pid into the lock file; the error names the holder's
// pid.
Result<int> LockVolume(const std::string& dir);

}  // namespace spillfs
