#include "spillfs/kvindex/index.h"

#include <fmt/format.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>

#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {
namespace {

constexpr const char* kFamilyNames[] = {"inode", "dirent", "extent", "free", "orphan", "xattr", "blob", "meta"};
static_assert(std::size(kFamilyNames) == static_cast<size_t>(Family::kCount));

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  if (s.IsNotFound()) return Status::NotFound(what);
  if (s.IsCorruption()) return Status::Corruption(what + ": " + s.ToString());
  if (s.IsNoSpace()) return Status::NoSpace(what + ": " + s.ToString());
  return Status::IOError(what + ": " + s.ToString());
}

// Smallest string greater than every string starting with `prefix`; empty
// when there is none (prefix of all 0xff, or empty prefix).
std::string PrefixSuccessor(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last != 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return prefix;
}

rocksdb::Options DatabaseOptions(bool create) {
  rocksdb::Options options;
  options.create_if_missing = create;
  options.error_if_exists = create;
  options.create_missing_column_families = create;
  options.max_background_jobs = 2;
  options.max_open_files = 512;
  options.keep_log_file_num = 4;
  // After a power cut the WAL may end in a torn record, and everything past
  // the last sync may be gone. Point-in-time recovery replays the WAL up to
  // the first record it cannot read and stops there: the index comes back as
  // it was after some batch, never with a later batch applied over a lost
  // earlier one (kSkipAnyCorruptedRecords could do that: a batch that frees
  // space applied without the one that mapped its replacement), and it opens
  // (kAbsoluteConsistency would refuse a torn tail). It is RocksDB's default;
  // set here because spillfs depends on it. RocksDB turns WAL recycling off
  // under this mode (recycled logs could leave a hole in the recovered data),
  // so recycle_log_file_num is not set.
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  return options;
}

// One block cache for all families of an index. RocksDB's default (8 MiB in
// 16 shards of 512 KiB) could not keep the extent records of files written
// through the direct path: a 256 MiB commit is one record of 256 KiB of
// checksums, so every 4 KiB read through the mount read that block from the
// SST file again and verified its checksum (measured: most of the daemon's
// time, a quarter of the IOPS of a file written through the mount).
constexpr size_t kBlockCacheBytes = 64u << 20;
constexpr int kBlockCacheShardBits = 4;  // 16 shards of 4 MiB

rocksdb::ColumnFamilyOptions FamilyOptions(const std::shared_ptr<rocksdb::Cache>& block_cache) {
  rocksdb::ColumnFamilyOptions options;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = block_cache;
  table.cache_index_and_filter_blocks = true;
  // Point look-ups of keys that are absent, or in another file, skip a
  // file's blocks (the dedup look-ups of a save: one a unit, most of them in
  // files, the changed units absent). 10 bits a key: ~1% false positives.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  options.write_buffer_size = 16 << 20;
  return options;
}

}  // namespace

const char* FamilyName(Family family) { return kFamilyNames[static_cast<int>(family)]; }

std::string EncodeMetaU64(uint64_t value) {
  std::string out;
  coding::PutFixed64BE(&out, value);
  return out;
}

// ---- Batch ----

Index::Batch::Batch(const Index& index, size_t reserve_bytes)
    : index_(&index), batch_(new rocksdb::WriteBatch(reserve_bytes)) {}
Index::Batch::~Batch() = default;
Index::Batch::Batch(Batch&&) noexcept = default;
Index::Batch& Index::Batch::operator=(Batch&&) noexcept = default;

void Index::Batch::Put(Family family, std::string_view key, std::string_view value) {
  batch_->Put(index_->Handle(family), rocksdb::Slice(key.data(), key.size()),
              rocksdb::Slice(value.data(), value.size()));
}

void Index::Batch::Delete(Family family, std::string_view key) {
  batch_->Delete(index_->Handle(family), rocksdb::Slice(key.data(), key.size()));
}

size_t Index::Batch::Count() const { return batch_->Count(); }

// ---- Cursor ----

Index::Cursor::Cursor(std::unique_ptr<rocksdb::Iterator> it, std::string prefix, std::string upper)
    : it_(std::move(it)), prefix_(std::move(prefix)), upper_(std::move(upper)) {}
