// Filesystem: opening and recovery, inode bookkeeping, open files and sync.
// The namespace operations are in namespace_ops.cc; the data operations in
// file_data.cc (read, write) and file_space.cc (truncate, fallocate, seek);
// extended attributes in xattr.cc; the RAM tier in ram_tier_io.cc (reads and
// writes it serves) and flush_commit.cc (the commit of a batch the cache's
// flusher wrote: FlushCommitter).
#include "spillfs/core/filesystem.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include "inode_rules.h"
#include "spillfs/common/clock.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {
namespace {

// Freed space waits at most about this long for an index sync (CommitTxn).
constexpr std::chrono::seconds kParkedSyncInterval{5};

struct timespec ToTimespec(int64_t ns) {
  struct timespec ts;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  if (ts.tv_nsec < 0) {
    ts.tv_nsec += 1000000000;
    --ts.tv_sec;
  }
  return ts;
}

}  // namespace

uint64_t FilesystemOptions::DefaultRamTierBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  uint64_t ram = pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
  return std::min<uint64_t>(ram / 4, 8ull << 30);
}

Filesystem::Filesystem(std::unique_ptr<Volume> volume, const FilesystemOptions& options)
    : volume_(std::move(volume)),
      index_(volume_->index()),
      store_(volume_->store()),
      block_size_(volume_->superblock().block_size),
      checksums_(volume_->superblock().checksums),
      options_(options),
      block_sums_([this](const char* data, uint64_t length) { return Checksums(data, length); }),
      deduper_(index_, block_sums_),
      allocator_(block_size_),
      gate_(
          [this](const std::vector<PhysicalExtent>& extents, uint64_t commit) { allocator_.Release(extents, commit); }),
      ram_tier_(options.ram_tier_bytes, block_size_, options.ram_tier_slab_fault),
      read_ahead_(ReadAhead::Options::ForBytesAhead(options.read_ahead_bytes, options.read_request_bytes),
                  [this](InodeNumber ino, uint64_t offset, uint64_t length, char* out) {
                    return FetchAhead(ino, offset, length, out);
                  }),
      flusher_(&ram_tier_, &deduper_, &store_, &allocator_, &locks_, block_sums_, block_size_, this,
               RamTierFlusher::Options{options.flush_batch_bytes, options.flush_age_ms,
                                       volume_->superblock().dedup && options.dedup}) {
  dedup_ = volume_->superblock().dedup && options.dedup;
  // Freed space is parked until the batch that freed it is durable
  // (allocator.h): every index sync, wherever it comes from, releases it.
  index_.SetDurableListener([this](uint64_t commit) { allocator_.Durable(commit); });
  // A reservation that only parked space could satisfy: make the index
  // durable the way fsync does (data first, so what becomes durable keeps
  // the data-before-metadata order) instead of failing with ENOSPC.
  allocator_.SetShortageHandler([this] { return SyncAll(); });
  parked_sync_ = std::make_unique<BackgroundSync>([this] { return SyncAll(); });
}

Filesystem::~Filesystem() {
  flusher_.Stop();
  Status s = FlushAll();
  if (s.ok()) s = SettleAll();  // the flag must not outlive a clean stop
  if (s.ok()) s = SyncAll();
  if (s.ok() && opened_) {
    // A clean stop: ephemeral files were flushed and survive the next mount.
    // Not after a failed Open: its recovery may not have run to the end.
    Index::Batch batch(index_);
    batch.Put(Family::kMeta, keys::kCleanUnmount, "1");
    s = index_.Commit(&batch, /*sync=*/true);
  }
  if (!s.ok()) fmt::print(stderr, "spillfs: final flush failed: {}\n", s.ToString());
  parked_sync_.reset();                // nothing commits any more
  index_.SetDurableListener(nullptr);  // the index outlives allocator_
}

Result<std::unique_ptr<Filesystem>> Filesystem::Open(std::unique_ptr<Volume> volume, const FilesystemOptions& options) {
  std::unique_ptr<Filesystem> fs(new Filesystem(std::move(volume), options));
  SPILLFS_RETURN_IF_ERROR(fs->allocator_.Load(fs->index_));
  SPILLFS_ASSIGN_OR_RETURN(InodeNumber next_ino, fs->index_.GetMetaU64(keys::kNextIno));
  {
    MutexLock lock(&fs->mu_);
    fs->next_ino_ = next_ino;
  }
  SPILLFS_RETURN_IF_ERROR(fs->Recover());
  if (options.ram_tier_bytes > 0) {
    fs->ram_tier_.WarmUp(options.ram_tier_warm_bytes);
    fs->flusher_.Start();
  }
  fs->opened_ = true;
  return fs;
}

