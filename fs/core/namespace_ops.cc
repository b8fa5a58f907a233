// Filesystem: the namespace operations (lookup, create, link, unlink,
// rename, readdir, statfs). Each commits one index batch under mu_.
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inode_rules.h"
#include "spillfs/common/clock.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {

Result<Entry> Filesystem::Lookup(InodeNumber parent, std::string_view name) {
  SPILLFS_RETURN_IF_ERROR(CheckName(name));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord dir, LoadDir(parent));
  InodeNumber ino;
  if (name == ".") {
    ino = parent;
  } else if (name == "..") {
    ino = dir.parent;
  } else {
    SPILLFS_ASSIGN_OR_RETURN(DirentRecord dirent, FindDirent(parent, name));
    ino = dirent.ino;
  }
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  CountLookup(ino);
  return MakeEntry(ino, record);
}

void Filesystem::Forget(InodeNumber ino, uint64_t count) {
  MutexLock lock(&mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return;
  it->second.lookups -= std::min(count, it->second.lookups);
  if (it->second.lookups == 0 && it->second.opens == 0) inodes_.erase(it);
}

Result<Entry> Filesystem::GetAttr(InodeNumber ino) {
  // Without mu_ a flush may commit meanwhile: it commits the file's size and
  // then drops the overlay, so the overlay is taken first and the record
  // after. The other way round, a record loaded before that commit could be
  // shown without the overlay (getattr answered size 0 for a file just
  // written: stress_test). A commit between the two reads would count its
  // blocks twice (in the record and in the overlay): the overlay's commit
  // mark tells, and such a read is done again once the commit is over (it
  // holds mu_ throughout).
  for (;;) {
    std::optional<RamTier::Overlay> overlay = ram_tier_.GetOverlay(ino);
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
    if (!overlay || !S_ISREG(record.mode)) return MakeEntry(ino, record, std::nullopt);
    if (overlay->commit_mark.second % 2 == 0 && ram_tier_.CommitMark(ino) == overlay->commit_mark) {
      return MakeEntry(ino, record, overlay);
    }
    MutexLock wait_for_commit(&mu_);
  }
}

Result<Entry> Filesystem::MakeNode(InodeNumber parent, std::string_view name, uint32_t mode, uint64_t rdev,
                                   const Caller& caller) {
  if ((mode & S_IFMT) == 0) mode |= S_IFREG;
  if (S_ISDIR(mode) || S_ISLNK(mode)) return Status::Error(EINVAL, "mknod cannot make directories or links");
  InodeRecord record;
  record.mode = mode;
  record.uid = caller.uid;
  record.gid = caller.gid;
  record.nlink = 1;
  record.rdev = (S_ISCHR(mode) || S_ISBLK(mode)) ? rdev : 0;
  return CreateInode(parent, name, std::move(record));
}

Result<Entry> Filesystem::MakeDir(InodeNumber parent, std::string_view name, uint32_t mode, const Caller& caller) {
  InodeRecord record;
  record.mode = S_IFDIR | (mode & 07777);
  record.uid = caller.uid;
  record.gid = caller.gid;
  record.nlink = 2;
  return CreateInode(parent, name, std::move(record));
}

Result<Entry> Filesystem::Symlink(InodeNumber parent, std::string_view name, std::string_view target,
                                  const Caller& caller) {
  if (target.empty()) return Status::Error(ENOENT, "empty symlink target");
  if (target.size() > kSymlinkMax) return Status::Error(ENAMETOOLONG, "symlink target too long");
  InodeRecord record;
  record.mode = S_IFLNK | 0777;
  record.uid = caller.uid;
  record.gid = caller.gid;
  record.nlink = 1;
  record.size = target.size();
  record.symlink_target.assign(target);
  return CreateInode(parent, name, std::move(record));
}

Result<Entry> Filesystem::Link(InodeNumber ino, InodeNumber new_parent, std::string_view new_name) {
  SPILLFS_RETURN_IF_ERROR(CheckName(new_name));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (IsDir(record)) return Status::Error(EPERM, "hard links to directories are not allowed");
  if (record.nlink == 0) return Status::Error(ENOENT, "file was removed");
  if (record.nlink >= kLinkMax) return Status::Error(EMLINK, "too many links");
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord dir, LoadDir(new_parent));
  if (dir.nlink == 0) return Status::Error(ENOENT, "directory was removed");
  if (index_.GetDirent(new_parent, new_name).ok()) return Status::Error(EEXIST, fmt::format("{} exists", new_name));
  int64_t now = NowNs();
  ++record.nlink;
  Touch(&record, false, now);
  Touch(&dir, true, now);
  Txn txn(index_);
  PutInode(&txn, ino, record);
  PutInode(&txn, new_parent, dir);
  txn.batch.Put(Family::kDirent, keys::Dirent(new_parent, new_name), DirentRecord{ino, record.mode & S_IFMT}.Encode());
  SPILLFS_RETURN_IF_ERROR(CommitTxn(&txn));
  CountLookup(ino);
  return MakeEntry(ino, record);
}

