// Repair: edits the model a Pass built so that every repairable problem is
// gone, and writes one index batch that brings the index in line with it.
#include "fsck_pass.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "spillfs/common/clock.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs::fsck::internal {
namespace {

class Repairer {
 public:
  explicit Repairer(Pass& pass) : p_(pass), batch_(pass.index_) {}
  Status Run();

 private:
  void Recount();
  void Reclaim(InodeNumber ino);
  Result<InodeNumber> LostAndFound();
  void FixExtents();
  void FixInodes();
  void FixBlobs();
  void RebuildFreeList();

  Pass& p_;
  Index::Batch batch_;
  std::unordered_map<InodeNumber, std::vector<size_t>> extents_of_;  // ino -> extents_ indexes
  std::unordered_set<InodeNumber> changed_;                          // inodes whose record must be written
  InodeNumber next_ino_ = 0;
};

// Links and subdirectory counts from the live dirents.
void Repairer::Recount() {
  for (auto& [ino, info] : p_.inodes_) {
    info.links = info.subdirs = info.entries = 0;
    info.name_parent = 0;
    info.name.clear();
  }
  for (const DirentInfo& d : p_.dirents_) {
    if (!d.live) continue;
    InodeInfo& c = p_.inodes_[d.record.ino];
    if (c.links++ == 0) {
      c.name_parent = d.parent;
      c.name = d.name;
    }
    InodeInfo& parent = p_.inodes_[d.parent];
    ++parent.entries;
    if (IsDirMode(c.record.mode)) ++parent.subdirs;
  }
}

// Deletes an inode with its xattrs, orphan mark and extents.
void Repairer::Reclaim(InodeNumber ino) {
  InodeInfo& info = p_.inodes_[ino];
  info.removed = true;
  batch_.Delete(Family::kInode, keys::Ino(ino));
  batch_.Delete(Family::kOrphan, keys::Ino(ino));
  auto cursor = p_.index_.NewCursor(Family::kXattr, keys::Ino(ino));
  for (cursor->Seek(keys::Ino(ino)); cursor->Valid(); cursor->Next()) batch_.Delete(Family::kXattr, cursor->key());
  for (size_t i : extents_of_[ino]) {
    ExtentInfo& e = p_.extents_[i];
    if (e.removed) continue;
    e.removed = true;
    batch_.Delete(Family::kExtent, keys::Extent(e.ino, e.file_offset));
  }
}

Result<InodeNumber> Repairer::LostAndFound() {
  std::set<std::string> root_names;
  for (const DirentInfo& d : p_.dirents_) {
    if (!d.live || d.parent != kRootInode) continue;
    root_names.insert(d.name);
    if (d.name == kLostAndFound && IsDirMode(p_.inodes_[d.record.ino].record.mode)) return d.record.ino;
  }
  std::string name = kLostAndFound;
  for (int i = 1; root_names.count(name) != 0; ++i) name = fmt::format("{}.{}", kLostAndFound, i);
  InodeNumber ino = next_ino_++;
  InodeInfo& info = p_.inodes_[ino];
  info.record.mode = S_IFDIR | 0700;
  info.record.nlink = 2;
  info.record.atime_ns = info.record.mtime_ns = info.record.ctime_ns = info.record.btime_ns = NowNs();
  info.record.generation = 1;
  info.record.parent = kRootInode;
  p_.inode_order_.push_back(ino);
  changed_.insert(ino);
  DirentInfo d;
  d.parent = kRootInode;
  d.name = name;
  d.record = DirentRecord{ino, S_IFDIR};
  d.live = true;
  batch_.Put(Family::kDirent, keys::Dirent(d.parent, d.name), d.record.Encode());
  p_.dirents_.push_back(std::move(d));
  return ino;
}

void Repairer::FixExtents() {
  for (auto& [ino, indexes] : extents_of_) {
    auto owner = p_.inodes_.find(ino);
    bool stray = owner == p_.inodes_.end() || owner->second.removed || !S_ISREG(owner->second.record.mode);
    for (size_t i : indexes) {
      ExtentInfo& e = p_.extents_[i];
      if (e.removed) continue;
      if (stray) {
        e.removed = true;
        batch_.Delete(Family::kExtent, keys::Extent(e.ino, e.file_offset));
        continue;
      }
      if (!e.sane || e.unwritten()) continue;
      uint64_t eof = RoundUp(owner->second.record.size, p_.bs_);
      if (e.file_offset + e.length <= eof) continue;
      if (e.file_offset >= eof) {  // wholly past the end: unmap
        e.removed = true;
        batch_.Delete(Family::kExtent, keys::Extent(e.ino, e.file_offset));
        continue;
      }
      // Straddles the end: keep the part before it.
      std::string value;
      if (!p_.index_.Get(Family::kExtent, keys::Extent(e.ino, e.file_offset), &value).ok()) continue;
      auto record = ExtentRecord::Decode(value);
      if (!record.ok()) continue;
      uint64_t keep = eof - e.file_offset;
      record->length = keep;
      if (record->block_checksums.size() >= keep / p_.bs_) record->block_checksums.resize(keep / p_.bs_);
      e.length = keep;
      batch_.Put(Family::kExtent, keys::Extent(e.ino, e.file_offset), record->Encode());
    }
  }
}

void Repairer::FixInodes() {
  std::unordered_map<InodeNumber, uint64_t> bytes;
  for (const ExtentInfo& e : p_.extents_) {
    if (!e.removed) bytes[e.ino] += e.length;
  }
  for (InodeNumber ino : p_.inode_order_) {
    InodeInfo& info = p_.inodes_[ino];
    if (info.removed) continue;
    InodeRecord& r = info.record;
    bool dir = IsDirMode(r.mode);
    bool changed = changed_.count(ino) != 0;
    if (info.links > 0 || ino == kRootInode) {
      uint32_t nlink = dir ? 2 + info.subdirs : info.links;
      if (r.nlink != nlink) r.nlink = nlink, changed = true;
      InodeNumber parent = ino == kRootInode ? kRootInode : info.name_parent;
      if (dir && r.parent != parent) r.parent = parent, changed = true;
      if (info.orphan) {
        batch_.Delete(Family::kOrphan, keys::Ino(ino));
        info.orphan = false;
      }
    }
    uint64_t allocated = bytes[ino];
    if (r.allocated_bytes != allocated) r.allocated_bytes = allocated, changed = true;
    if (changed) batch_.Put(Family::kInode, keys::Ino(ino), r.Encode());
  }
}

// Blob refcounts follow the extents left after repair; a blob nothing names
// any more is dropped and its range becomes free.
void Repairer::FixBlobs() {
  std::map<uint64_t, uint64_t> refs;
  for (const ExtentInfo& e : p_.extents_) {
    if (!e.removed && e.blob_id != 0) ++refs[e.blob_id];
  }
  for (auto it = p_.blobs_.begin(); it != p_.blobs_.end();) {
    auto& [physical, blob] = *it;
    if (refs[physical] == 0) {
      batch_.Delete(Family::kBlob, keys::BlobByPhysical(physical));
      if (blob.split()) batch_.Delete(Family::kBlob, keys::BlobContent(physical));
      for (uint64_t k = 0; k < blob.units(); ++k) {  // the hash keys that name its units
        std::string owner;
        const std::string key = keys::BlobByHash(blob.unit_hash(k));
        if (p_.index_.Get(Family::kBlob, key, &owner).ok() && owner == BlobUnitRef{physical, k}.Encode()) {
          batch_.Delete(Family::kBlob, key);
        }
      }
      it = p_.blobs_.erase(it);
      continue;
    }
    if (refs[physical] != blob.refs) {
      blob.refs = refs[physical];
      batch_.Put(Family::kBlob, keys::BlobByPhysical(physical), blob.Encode());
    }
    ++it;
  }
}

void Repairer::RebuildFreeList() {
  // Wanted: the complement of every mapped extent in the data area.
  std::vector<std::pair<uint64_t, uint64_t>> used;  // [start, end)
  for (const ExtentInfo& e : p_.extents_) {
    if (e.removed) continue;
    uint64_t end = e.physical + e.length < e.physical ? UINT64_MAX : e.physical + e.length;
    uint64_t start = std::max(RoundDown(e.physical, p_.bs_), p_.sb_.data_offset);
    end = std::min(RoundUp(end, p_.bs_), p_.sb_.data_size);
    if (start < end) used.emplace_back(start, end);
  }
  for (const auto& [physical, blob] : p_.blobs_) used.emplace_back(physical, physical + blob.length);
  std::sort(used.begin(), used.end());
  std::map<uint64_t, uint64_t> wanted;
  uint64_t at = p_.sb_.data_offset;
  for (auto [start, end] : used) {
    if (start > at) wanted[at] = start - at;
    at = std::max(at, end);
  }
  if (at < p_.sb_.data_size) wanted[at] = p_.sb_.data_size - at;

  std::map<uint64_t, uint64_t> have;  // keys are unique: one record per offset
  for (const FreeInfo& f : p_.free_) have.emplace(f.offset, f.length);
  for (const std::string& key : p_.bad_free_keys_) batch_.Delete(Family::kFree, key);
  for (const auto& [offset, length] : have) {
    auto it = wanted.find(offset);
    if (it == wanted.end()) batch_.Delete(Family::kFree, keys::Free(offset));
  }
  for (const auto& [offset, length] : wanted) {
    auto it = have.find(offset);
    if (it != have.end() && it->second == length) continue;
    std::string value;
    coding::PutVarint64(&value, length);
    batch_.Put(Family::kFree, keys::Free(offset), value);
  }
}

Status Repairer::Run() {
  for (size_t i = 0; i < p_.extents_.size(); ++i) extents_of_[p_.extents_[i].ino].push_back(i);
  next_ino_ = std::max<uint64_t>(p_.next_ino_.value_or(0), p_.max_ino_ + 1);

  // 1. Dirents: the dangling ones go, wrong types are corrected.
  for (DirentInfo& d : p_.dirents_) {
    if (d.live) {
      const InodeRecord& child = p_.inodes_[d.record.ino].record;
      if ((d.record.type & S_IFMT) != (child.mode & S_IFMT)) {
        d.record.type = child.mode & S_IFMT;
        batch_.Put(Family::kDirent, keys::Dirent(d.parent, d.name), d.record.Encode());
      }
      continue;
    }
    auto parent = p_.inodes_.find(d.parent);
    auto child = p_.inodes_.find(d.record.ino);
    bool bad_name = d.name == "." || d.name == ".." || d.name.size() > 255 || d.name.find('/') != std::string::npos ||
                    d.name.find('\0') != std::string::npos;
    bool dangling = parent == p_.inodes_.end() || !IsDirMode(parent->second.record.mode) || child == p_.inodes_.end() ||
                    d.record.ino == kRootInode;
    if (dangling && !bad_name) batch_.Delete(Family::kDirent, keys::Dirent(d.parent, d.name));
  }
  Recount();

  // 2. Inodes without a name: the unlinked ones (orphans included) are
  // reclaimed, the ones that still count links go to /lost+found.
  std::vector<InodeNumber> lost;
  for (InodeNumber ino : p_.inode_order_) {
    InodeInfo& info = p_.inodes_[ino];
    if (ino == kRootInode || info.links > 0) continue;
    if (info.record.nlink == 0 && info.entries == 0) {
      Reclaim(ino);
    } else {
      lost.push_back(ino);
    }
  }
  if (!lost.empty()) {
    SPILLFS_ASSIGN_OR_RETURN(InodeNumber lf, LostAndFound());
    for (InodeNumber ino : lost) {
      InodeInfo& info = p_.inodes_[ino];
      DirentInfo d;
      d.parent = lf;
      d.name = fmt::format("#{}", ino);
      d.record = DirentRecord{ino, info.record.mode & S_IFMT};
      d.live = true;
      batch_.Put(Family::kDirent, keys::Dirent(d.parent, d.name), d.record.Encode());
      if (info.orphan) batch_.Delete(Family::kOrphan, keys::Ino(ino));
      info.orphan = false;
      changed_.insert(ino);
      p_.dirents_.push_back(std::move(d));
    }
    Recount();
  }

  // 3. Orphan records of missing inodes, xattrs of missing inodes.
  for (InodeNumber ino : p_.orphan_keys_) {
    if (p_.inodes_.find(ino) == p_.inodes_.end()) batch_.Delete(Family::kOrphan, keys::Ino(ino));
  }
  for (const auto& [ino, xattr_keys] : p_.stray_xattrs_) {
    for (const std::string& key : xattr_keys) batch_.Delete(Family::kXattr, key);
  }

  // 4. Extents of missing or non-regular inodes, data past EOF; then the
  // inode fields that count links and bytes; then the free list.
  FixExtents();
  FixInodes();
  FixBlobs();
  RebuildFreeList();
  if (!p_.next_ino_ || *p_.next_ino_ < next_ino_) {
    batch_.Put(Family::kMeta, keys::kNextIno, EncodeMetaU64(next_ino_));
  }
  if (batch_.Count() == 0) return Status::OK();
  SPILLFS_RETURN_IF_ERROR(p_.index_.Commit(&batch_, /*sync=*/true));
  return p_.index_.Sync();
}

}  // namespace

Status Repair(Pass& pass) { return Repairer(pass).Run(); }

}  // namespace spillfs::fsck::internal