// Reclaims inodes that were unlinked while open when the daemon stopped and,
// unless the last stop was clean, every ephemeral file.
Status Filesystem::Recover() {
  std::string clean;
  Status was_clean = index_.Get(Family::kMeta, keys::kCleanUnmount, &clean);
  if (!was_clean.ok() && !was_clean.IsNotFound()) return was_clean;
  if (was_clean.ok()) {
    Index::Batch batch(index_);
    batch.Delete(Family::kMeta, keys::kCleanUnmount);
    SPILLFS_RETURN_IF_ERROR(index_.Commit(&batch, /*sync=*/true));
  } else {
    SPILLFS_RETURN_IF_ERROR(ReclaimEphemeral());
  }
  std::vector<InodeNumber> orphans;
  auto cursor = index_.NewCursor(Family::kOrphan, "");
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (cursor->key().size() != 8) return Status::Corruption("malformed orphan key");
    orphans.push_back(keys::DecodeIno(cursor->key()));
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  MutexLock lock(&mu_);
  for (InodeNumber ino : orphans) {
    Txn txn(index_);
    auto record = index_.GetInode(ino);
    if (record.ok()) {
      SPILLFS_RETURN_IF_ERROR(UnmapRange(&txn, ino, 0, UINT64_MAX, nullptr));
      DeleteInode(&txn, ino, *record);
    } else {
      txn.batch.Delete(Family::kOrphan, keys::Ino(ino));
    }
    SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  }
  return Status::OK();
}

// After a crash: ephemeral regular files promise nothing, so they go, with
// their directory entries.
Status Filesystem::ReclaimEphemeral() {
  std::unordered_map<InodeNumber, InodeRecord> doomed;
  auto inodes = index_.NewCursor(Family::kInode, "");
  for (inodes->Seek(""); inodes->Valid(); inodes->Next()) {
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, InodeRecord::Decode(inodes->value()));
    if ((record.flags & (kInodeEphemeral | kInodeUnsettled)) && S_ISREG(record.mode))
      doomed.emplace(keys::DecodeIno(inodes->key()), record);
  }
  SPILLFS_RETURN_IF_ERROR(inodes->status());
  if (doomed.empty()) return Status::OK();
  MutexLock lock(&mu_);
  Txn txn(index_);
  auto dirents = index_.NewCursor(Family::kDirent, "");
  for (dirents->Seek(""); dirents->Valid(); dirents->Next()) {
    SPILLFS_ASSIGN_OR_RETURN(DirentRecord dirent, DirentRecord::Decode(dirents->value()));
    if (doomed.count(dirent.ino)) txn.batch.Delete(Family::kDirent, dirents->key());
  }
  SPILLFS_RETURN_IF_ERROR(dirents->status());
  for (auto& [ino, record] : doomed) {
    SPILLFS_RETURN_IF_ERROR(UnmapRange(&txn, ino, 0, UINT64_MAX, nullptr));
    DeleteInode(&txn, ino, record);
  }
  size_t unsettled = 0;
  for (const auto& [ino, record] : doomed) unsettled += (record.flags & kInodeUnsettled) != 0;
  fmt::print(stderr,
             "spillfs: reclaimed {} ephemeral files and {} files created since the last sync whose data was not "
             "durable, after an unclean stop\n",
             doomed.size() - unsettled, unsettled);
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  return index_.Sync();
}

// ---- index helpers ----

Result<InodeRecord> Filesystem::LoadInode(InodeNumber ino) {
  uint64_t seq;
  {
    MutexLock lock(&records_mu_);
    if (auto it = records_.find(ino); it != records_.end()) return it->second;
    seq = records_seq_;
  }
  auto record = index_.GetInode(ino);
  if (!record.ok() && record.status().IsNotFound()) return Status::Error(ENOENT, fmt::format("no inode {}", ino));
  if (record.ok()) {
    if (test_after_record_miss_) test_after_record_miss_(ino);
    MutexLock lock(&records_mu_);
    if (records_seq_ == seq) {
      if (records_.size() >= kRecordCacheEntries) records_.clear();
      records_.emplace(ino, *record);
    }
  }
  return record;
}

void Filesystem::ApplyToRecordCache(const Txn& txn, bool committed) {
  if (txn.inodes.empty()) return;
  MutexLock lock(&records_mu_);
  ++records_seq_;
  for (const auto& [ino, record] : txn.inodes) {
    if (committed && record) {
      if (records_.size() >= kRecordCacheEntries) records_.clear();
      records_.insert_or_assign(ino, *record);
    } else {
      records_.erase(ino);
    }
  }
}