Result<std::string> Filesystem::ReadLink(InodeNumber ino) {
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  if (!S_ISLNK(record.mode)) return Status::Error(EINVAL, "not a symbolic link");
  return record.symlink_target;
}

Status Filesystem::Unlink(InodeNumber parent, std::string_view name) {
  SPILLFS_RETURN_IF_ERROR(CheckName(name));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord dir, LoadDir(parent));
  SPILLFS_ASSIGN_OR_RETURN(DirentRecord dirent, FindDirent(parent, name));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(dirent.ino));
  if (IsDir(record)) return Status::Error(EISDIR, fmt::format("{} is a directory", name));
  Txn txn(index_);
  txn.batch.Delete(Family::kDirent, keys::Dirent(parent, name));
  Touch(&dir, true, NowNs());
  PutInode(&txn, parent, dir);
  SPILLFS_RETURN_IF_ERROR(DropLink(&txn, dirent.ino, &record));
  return CommitTxn(&txn);
}

Status Filesystem::Rmdir(InodeNumber parent, std::string_view name) {
  if (name == ".") return Status::Error(EINVAL, "cannot remove '.'");
  if (name == "..") return Status::Error(ENOTEMPTY, "cannot remove '..'");
  SPILLFS_RETURN_IF_ERROR(CheckName(name));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord dir, LoadDir(parent));
  SPILLFS_ASSIGN_OR_RETURN(DirentRecord dirent, FindDirent(parent, name));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(dirent.ino));
  if (!IsDir(record)) return Status::Error(ENOTDIR, fmt::format("{} is not a directory", name));
  SPILLFS_ASSIGN_OR_RETURN(bool empty, DirIsEmpty(dirent.ino));
  if (!empty) return Status::Error(ENOTEMPTY, fmt::format("{} is not empty", name));
  Txn txn(index_);
  txn.batch.Delete(Family::kDirent, keys::Dirent(parent, name));
  --dir.nlink;
  Touch(&dir, true, NowNs());
  PutInode(&txn, parent, dir);
  SPILLFS_RETURN_IF_ERROR(DropLink(&txn, dirent.ino, &record));
  return CommitTxn(&txn);
}

Status Filesystem::SettleForRename(InodeNumber parent, std::string_view name, InodeNumber new_parent,
                                   std::string_view new_name, unsigned flags) {
  if (flags & RENAME_NOREPLACE) return Status::OK();  // replaces nothing
  auto src = index_.GetDirent(parent, name);
  auto dst = index_.GetDirent(new_parent, new_name);
  if (!src.ok() || !dst.ok()) return Status::OK();  // nothing replaced (Rename reports what is missing)
  std::vector<InodeNumber> inos;
  if (IsUnsettled(src->ino)) inos.push_back(src->ino);
  if ((flags & RENAME_EXCHANGE) && IsUnsettled(dst->ino)) inos.push_back(dst->ino);
  if (inos.empty()) return Status::OK();
  // Settled, the file's data is durable (mapped only after a data flush)
  // and mapped before the rename's batch; a later write to it is flushed at
  // close, as any settled file's is.
  return Settle(inos);
}

