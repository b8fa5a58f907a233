// One read of the whole index into a compact model (inodes, dirents,
// extents without their checksums, free list), with the checks each record
// allows on its own; the checks across the model are in fsck_checks.cc, the
// scrub of the data in fsck_scrub.cc.
#include "fsck_pass.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "spillfs/common/block_checksum.h"
#include "spillfs/common/clock.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs::fsck::internal {

const char* TypeName(uint32_t type) {
  switch (type & S_IFMT) {
    case S_IFREG:
      return "file";
    case S_IFDIR:
      return "directory";
    case S_IFLNK:
      return "symlink";
    case S_IFCHR:
      return "character device";
    case S_IFBLK:
      return "block device";
    case S_IFIFO:
      return "fifo";
    case S_IFSOCK:
      return "socket";
    default:
      return "unknown type";
  }
}

namespace {

bool KnownType(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
    case S_IFDIR:
    case S_IFLNK:
    case S_IFCHR:
    case S_IFBLK:
    case S_IFIFO:
    case S_IFSOCK:
      return true;
    default:
      return false;
  }
}

}  // namespace

void Pass::Add(ProblemKind kind, InodeNumber ino, std::string message, std::optional<uint64_t> file_offset,
               std::optional<uint64_t> physical, std::optional<uint64_t> length) {
  ++report_.problems_found;
  ++report_.problem_counts[ProblemKindName(kind)];
  if (per_kind_[kind]++ >= options_.max_problems_per_kind) return;
  Problem p;
  p.kind = kind;
  p.ino = ino;
  p.message = std::move(message);
  p.file_offset = file_offset;
  p.physical = physical;
  p.length = length;
  report_.problems.push_back(std::move(p));
}

// "/a/b" for a named inode, "" when it has no path to the root.
std::string Pass::PathOf(InodeNumber ino) {
  if (ino == kRootInode) return "/";
  std::vector<const std::string*> parts;
  InodeNumber at = ino;
  std::string prefix;
  while (at != kRootInode) {
    auto cached = dir_paths_.find(at);
    if (cached != dir_paths_.end() && at != ino) {
      prefix = cached->second;
      break;
    }
    auto it = inodes_.find(at);
    if (it == inodes_.end() || it->second.name_parent == 0 || parts.size() > kMaxPathDepth) return "";
    parts.push_back(&it->second.name);
    at = it->second.name_parent;
  }
  std::string path = prefix == "/" ? "" : prefix;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    path += '/';
    path += **it;
  }
  auto self = inodes_.find(ino);
  if (self != inodes_.end() && IsDirMode(self->second.record.mode)) dir_paths_[ino] = path;
  return path;
}

std::string Pass::Who(InodeNumber ino) {
  std::string path = PathOf(ino);
  if (path.empty()) return fmt::format("inode {}", ino);
  return fmt::format("{} (inode {})", path, ino);
}

Status Pass::CheckMeta() {
  if (sb_.block_size != Volume::kBlockSize || sb_.data_offset < sb_.block_size || sb_.data_offset >= sb_.data_size) {
    Add(ProblemKind::kSuperblock, 0,
        fmt::format("superblock geometry is unexpected: block size {}, data area [{}, {})", sb_.block_size,
                    sb_.data_offset, sb_.data_size));
  }
  report_.data_area_bytes = sb_.data_size > sb_.data_offset ? sb_.data_size - sb_.data_offset : 0;
  // The copy in block 0 of the data area (Volume::Open compared them too).
  AlignedBuffer block(std::max<uint64_t>(bs_, AlignedBuffer::kAlignment));
  Status read = volume_.store().ReadAt(0, block.data(), block.size());
  if (!read.ok()) {
    Add(ProblemKind::kSuperblock, 0, fmt::format("cannot read the superblock block: {}", read.ToString()));
  } else {
    auto on_disk = Superblock::DecodeBlock(std::string_view(block.data(), block.size()));
    if (!on_disk.ok()) {
      Add(ProblemKind::kSuperblock, 0,
          fmt::format("superblock block of the data area: {}", on_disk.status().message()));
    } else if (!(*on_disk == sb_)) {
      Add(ProblemKind::kSuperblock, 0, "superblock copies in the index and the data area differ");
    }
  }
  auto next = index_.GetMetaU64(keys::kNextIno);
  if (next.ok()) {
    next_ino_ = *next;
  } else {
    Add(ProblemKind::kNextIno, 0, fmt::format("meta next_ino is unreadable: {}", next.status().message()));
  }
  return Status::OK();
}