Result<InodeRecord> Filesystem::LoadDir(InodeNumber ino) {
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!IsDir(record)) return Status::Error(ENOTDIR, fmt::format("inode {} is not a directory", ino));
  return record;
}

void Filesystem::PutInode(Txn* txn, InodeNumber ino, const InodeRecord& record) {
  txn->batch.Put(Family::kInode, keys::Ino(ino), record.Encode());
  txn->inodes.emplace_back(ino, record);
}

Result<DirentRecord> Filesystem::FindDirent(InodeNumber parent, std::string_view name) {
  auto dirent = index_.GetDirent(parent, name);
  if (!dirent.ok() && dirent.status().IsNotFound()) {
    return Status::Error(ENOENT, fmt::format("no entry {} in directory {}", name, parent));
  }
  return dirent;
}

Result<bool> Filesystem::DirIsEmpty(InodeNumber ino) {
  auto cursor = index_.NewCursor(Family::kDirent, keys::Ino(ino));
  cursor->Seek(keys::Ino(ino));
  bool empty = !cursor->Valid();
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  return empty;
}

Status Filesystem::CommitTxn(Txn* txn) {
  bool blobs_changed = false;
  SPILLFS_RETURN_IF_ERROR(deduper_.ApplyBlobRefs(txn->blob_refs, txn->new_blobs, txn->current_blobs, &txn->batch,
                                                 &txn->freed, &blobs_changed));
  allocator_.CommitFreed(txn->freed, &txn->batch);
  Status committed = index_.Commit(&txn->batch);
  ApplyToRecordCache(*txn, committed.ok());
  SPILLFS_RETURN_IF_ERROR(committed);
  // After the commit: a look-up that saw the old epoch may have seen the
  // blobs as they were (DirectDedup checks them again); one that sees the
  // new epoch sees this batch.
  if (blobs_changed) blob_epoch_.fetch_add(1, std::memory_order_release);
  // The freed space stays unused until readers are done with it and this
  // batch is durable (reclaim_gate.h, allocator.h).
  gate_.Retire(std::move(txn->freed), txn->batch.commit_number());
  // A workload that never fsyncs still gets its freed space back on time, as
  // ext4 commits its journal every 5 s: the shortage handler would do it when
  // space runs out, this keeps the parked set small before that. In the
  // background (mu_ is held here); a failed sync is
  // asked for again by a later commit.
  if (allocator_.parked_for() > kParkedSyncInterval) parked_sync_->Request();
  return Status::OK();
}

void Filesystem::CountLookup(InodeNumber ino) { ++inodes_[ino].lookups; }

Entry Filesystem::MakeEntry(InodeNumber ino, const InodeRecord& record) const {
  return MakeEntry(ino, record, S_ISREG(record.mode) ? ram_tier_.GetOverlay(ino) : std::nullopt);
}

Entry Filesystem::MakeEntry(InodeNumber ino, const InodeRecord& r,
                            const std::optional<RamTier::Overlay>& overlay) const {
  Entry entry;
  entry.ino = ino;
  entry.generation = r.generation;
  struct stat& st = entry.attr;
  st.st_ino = ino;
  st.st_mode = r.mode;
  st.st_nlink = r.nlink;
  st.st_uid = r.uid;
  st.st_gid = r.gid;
  st.st_rdev = r.rdev;
  st.st_size = static_cast<off_t>(IsDir(r) ? block_size_ : r.size);
  st.st_blksize = static_cast<blksize_t>(block_size_);
  st.st_blocks = static_cast<blkcnt_t>(IsDir(r) ? block_size_ / 512 : r.allocated_bytes / 512);
  st.st_atim = ToTimespec(r.atime_ns);
  st.st_mtim = ToTimespec(r.mtime_ns);
  st.st_ctim = ToTimespec(r.ctime_ns);
  if (overlay) ApplyOverlay(*overlay, &entry);
  return entry;
}

Status Filesystem::DropLink(Txn* txn, InodeNumber ino, InodeRecord* record) {
  record->nlink = IsDir(*record) ? 0 : record->nlink - 1;
  record->ctime_ns = NowNs();
  if (record->nlink > 0) {
    PutInode(txn, ino, *record);
    return Status::OK();
  }
  auto it = inodes_.find(ino);
  if (it != inodes_.end() && it->second.opens > 0) {
    PutInode(txn, ino, *record);
    txn->batch.Put(Family::kOrphan, keys::Ino(ino), "");
    return Status::OK();
  }
  SPILLFS_RETURN_IF_ERROR(UnmapRange(txn, ino, 0, UINT64_MAX, nullptr));
  DeleteInode(txn, ino, *record);
  return Status::OK();
}

