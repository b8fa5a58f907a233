// Filesystem: extended attributes, one index key per (inode, name).
#include <fmt/format.h>
#include <sys/xattr.h>

#include "spillfs/core/filesystem.h"
#include "spillfs/common/clock.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {
namespace {

constexpr size_t kXattrNameMax = 255;
constexpr size_t kXattrValueMax = 65536;

Status CheckXattrName(std::string_view name) {
  if (name.empty()) return Status::Error(EINVAL, "empty attribute name");
  if (name.size() > kXattrNameMax) return Status::Error(ERANGE, "attribute name longer than 255 bytes");
  for (std::string_view prefix : {"user.", "trusted.", "security.", "system."}) {
    if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix) return Status::OK();
  }
  return Status::Error(EOPNOTSUPP, fmt::format("attribute {} has no known namespace", name));
}

bool IsSecurityXattr(std::string_view name) { return name.substr(0, 9) == "security."; }

}  // namespace

Status Filesystem::FlushForEphemeralChange(InodeNumber ino, bool clears, std::unique_lock<WaitedMutex>* flush_lock) {
  // A file that stops being ephemeral promises its mapped data from the
  // flag's commit on, and its batches were mapped without a data flush
  // (FlushBeforeMapping): flush now, and keep its flushes out (FlushLock)
  // until the flag is committed.
  flush_lock->lock();
  if (!clears) return Status::OK();
  auto record = LoadInode(ino);
  if (!record.ok() || !S_ISREG(record->mode) || !(record->flags & kInodeEphemeral)) return Status::OK();
  return store_.Flush();
}

Status Filesystem::SetXattr(InodeNumber ino, std::string_view name, std::string_view value, int flags) {
  SPILLFS_RETURN_IF_ERROR(CheckXattrName(name));
  if (value.size() > kXattrValueMax) return Status::Error(E2BIG, "attribute value larger than 64 KiB");
  std::unique_lock flush_lock(FlushLock(ino), std::defer_lock);
  if (name == kEphemeralXattr) SPILLFS_RETURN_IF_ERROR(FlushForEphemeralChange(ino, value == "0", &flush_lock));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  std::string existing;
  Status found = index_.Get(Family::kXattr, keys::Xattr(ino, name), &existing);
  if (!found.ok() && !found.IsNotFound()) return found;
  if ((flags & XATTR_CREATE) && found.ok()) return Status::Error(EEXIST, fmt::format("{} exists", name));
  if ((flags & XATTR_REPLACE) && !found.ok()) return Status::Error(ENODATA, fmt::format("no attribute {}", name));
  if (name == kEphemeralXattr) {
    if (value != "1" && value != "0") return Status::Error(EINVAL, "user.spillfs.ephemeral takes 1 or 0");
    if (!S_ISDIR(record.mode) && !S_ISREG(record.mode)) return Status::Error(EINVAL, "only files and directories");
    if (value == "1") {
      record.flags |= kInodeEphemeral;
    } else {
      record.flags &= ~kInodeEphemeral;
    }
  }
  Txn txn(index_);
  txn.batch.Put(Family::kXattr, keys::Xattr(ino, name), value);
  record.ctime_ns = NowNs();
  PutInode(&txn, ino, record);
  Status committed = CommitTxn(&txn);
  if (IsSecurityXattr(name)) privilege_epoch_.fetch_add(1, std::memory_order_acq_rel);
  return committed;
}

Result<std::string> Filesystem::GetXattr(InodeNumber ino, std::string_view name) {
  SPILLFS_RETURN_IF_ERROR(CheckXattrName(name));
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  std::string value;
  Status found = index_.Get(Family::kXattr, keys::Xattr(ino, name), &value);
  if (found.IsNotFound()) return Status::Error(ENODATA, fmt::format("no attribute {}", name));
  SPILLFS_RETURN_IF_ERROR(found);
  return value;
}

Result<std::vector<std::string>> Filesystem::ListXattr(InodeNumber ino) {
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  std::vector<std::string> names;
  auto cursor = index_.NewCursor(Family::kXattr, keys::Ino(ino));
  for (cursor->Seek(keys::Ino(ino)); cursor->Valid(); cursor->Next()) {
    names.emplace_back(keys::DirentName(cursor->key()));
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  return names;
}

Status Filesystem::RemoveXattr(InodeNumber ino, std::string_view name) {
  SPILLFS_RETURN_IF_ERROR(CheckXattrName(name));
  std::unique_lock flush_lock(FlushLock(ino), std::defer_lock);
  if (name == kEphemeralXattr) SPILLFS_RETURN_IF_ERROR(FlushForEphemeralChange(ino, /*clears=*/true, &flush_lock));
  MutexLock lock(&mu_);
  SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(ino));
  std::string existing;
  Status found = index_.Get(Family::kXattr, keys::Xattr(ino, name), &existing);
  if (found.IsNotFound()) return Status::Error(ENODATA, fmt::format("no attribute {}", name));
  SPILLFS_RETURN_IF_ERROR(found);
  if (name == kEphemeralXattr) record.flags &= ~kInodeEphemeral;
  Txn txn(index_);
  txn.batch.Delete(Family::kXattr, keys::Xattr(ino, name));
  record.ctime_ns = NowNs();
  PutInode(&txn, ino, record);
  Status committed = CommitTxn(&txn);
  if (IsSecurityXattr(name)) privilege_epoch_.fetch_add(1, std::memory_order_acq_rel);
  return committed;
}

}  // namespace spillfs