Status Pass::EachRecord(Family family, std::string_view phase,
                        const std::function<void(std::string_view key, std::string_view value)>& visit) {
  auto cursor = index_.NewCursor(family, "");
  uint64_t n = 0;
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (++n % kProgressEvery == 0 && !phase.empty()) Progress(phase, n);
    visit(cursor->key(), cursor->value());
  }
  return cursor->status();
}

Status Pass::ScanInodes() {
  Status status = EachRecord(Family::kInode, "inodes", [&](std::string_view key, std::string_view value) {
    if (key.size() != 8) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("inode key of {} bytes (8 expected)", key.size()));
      return;
    }
    InodeNumber ino = keys::DecodeIno(key);
    auto record = InodeRecord::Decode(value);
    if (!record.ok()) {
      Add(ProblemKind::kBadRecord, ino, fmt::format("inode {}: {}", ino, record.status().message()));
      return;
    }
    if (!KnownType(record->mode)) {
      Add(ProblemKind::kBadRecord, ino,
          fmt::format("inode {} has an unknown file type (mode {:o})", ino, record->mode));
      return;
    }
    max_ino_ = std::max(max_ino_, ino);
    ++report_.inodes;
    switch (record->mode & S_IFMT) {
      case S_IFREG:
        ++report_.files;
        break;
      case S_IFDIR:
        ++report_.directories;
        break;
      case S_IFLNK:
        ++report_.symlinks;
        break;
      default:
        ++report_.specials;
        break;
    }
    inodes_[ino].record = std::move(*record);
    inode_order_.push_back(ino);
  });
  SPILLFS_RETURN_IF_ERROR(status);
  auto root = inodes_.find(kRootInode);
  if (root == inodes_.end() || !IsDirMode(root->second.record.mode)) {
    Add(ProblemKind::kBadRecord, kRootInode, "the root directory (inode 1) is missing or not a directory");
  }
  return Status::OK();
}

Status Pass::ScanDirents() {
  Status status = EachRecord(Family::kDirent, "dirents", [&](std::string_view key, std::string_view value) {
    ++report_.dirents;
    if (key.size() <= 8) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("dirent key of {} bytes (more than 8 expected)", key.size()));
      return;
    }
    DirentInfo d;
    d.parent = keys::DecodeIno(key);
    d.name.assign(keys::DirentName(key));
    auto record = DirentRecord::Decode(value);
    if (!record.ok()) {
      Add(ProblemKind::kBadRecord, d.parent,
          fmt::format("dirent {:?} in directory {}: {}", d.name, d.parent, record.status().message()));
      return;
    }
    d.record = *record;
    dirents_.push_back(std::move(d));
  });
  SPILLFS_RETURN_IF_ERROR(status);

  // Which dirents are live, and the links they give.
  for (DirentInfo& d : dirents_) {
    auto parent = inodes_.find(d.parent);
    auto child = inodes_.find(d.record.ino);
    if (d.name == "." || d.name == ".." || d.name.size() > 255 || d.name.find('/') != std::string::npos ||
        d.name.find('\0') != std::string::npos) {
      Add(ProblemKind::kBadRecord, d.parent,
          fmt::format("dirent {:?} in directory {} has an invalid name", d.name, d.parent));
      continue;
    }
    if (parent == inodes_.end() || !IsDirMode(parent->second.record.mode)) {
      Add(ProblemKind::kDanglingDirent, d.record.ino,
          fmt::format("dirent {:?} -> inode {} lies in {} {}, which is not a directory", d.name, d.record.ino,
                      parent == inodes_.end() ? "missing inode" : "inode", d.parent));
      continue;
    }
    if (child == inodes_.end()) {
      Add(ProblemKind::kDanglingDirent, d.record.ino,
          fmt::format("dirent {:?} in directory {} names missing inode {}", d.name, d.parent, d.record.ino));
      continue;
    }
    if (d.record.ino == kRootInode) {
      Add(ProblemKind::kDanglingDirent, kRootInode,
          fmt::format("dirent {:?} in directory {} names the root directory", d.name, d.parent));
      continue;
    }
    d.live = true;
    InodeInfo& c = child->second;
    if (c.links++ == 0) {
      c.name_parent = d.parent;
      c.name = d.name;
    }
    ++parent->second.entries;
    if (IsDirMode(c.record.mode)) ++parent->second.subdirs;
  }
  // Type checks need paths, so they run once every name is known.
  for (const DirentInfo& d : dirents_) {
    if (!d.live) continue;
    const InodeInfo& c = inodes_[d.record.ino];
    if ((d.record.type & S_IFMT) != (c.record.mode & S_IFMT)) {
      Add(ProblemKind::kDirentType, d.record.ino,
          fmt::format("dirent {:?} in {} says {} but {} is a {}", d.name, Who(d.parent), TypeName(d.record.type),
                      Who(d.record.ino), TypeName(c.record.mode)));
    }
  }
  return Status::OK();
}