Status Filesystem::Rename(InodeNumber parent, std::string_view name, InodeNumber new_parent, std::string_view new_name,
                          unsigned flags) {
  SPILLFS_RETURN_IF_ERROR(CheckName(name));
  SPILLFS_RETURN_IF_ERROR(CheckName(new_name));
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return Status::Error(EINVAL, "unsupported rename flags");
  if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE)) {
    return Status::Error(EINVAL, "RENAME_NOREPLACE and RENAME_EXCHANGE together");
  }
  SPILLFS_RETURN_IF_ERROR(SettleForRename(parent, name, new_parent, new_name, flags));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord src_dir, LoadDir(parent));
  SPILLFS_ASSIGN_OR_RETURN(DirentRecord src, FindDirent(parent, name));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord src_record, LoadInode(src.ino));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord dst_dir_loaded, LoadDir(new_parent));
  bool same_dir = parent == new_parent;
  InodeRecord& dst_dir = same_dir ? src_dir : dst_dir_loaded;
  auto dst = index_.GetDirent(new_parent, new_name);
  if (!dst.ok() && !dst.status().IsNotFound()) return dst.status();

  int64_t now = NowNs();
  Txn txn(index_);
  if (flags & RENAME_EXCHANGE) {
    if (!dst.ok()) return Status::Error(ENOENT, fmt::format("{} does not exist", new_name));
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord dst_record, LoadInode(dst->ino));
    txn.batch.Put(Family::kDirent, keys::Dirent(parent, name), dst->Encode());
    txn.batch.Put(Family::kDirent, keys::Dirent(new_parent, new_name), src.Encode());
    if (!same_dir) {
      if (IsDir(src_record) && !IsDir(dst_record)) --src_dir.nlink, ++dst_dir.nlink;
      if (!IsDir(src_record) && IsDir(dst_record)) ++src_dir.nlink, --dst_dir.nlink;
      if (IsDir(src_record)) src_record.parent = new_parent;
      if (IsDir(dst_record)) dst_record.parent = parent;
    }
    Touch(&src_record, false, now);
    Touch(&dst_record, false, now);
    PutInode(&txn, src.ino, src_record);
    PutInode(&txn, dst->ino, dst_record);
  } else {
    if (dst.ok()) {
      if (flags & RENAME_NOREPLACE) return Status::Error(EEXIST, fmt::format("{} exists", new_name));
      if (dst->ino == src.ino) return Status::OK();  // two links to one inode: nothing to do
      SPILLFS_ASSIGN_OR_RETURN(InodeRecord dst_record, LoadInode(dst->ino));
      if (IsDir(src_record) && !IsDir(dst_record)) return Status::Error(ENOTDIR, "target is not a directory");
      if (!IsDir(src_record) && IsDir(dst_record)) return Status::Error(EISDIR, "target is a directory");
      if (IsDir(dst_record)) {
        SPILLFS_ASSIGN_OR_RETURN(bool empty, DirIsEmpty(dst->ino));
        if (!empty) return Status::Error(ENOTEMPTY, fmt::format("{} is not empty", new_name));
        --dst_dir.nlink;
      }
      SPILLFS_RETURN_IF_ERROR(DropLink(&txn, dst->ino, &dst_record));
    }
    txn.batch.Delete(Family::kDirent, keys::Dirent(parent, name));
    txn.batch.Put(Family::kDirent, keys::Dirent(new_parent, new_name), src.Encode());
    if (IsDir(src_record) && !same_dir) {
      --src_dir.nlink;
      ++dst_dir.nlink;
      src_record.parent = new_parent;
    }
    Touch(&src_record, false, now);
    PutInode(&txn, src.ino, src_record);
  }
  Touch(&src_dir, true, now);
  PutInode(&txn, parent, src_dir);
  if (!same_dir) {
    Touch(&dst_dir, true, now);
    PutInode(&txn, new_parent, dst_dir);
  }
  return CommitTxn(&txn);
}

Result<std::vector<DirEntry>> Filesystem::ReadDir(InodeNumber ino) {
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord dir, LoadDir(ino));
  std::vector<DirEntry> entries;
  entries.push_back(DirEntry{".", ino, S_IFDIR});
  entries.push_back(DirEntry{"..", dir.parent, S_IFDIR});
  auto cursor = index_.NewCursor(Family::kDirent, keys::Ino(ino));
  for (cursor->Seek(keys::Ino(ino)); cursor->Valid(); cursor->Next()) {
    SPILLFS_ASSIGN_OR_RETURN(DirentRecord dirent, DirentRecord::Decode(cursor->value()));
    entries.push_back(DirEntry{std::string(keys::DirentName(cursor->key())), dirent.ino, dirent.type});
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  return entries;
}

struct statvfs Filesystem::StatFs() {
  const Superblock& sb = volume_->superblock();
  struct statvfs st {};
  st.f_bsize = block_size_;
  st.f_frsize = block_size_;
  st.f_blocks = (sb.data_size - sb.data_offset) / block_size_;
  st.f_bfree = allocator_.available_bytes() / block_size_;
  st.f_bavail = st.f_bfree;
  MutexLock lock(&mu_);
  st.f_files = 1ull << 32;
  st.f_ffree = st.f_files - std::min<uint64_t>(st.f_files, next_ino_);
  st.f_favail = st.f_ffree;
  st.f_namemax = kNameMax;
  return st;
}

}  // namespace spillfs