// Deletes the inode record, its xattrs and its orphan mark. The caller has
// unmapped its data.
void Filesystem::DeleteInode(Txn* txn, InodeNumber ino, const InodeRecord& record) {
  read_ahead_.Forget(ino);
  auto cursor = index_.NewCursor(Family::kXattr, keys::Ino(ino));
  for (cursor->Seek(keys::Ino(ino)); cursor->Valid(); cursor->Next()) {
    txn->batch.Delete(Family::kXattr, cursor->key());
  }
  txn->batch.Delete(Family::kInode, keys::Ino(ino));
  txn->inodes.emplace_back(ino, std::nullopt);
  txn->batch.Delete(Family::kOrphan, keys::Ino(ino));
  allocator_.ReleaseHold(ram_tier_.Remove(ino, /*cancelled=*/true));  // unflushed data never reaches the SSD
  MutexLock unsettled_lock(&unsettled_mu_);
  unsettled_.erase(ino);
}

Result<Entry> Filesystem::CreateInode(InodeNumber parent, std::string_view name, InodeRecord record) {
  SPILLFS_RETURN_IF_ERROR(CheckName(name));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord dir, LoadDir(parent));
  if (dir.nlink == 0) return Status::Error(ENOENT, "directory was removed");
  if (index_.GetDirent(parent, name).ok()) return Status::Error(EEXIST, fmt::format("{} exists", name));
  if (IsDir(record) && dir.nlink >= kLinkMax) return Status::Error(EMLINK, "too many subdirectories");
  int64_t now = NowNs();
  record.atime_ns = record.mtime_ns = record.ctime_ns = record.btime_ns = now;
  record.generation = 1;
  record.flags |= dir.flags & kInodeEphemeral;  // inherited
  // A new file is unsettled until its data is durable: its close need not
  // wait for the SSD (kInodeUnsettled). Ephemeral files promise less already.
  const bool unsettled = S_ISREG(record.mode) && !(record.flags & kInodeEphemeral);
  if (unsettled) record.flags |= kInodeUnsettled;
  if (dir.mode & S_ISGID) {
    record.gid = dir.gid;
    if (IsDir(record)) record.mode |= S_ISGID;
  }
  if (IsDir(record)) {
    record.parent = parent;
    ++dir.nlink;
  }
  Touch(&dir, true, now);
  InodeNumber ino = next_ino_;
  Txn txn(index_);
  PutInode(&txn, ino, record);
  PutInode(&txn, parent, dir);
  txn.batch.Put(Family::kDirent, keys::Dirent(parent, name), DirentRecord{ino, record.mode & S_IFMT}.Encode());
  txn.batch.Put(Family::kMeta, keys::kNextIno, EncodeMetaU64(ino + 1));
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  ++next_ino_;
  if (unsettled) {
    MutexLock unsettled_lock(&unsettled_mu_);
    unsettled_.insert(ino);
  }
  CountLookup(ino);
  return MakeEntry(ino, record);
}

// ---- open files ----

Status Filesystem::Open(InodeNumber ino) {
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  ++inodes_[ino].opens;
  return Status::OK();
}

Status Filesystem::Release(InodeNumber ino) {
  MutexLock lock(&mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end() || it->second.opens == 0) return Status::OK();
  if (--it->second.opens > 0) return Status::OK();
  if (it->second.lookups == 0) inodes_.erase(it);
  auto record = index_.GetInode(ino);
  if (!record.ok() || record->nlink > 0) return Status::OK();
  Txn txn(index_);  // last close of an unlinked inode: reclaim it
  SPILLFS_RETURN_IF_ERROR(UnmapRange(&txn, ino, 0, UINT64_MAX, nullptr));
  DeleteInode(&txn, ino, *record);
  return CommitTxn(&txn);
}

Status Filesystem::SyncAll() {
  SPILLFS_RETURN_IF_ERROR(store_.Flush());
  return index_.Sync();
}

Status Filesystem::FlushBeforeMapping(const InodeRecord& record) {
  if (record.flags & kInodeEphemeral) return Status::OK();
  return store_.Flush();
}

Status Filesystem::FlushBeforeMapping(InodeNumber ino) {
  auto record = LoadInode(ino);
  if (!record.ok()) return record.status().code() == ENOENT ? Status::OK() : record.status();  // nothing to map
  return FlushBeforeMapping(*record);
}

Status Filesystem::Fsync(InodeNumber ino, bool datasync) {
  SPILLFS_RETURN_IF_ERROR(flusher_.FlushFile(ino));
  SPILLFS_RETURN_IF_ERROR(SettleAll());
  return SyncAll();
}

}  // namespace spillfs