Status Pass::ScanOrphans() {
  return EachRecord(Family::kOrphan, "", [&](std::string_view key, std::string_view /*value*/) {
    if (key.size() != 8) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("orphan key of {} bytes (8 expected)", key.size()));
      return;
    }
    InodeNumber ino = keys::DecodeIno(key);
    ++report_.orphans;
    orphan_keys_.insert(ino);
    auto it = inodes_.find(ino);
    if (it != inodes_.end()) it->second.orphan = true;
  });
}

Status Pass::ScanXattrs() {
  Status status = EachRecord(Family::kXattr, "", [&](std::string_view key, std::string_view /*value*/) {
    ++report_.xattrs;
    if (key.size() <= 8) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("xattr key of {} bytes (more than 8 expected)", key.size()));
      return;
    }
    InodeNumber ino = keys::DecodeIno(key);
    if (inodes_.find(ino) == inodes_.end()) stray_xattrs_[ino].emplace_back(key);
  });
  SPILLFS_RETURN_IF_ERROR(status);
  for (const auto& [ino, keys] : stray_xattrs_) {
    Add(ProblemKind::kStrayXattr, ino, fmt::format("{} xattr(s) of missing inode {}", keys.size(), ino));
  }
  return Status::OK();
}

Status Pass::ScanExtents() {
  InodeNumber last_ino = 0;
  uint64_t last_end = 0;
  // Extents of a missing or non-regular inode: reported once per inode.
  InodeNumber stray_ino = 0;
  uint64_t stray_count = 0, stray_bytes = 0;
  auto flush_stray = [&] {
    if (stray_count == 0) return;
    auto it = inodes_.find(stray_ino);
    if (it == inodes_.end()) {
      Add(ProblemKind::kStrayExtent, stray_ino,
          fmt::format("{} extent(s), {} bytes, belong to missing inode {}", stray_count, stray_bytes, stray_ino));
    } else {
      Add(ProblemKind::kStrayExtent, stray_ino,
          fmt::format("{} is a {} but maps {} extent(s), {} bytes", Who(stray_ino), TypeName(it->second.record.mode),
                      stray_count, stray_bytes));
    }
    stray_count = stray_bytes = 0;
  };
  Status status = EachRecord(Family::kExtent, "extents", [&](std::string_view key, std::string_view value) {
    if (key.size() != 16) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("extent key of {} bytes (16 expected)", key.size()));
      return;
    }
    ExtentInfo e;
    e.ino = keys::DecodeIno(key);
    e.file_offset = keys::ExtentOffset(key);
    auto record = ExtentRecord::Decode(value);
    if (!record.ok()) {
      Add(ProblemKind::kBadRecord, e.ino,
          fmt::format("extent of inode {} at file offset {}: {}", e.ino, e.file_offset, record.status().message()),
          e.file_offset);
      return;
    }
    e.physical = record->physical;
    e.length = record->length;
    e.flags = record->flags;
    e.blob_id = record->blob_id;
    e.checksums = record->block_checksums.size();
    ++report_.extents;
    report_.bytes_mapped += e.length;

    if (e.length == 0 || e.length % bs_ != 0 || e.physical % bs_ != 0 || e.file_offset % bs_ != 0) {
      e.sane = false;
      Add(ProblemKind::kExtentAlignment, e.ino,
          fmt::format("extent of {} at file offset {} -> physical {}, {} bytes, is not block aligned", Who(e.ino),
                      e.file_offset, e.physical, e.length),
          e.file_offset, e.physical, e.length);
    }
    if (e.physical < sb_.data_offset || e.physical + e.length > sb_.data_size || e.physical + e.length < e.physical) {
      e.sane = false;
      Add(ProblemKind::kExtentRange, e.ino,
          fmt::format("extent of {} at file offset {} -> physical [{}, +{}) lies outside the data "
                      "area [{}, {})",
                      Who(e.ino), e.file_offset, e.physical, e.length, sb_.data_offset, sb_.data_size),
          e.file_offset, e.physical, e.length);
    }
    uint64_t expected_sums = (e.unwritten() || !sb_.checksums) ? 0 : e.length / bs_;
    if (e.checksums != expected_sums) {
      Add(ProblemKind::kChecksumCount, e.ino,
          fmt::format("extent of {} at file offset {}, {} bytes{}, has {} checksums, {} expected", Who(e.ino),
                      e.file_offset, e.length, e.unwritten() ? " (unwritten)" : "", e.checksums, expected_sums),
          e.file_offset, e.physical, e.length);
    }

    if (e.ino != stray_ino) flush_stray();
    auto owner = inodes_.find(e.ino);
    if (owner == inodes_.end() || !S_ISREG(owner->second.record.mode)) {
      stray_ino = e.ino;
      ++stray_count;
      stray_bytes += e.length;
    } else {
      InodeInfo& info = owner->second;
      info.extent_bytes += e.length;
      if (e.ino == last_ino && e.file_offset < last_end) {
        Add(ProblemKind::kExtentOverlap, e.ino,
            fmt::format("extents of {} overlap at file offset {} (the previous one ends at {})", Who(e.ino),
                        e.file_offset, last_end),
            e.file_offset, e.physical, e.length);
      }
      uint64_t eof = RoundUp(info.record.size, bs_);
      if (!e.unwritten() && e.file_offset + e.length > eof) {
        Add(ProblemKind::kDataPastEof, e.ino,
            fmt::format("{} has written data at file offset [{}, {}) past its end ({} bytes)", Who(e.ino),
                        std::max(e.file_offset, eof), e.file_offset + e.length, info.record.size),
            e.file_offset, e.physical, e.length);
      }
      if (options_.list_extents) {
        if (report_.file_extents.empty() || report_.file_extents.back().ino != e.ino) {
          report_.file_extents.push_back(FileExtents{e.ino, PathOf(e.ino), info.record.size, {}});
        }
        report_.file_extents.back().extents.push_back(static_cast<const FileExtents::Extent&>(e));
      }
    }
    if (e.ino != last_ino) last_end = 0;
    last_ino = e.ino;
    last_end = std::max(last_end, e.file_offset + e.length);
    extents_.push_back(e);
  });
  flush_stray();
  return status;
}