Index::Cursor::~Cursor() { it_.reset(); }

bool Index::Cursor::InPrefix() const {
  rocksdb::Slice key = it_->key();
  return key.size() >= prefix_.size() && std::memcmp(key.data(), prefix_.data(), prefix_.size()) == 0;
}

bool Index::Cursor::Valid() const { return it_->Valid() && InPrefix(); }
void Index::Cursor::Next() { it_->Next(); }
void Index::Cursor::Prev() { it_->Prev(); }
std::string_view Index::Cursor::key() const { return {it_->key().data(), it_->key().size()}; }
std::string_view Index::Cursor::value() const { return {it_->value().data(), it_->value().size()}; }
Status Index::Cursor::status() const { return FromRocks(it_->status(), "index scan"); }

void Index::Cursor::Seek(std::string_view target) {
  it_->Seek(target < std::string_view(prefix_) ? rocksdb::Slice(prefix_)
                                               : rocksdb::Slice(target.data(), target.size()));
}

void Index::Cursor::SeekForPrev(std::string_view target) {
  it_->SeekForPrev(rocksdb::Slice(target.data(), target.size()));
}

// ---- Index ----

Index::~Index() {
  if (db_) {
    for (auto* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
    (void)db_->Close();
  }
}

Result<std::unique_ptr<Index>> Index::Open(const std::string& path, const Options& options) {
  std::error_code ec;
  bool exists = std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec);
  if (options.create && exists) return Status::Error(EEXIST, fmt::format("index already exists at {}", path));
  if (!options.create && !exists) return Status::NotFound(fmt::format("no spillfs index at {}", path));

  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  const std::shared_ptr<rocksdb::Cache> block_cache = rocksdb::NewLRUCache(kBlockCacheBytes, kBlockCacheShardBits);
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, FamilyOptions(block_cache));
  for (const char* name : kFamilyNames) families.emplace_back(name, FamilyOptions(block_cache));

  std::unique_ptr<Index> index(new Index());
  index->read_only_ = options.read_only;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s;
  rocksdb::Options db_options = DatabaseOptions(options.create && !options.read_only);
  if (options.file_system) {
    index->env_ = rocksdb::NewCompositeEnv(options.file_system);
    db_options.env = index->env_.get();
  }
  if (options.read_only) {
    s = rocksdb::DB::OpenForReadOnly(db_options, path, families, &handles, &db);
  } else {
    s = rocksdb::DB::Open(db_options, path, families, &handles, &db);
  }
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return Status::Error(EBUSY, fmt::format("index {} is in use by another process", path));
    }
    return FromRocks(s, fmt::format("cannot open index {}", path));
  }
  index->db_.reset(db);
  // handles[0] is the default family, unused; keep ours in Family order.
  db->DestroyColumnFamilyHandle(handles[0]);
  index->handles_.assign(handles.begin() + 1, handles.end());
  return index;
}

rocksdb::ColumnFamilyHandle* Index::Handle(Family family) const { return handles_[static_cast<int>(family)]; }

Status Index::Get(Family family, std::string_view key, std::string* value) const {
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), Handle(family), rocksdb::Slice(key.data(), key.size()), value);
  return FromRocks(s, fmt::format("{} key not found", FamilyName(family)));
}

Status Index::MultiGet(Family family, const std::vector<std::string>& keys,
                       std::vector<std::optional<std::string>>* values) const {
  const size_t n = keys.size();
  values->assign(n, std::nullopt);
  if (n == 0) return Status::OK();
  std::vector<rocksdb::Slice> slices;
  slices.reserve(n);
  for (const std::string& key : keys) slices.emplace_back(key.data(), key.size());
  std::vector<rocksdb::PinnableSlice> found(n);
  std::vector<rocksdb::Status> statuses(n);
  db_->MultiGet(rocksdb::ReadOptions(), Handle(family), n, slices.data(), found.data(), statuses.data());
  for (size_t i = 0; i < n; ++i) {
    if (statuses[i].IsNotFound()) continue;
    SPILLFS_RETURN_IF_ERROR(FromRocks(statuses[i], fmt::format("{} multi-get", FamilyName(family))));
    (*values)[i].emplace(found[i].data(), found[i].size());
  }
  return Status::OK();
}

