// Index: the RocksDB database that holds all spillfs metadata.
//
// It knows column families, keys and records, and nothing of FUSE or of the
// data area. Every filesystem operation builds one Batch and commits it
// atomically; Commit(sync=false) is ordered but not yet durable, Sync() makes
// everything committed so far durable with one WAL flush (group commit).
//
// Commit numbers say which batches are durable: each successful Commit()
// numbers its batch (1, 2, ... in the order the commits return), and
// durable_commit() is the highest number known durable. Space that a batch
// frees must not be reused before that batch is durable (fs/allocator.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spillfs/common/status.h"
#include "spillfs/kvindex/records.h"

namespace rocksdb {
class DB;
class Env;
class FileSystem;
class ColumnFamilyHandle;
class WriteBatch;
class Iterator;
class Slice;
}  // namespace rocksdb

namespace spillfs {

enum class Family : int { kInode = 0, kDirent, kExtent, kFree, kOrphan, kXattr, kBlob, kMeta, kCount };

// Name of the column family, as stored in RocksDB and printed by tools.
const char* FamilyName(Family family);

class Index {
 public:
  struct Options {
    bool create = false;     // create a new, empty index; fail if one exists
    bool read_only = false;  // open without taking RocksDB's lock (inspection)
    // The file system RocksDB reaches the index's files through; null: the
    // local one. A seam for tests, as RocksDB's own Env is: the power-cut
    // simulation passes a wrapper that journals what is durable
    // (testing/include/spillfs/testing/powercut.h). The product leaves it null.
    std::shared_ptr<rocksdb::FileSystem> file_system = nullptr;
  };

  // A group of changes committed atomically.
  class Batch {
   public:
    // `reserve_bytes`: room taken at once for what the batch will hold (a
    // batch of megabytes grown by doubling copies itself and faults in fresh
    // pages each time).
    explicit Batch(const Index& index, size_t reserve_bytes = 0);
    ~Batch();
    Batch(Batch&&) noexcept;
    Batch& operator=(Batch&&) noexcept;

    void Put(Family family, std::string_view key, std::string_view value);
    void Delete(Family family, std::string_view key);
    size_t Count() const;
    // The number Index::Commit gave this batch; 0 until it is committed.
    uint64_t commit_number() const { return commit_number_; }

   private:
    friend class Index;
    const Index* index_;
    std::unique_ptr<rocksdb::WriteBatch> batch_;
    uint64_t commit_number_ = 0;
  };

  // Ordered walk over the keys of one family that start with a prefix.
  class Cursor {
   public:
    ~Cursor();
    bool Valid() const;
    void Next();
    void Prev();
    std::string_view key() const;
    std::string_view value() const;
    Status status() const;
    // Positions at the first key >= target (within the prefix).
    void Seek(std::string_view target);
    // Positions at the last key <= target (within the prefix).
    void SeekForPrev(std::string_view target);

   private:
    friend class Index;
    Cursor(std::unique_ptr<rocksdb::Iterator> it, std::string prefix, std::string upper);
    bool InPrefix() const;
    std::unique_ptr<rocksdb::Iterator> it_;
    std::string prefix_;
    std::string upper_;                            // bytes of the upper bound
    std::unique_ptr<rocksdb::Slice> upper_slice_;  // iterate_upper_bound; outlives it_
    std::unique_ptr<rocksdb::Slice> lower_slice_;  // iterate_lower_bound (prefix_); outlives it_
  };

  ~Index();
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  static Result<std::unique_ptr<Index>> Open(const std::string& path, const Options& options);

  // Returns NotFound (ENOENT) when the key is absent.
  Status Get(Family family, std::string_view key, std::string* value) const;
  // Looks `keys` of one family up at once (RocksDB's MultiGet: one pass over
  // the memtables and files for the lot, reads of one block shared).
  // (*values)[i] is keys[i]'s value, or nullopt where absent. An error other
  // than an absent key is returned (values then undefined).
  Status MultiGet(Family family, const std::vector<std::string>& keys,
                  std::vector<std::optional<std::string>>* values) const;
  // Numbers the batch (Batch::commit_number) once it is committed.
  Status Commit(Batch* batch, bool sync = false);
  // Makes every committed batch durable.
  Status Sync();

  // The number of the last commit, and the highest number known durable: a
  // Sync() makes every batch durable that was committed before it started; a
  // Commit(sync=true) the same, and its own batch. (A memtable flush may make
  // batches durable without either; they count only from the next sync.)
  uint64_t last_commit() const { return last_commit_.load(); }
  uint64_t durable_commit() const { return durable_commit_.load(); }
  // Called with the new durable_commit() after every Sync() and
  // Commit(sync=true) that succeeds, on the caller's thread, without any
  // Index lock held. Set it before the index is shared between threads.
  void SetDurableListener(std::function<void(uint64_t)> listener) { durable_listener_ = std::move(listener); }
  // A cursor over `family` limited to keys starting with `prefix` (may be
  // empty). RocksDB is told both bounds, so that a SeekForPrev that finds
  // nothing of the prefix stops at its start instead of stepping back over
  // every deleted key below it (an extent walk of a new file, after many
  // files were removed, spent its time there).
  std::unique_ptr<Cursor> NewCursor(Family family, std::string_view prefix) const;

  // Typed helpers over Get.
  Result<InodeRecord> GetInode(InodeNumber ino) const;
  Result<DirentRecord> GetDirent(InodeNumber parent, std::string_view name) const;
  Result<Superblock> GetSuperblock() const;
  Result<uint64_t> GetMetaU64(std::string_view name) const;

  // Approximate bytes RocksDB uses on disk (SST + WAL).
  uint64_t ApproximateSizeBytes() const;

 private:
  Index() = default;
  rocksdb::ColumnFamilyHandle* Handle(Family family) const;
  void NoteDurable(uint64_t commit);

  std::unique_ptr<rocksdb::Env> env_;  // over Options::file_system, or null; outlives db_
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  bool read_only_ = false;
  std::atomic<uint64_t> last_commit_{0};
  std::atomic<uint64_t> durable_commit_{0};
  std::function<void(uint64_t)> durable_listener_;
};

// Encodes a meta u64 value (fixed big-endian).
std::string EncodeMetaU64(uint64_t value);

}  // namespace spillfs