Status Pass::ScanFree() {
  return EachRecord(Family::kFree, "free list", [&](std::string_view key, std::string_view value) {
    FreeInfo f;
    coding::Reader reader(value);
    if (key.size() != 8 || !reader.GetVarint64(&f.length) || !reader.empty()) {
      Add(ProblemKind::kBadRecord, 0, "malformed free-space record");
      bad_free_keys_.emplace_back(key);
      return;
    }
    f.offset = keys::DecodeIno(key);
    report_.bytes_free += f.length;
    if (f.length == 0 || f.offset % bs_ != 0 || f.length % bs_ != 0) {
      f.sane = false;
      Add(ProblemKind::kFreeOverlap, 0,
          fmt::format("free extent [{}, +{}) is empty or not block aligned", f.offset, f.length), {}, f.offset,
          f.length);
    }
    if (f.offset < sb_.data_offset || f.offset + f.length > sb_.data_size || f.offset + f.length < f.offset) {
      f.sane = false;
      Add(ProblemKind::kFreeOverlap, 0,
          fmt::format("free extent [{}, +{}) lies outside the data area [{}, {})", f.offset, f.length, sb_.data_offset,
                      sb_.data_size),
          {}, f.offset, f.length);
    }
    free_.push_back(f);
  });
}

// Dedup blobs: each 'p' record is referenced by exactly `refs` extents that
// lie inside it, and each 'h' record names a unit of a blob of that hash.
Status Pass::ScanBlobs() {
  std::vector<std::pair<BlobUnitRef, std::string>> by_hash;  // the unit an 'h' record names, and its hash
  std::map<uint64_t, std::string> contents;                  // 'd' records: physical -> value
  Status status = EachRecord(Family::kBlob, "", [&](std::string_view key, std::string_view value) {
    if (key.size() == 9 && key[0] == 'd') {
      contents.emplace(coding::DecodeFixed64BE(key.data() + 1), value);
    } else if (key.size() == 9 && key[0] == 'p') {
      auto blob = BlobRecord::Decode(value);
      if (!blob.ok()) {
        Add(ProblemKind::kBadRecord, 0, "malformed blob record: " + blob.status().message());
        return;
      }
      blobs_.emplace(coding::DecodeFixed64BE(key.data() + 1), *blob);
    } else if (auto at = BlobUnitRef::Decode(value); key.size() == 17 && key[0] == 'h' && at.ok()) {
      by_hash.emplace_back(*at, key.substr(1));
    } else {
      Add(ProblemKind::kBadRecord, 0, "malformed blob key");
    }
  });
  SPILLFS_RETURN_IF_ERROR(status);
  // A blob of several units: its head ('p') and content ('d') come together.
  for (const auto& [physical, value] : contents) {
    auto it = blobs_.find(physical);
    if (it == blobs_.end() || !it->second.needs_content()) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("blob content {} without a blob head", physical));
      continue;
    }
    if (Status decoded = it->second.DecodeContent(value); !decoded.ok()) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("malformed blob content {}: {}", physical, decoded.message()));
    }
  }
  for (const auto& [physical, blob] : blobs_) {
    if (blob.needs_content()) {
      Add(ProblemKind::kBlob, 0, fmt::format("blob {} has no content (unit hashes)", physical), {}, physical,
          blob.length);
    }
  }
  for (const auto& [at, hash] : by_hash) {
    auto it = blobs_.find(at.blob);
    if (it == blobs_.end() || at.unit >= it->second.units() || it->second.unit_hash(at.unit) != hash) {
      Add(ProblemKind::kBlob, 0,
          fmt::format("hash record points to unit {} of blob {} that does not match", at.unit, at.blob), {}, at.blob);
    }
  }
  for (const auto& [physical, blob] : blobs_) {
    if (blob.needs_content()) continue;
    if (blob.length % blob.units() != 0 ||
        (!blob.block_checksums.empty() && blob.block_checksums.size() != blob.length / bs_)) {
      Add(ProblemKind::kBlob, 0,
          fmt::format("blob {} of {} bytes holds {} unit hashes and {} block checksums", physical, blob.length,
                      blob.units(), blob.block_checksums.size()),
          {}, physical, blob.length);
    }
  }
  std::map<uint64_t, uint64_t> refs;
  for (const ExtentInfo& e : extents_) {
    if (e.blob_id == 0) continue;
    ++refs[e.blob_id];
    auto it = blobs_.find(e.blob_id);
    if (it == blobs_.end()) {
      Add(ProblemKind::kBlob, e.ino, fmt::format("extent names blob {} that does not exist", e.blob_id), e.file_offset,
          e.physical, e.length);
    } else if (e.physical < e.blob_id || e.physical + e.length > e.blob_id + it->second.length) {
      Add(ProblemKind::kBlob, e.ino, fmt::format("extent lies outside its blob {}", e.blob_id), e.file_offset,
          e.physical, e.length);
    }
  }
  // Physical space: a blob's extents count once, as the blob's whole range.
  for (const ExtentInfo& e : extents_) {
    if (e.blob_id != 0 && blobs_.count(e.blob_id)) report_.bytes_mapped -= e.length;
  }
  for (const auto& [physical, blob] : blobs_) report_.bytes_mapped += blob.length;
  for (const auto& [physical, blob] : blobs_) {
    if (refs[physical] != blob.refs) {
      Add(ProblemKind::kBlob, 0,
          fmt::format("blob {} counts {} references, {} extents name it", physical, blob.refs, refs[physical]), {},
          physical, blob.length);
    }
  }
  return Status::OK();
}

Status Pass::Run() {
  report_.scrub = scrub_;
  SPILLFS_RETURN_IF_ERROR(CheckMeta());
  SPILLFS_RETURN_IF_ERROR(ScanInodes());
  SPILLFS_RETURN_IF_ERROR(ScanDirents());
  SPILLFS_RETURN_IF_ERROR(ScanOrphans());
  SPILLFS_RETURN_IF_ERROR(ScanXattrs());
  SPILLFS_RETURN_IF_ERROR(ScanExtents());
  SPILLFS_RETURN_IF_ERROR(ScanFree());
  SPILLFS_RETURN_IF_ERROR(ScanBlobs());
  CheckSpace();
  CheckNamespace();
  if (scrub_) SPILLFS_RETURN_IF_ERROR(Scrub());
  for (Problem& p : report_.problems) {
    if (p.ino != 0 && p.path.empty()) p.path = PathOf(p.ino);
  }
  report_.problems_remaining = report_.problems_found;
  return Status::OK();
}

}  // namespace spillfs::fsck::internal