Status Index::Commit(Batch* batch, bool sync) {
  if (read_only_) return Status::Error(EROFS, "index is open read-only");
  rocksdb::WriteOptions options;
  options.sync = sync;
  // Every batch numbered up to `before` was in the WAL before this write.
  uint64_t before = last_commit_.load();
  SPILLFS_RETURN_IF_ERROR(FromRocks(db_->Write(options, batch->batch_.get()), "index commit"));
  uint64_t expected = before;
  if (last_commit_.compare_exchange_strong(expected, before + 1)) {
    batch->commit_number_ = before + 1;
    if (sync) NoteDurable(before + 1);  // nothing committed in between: all durable
  } else {
    batch->commit_number_ = last_commit_.fetch_add(1) + 1;
    if (sync) NoteDurable(before);  // batches numbered in between may follow this one in the WAL
  }
  return Status::OK();
}

Status Index::Sync() {
  if (read_only_) return Status::OK();
  uint64_t covered = last_commit_.load();  // committed, so in the WAL, before the sync starts
  SPILLFS_RETURN_IF_ERROR(FromRocks(db_->SyncWAL(), "index sync"));
  NoteDurable(covered);
  return Status::OK();
}

void Index::NoteDurable(uint64_t commit) {
  uint64_t now = durable_commit_.load();
  while (now < commit && !durable_commit_.compare_exchange_weak(now, commit)) {
  }
  if (durable_listener_) durable_listener_(durable_commit_.load());
}

std::unique_ptr<Index::Cursor> Index::NewCursor(Family family, std::string_view prefix) const {
  std::string upper = PrefixSuccessor(std::string(prefix));
  std::unique_ptr<Cursor> cursor(new Cursor(nullptr, std::string(prefix), std::move(upper)));
  rocksdb::ReadOptions options;
  if (!cursor->upper_.empty()) {
    cursor->upper_slice_ = std::make_unique<rocksdb::Slice>(cursor->upper_);
    options.iterate_upper_bound = cursor->upper_slice_.get();
  }
  if (!cursor->prefix_.empty()) {
    cursor->lower_slice_ = std::make_unique<rocksdb::Slice>(cursor->prefix_);
    options.iterate_lower_bound = cursor->lower_slice_.get();
  }
  cursor->it_.reset(db_->NewIterator(options, Handle(family)));
  return cursor;
}

Result<InodeRecord> Index::GetInode(InodeNumber ino) const {
  std::string value;
  SPILLFS_RETURN_IF_ERROR(Get(Family::kInode, keys::Ino(ino), &value));
  return InodeRecord::Decode(value);
}

Result<DirentRecord> Index::GetDirent(InodeNumber parent, std::string_view name) const {
  std::string value;
  SPILLFS_RETURN_IF_ERROR(Get(Family::kDirent, keys::Dirent(parent, name), &value));
  return DirentRecord::Decode(value);
}

Result<Superblock> Index::GetSuperblock() const {
  std::string value;
  Status s = Get(Family::kMeta, keys::kSuperblock, &value);
  if (s.IsNotFound()) return Status::Corruption("index holds no superblock");
  SPILLFS_RETURN_IF_ERROR(s);
  return Superblock::Decode(value);
}

Result<uint64_t> Index::GetMetaU64(std::string_view name) const {
  std::string value;
  SPILLFS_RETURN_IF_ERROR(Get(Family::kMeta, name, &value));
  if (value.size() != 8) return Status::Corruption(fmt::format("meta {} is not 8 bytes", name));
  return coding::DecodeFixed64BE(value.data());
}

uint64_t Index::ApproximateSizeBytes() const {
  uint64_t total = 0, value = 0;
  for (auto* handle : handles_) {
    if (db_->GetIntProperty(handle, "rocksdb.total-sst-files-size", &value)) total += value;
  }
  return total;
}

}  // namespace spillfs
