// One read of the whole index into a compact model (inodes, dirents,
// extents without their checksums, free list), and the checks on it.
#include "fsck_pass.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "spillfs/fs/clock.h"
#include "spillfs/kvindex/block_checksum.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs::fsck::internal {
namespace {

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

Status Pass::ScanInodes() {
  auto cursor = index_.NewCursor(Family::kInode, "");
  uint64_t n = 0;
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (++n % kProgressEvery == 0) Progress("inodes", n);
    if (cursor->key().size() != 8) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("inode key of {} bytes (8 expected)", cursor->key().size()));
      continue;
    }
    InodeNumber ino = keys::DecodeIno(cursor->key());
    auto record = InodeRecord::Decode(cursor->value());
    if (!record.ok()) {
      Add(ProblemKind::kBadRecord, ino, fmt::format("inode {}: {}", ino, record.status().message()));
      continue;
    }
    if (!KnownType(record->mode)) {
      Add(ProblemKind::kBadRecord, ino,
          fmt::format("inode {} has an unknown file type (mode {:o})", ino, record->mode));
      continue;
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
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  auto root = inodes_.find(kRootInode);
  if (root == inodes_.end() || !IsDirMode(root->second.record.mode)) {
    Add(ProblemKind::kBadRecord, kRootInode, "the root directory (inode 1) is missing or not a directory");
  }
  return Status::OK();
}

Status Pass::ScanDirents() {
  auto cursor = index_.NewCursor(Family::kDirent, "");
  uint64_t n = 0;
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (++n % kProgressEvery == 0) Progress("dirents", n);
    ++report_.dirents;
    if (cursor->key().size() <= 8) {
      Add(ProblemKind::kBadRecord, 0,
          fmt::format("dirent key of {} bytes (more than 8 expected)", cursor->key().size()));
      continue;
    }
    DirentInfo d;
    d.parent = keys::DecodeIno(cursor->key());
    d.name.assign(keys::DirentName(cursor->key()));
    auto record = DirentRecord::Decode(cursor->value());
    if (!record.ok()) {
      Add(ProblemKind::kBadRecord, d.parent,
          fmt::format("dirent {:?} in directory {}: {}", d.name, d.parent, record.status().message()));
      continue;
    }
    d.record = *record;
    dirents_.push_back(std::move(d));
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());

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
  auto cursor = index_.NewCursor(Family::kOrphan, "");
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (cursor->key().size() != 8) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("orphan key of {} bytes (8 expected)", cursor->key().size()));
      continue;
    }
    InodeNumber ino = keys::DecodeIno(cursor->key());
    ++report_.orphans;
    orphan_keys_.insert(ino);
    auto it = inodes_.find(ino);
    if (it != inodes_.end()) it->second.orphan = true;
  }
  return cursor->status();
}

Status Pass::ScanXattrs() {
  auto cursor = index_.NewCursor(Family::kXattr, "");
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    ++report_.xattrs;
    if (cursor->key().size() <= 8) {
      Add(ProblemKind::kBadRecord, 0,
          fmt::format("xattr key of {} bytes (more than 8 expected)", cursor->key().size()));
      continue;
    }
    InodeNumber ino = keys::DecodeIno(cursor->key());
    if (inodes_.find(ino) == inodes_.end()) stray_xattrs_[ino].emplace_back(cursor->key());
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  for (const auto& [ino, keys] : stray_xattrs_) {
    Add(ProblemKind::kStrayXattr, ino, fmt::format("{} xattr(s) of missing inode {}", keys.size(), ino));
  }
  return Status::OK();
}

Status Pass::ScanExtents() {
  auto cursor = index_.NewCursor(Family::kExtent, "");
  uint64_t n = 0;
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
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (++n % kProgressEvery == 0) Progress("extents", n);
    if (cursor->key().size() != 16) {
      Add(ProblemKind::kBadRecord, 0, fmt::format("extent key of {} bytes (16 expected)", cursor->key().size()));
      continue;
    }
    ExtentInfo e;
    e.ino = keys::DecodeIno(cursor->key());
    e.file_offset = keys::ExtentOffset(cursor->key());
    auto record = ExtentRecord::Decode(cursor->value());
    if (!record.ok()) {
      Add(ProblemKind::kBadRecord, e.ino,
          fmt::format("extent of inode {} at file offset {}: {}", e.ino, e.file_offset, record.status().message()),
          e.file_offset);
      continue;
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
        report_.file_extents.back().extents.push_back(
            FileExtents::Extent{e.file_offset, e.physical, e.length, e.flags, e.blob_id});
      }
    }
    if (e.ino != last_ino) last_end = 0;
    last_ino = e.ino;
    last_end = std::max(last_end, e.file_offset + e.length);
    extents_.push_back(e);
  }
  flush_stray();
  return cursor->status();
}

Status Pass::ScanFree() {
  auto cursor = index_.NewCursor(Family::kFree, "");
  uint64_t n = 0;
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (++n % kProgressEvery == 0) Progress("free list", n);
    FreeInfo f;
    coding::Reader reader(cursor->value());
    if (cursor->key().size() != 8 || !reader.GetVarint64(&f.length) || !reader.empty()) {
      Add(ProblemKind::kBadRecord, 0, "malformed free-space record");
      bad_free_keys_.emplace_back(cursor->key());
      continue;
    }
    f.offset = keys::DecodeIno(cursor->key());
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
  }
  return cursor->status();
}

// Dedup blobs: each 'p' record is referenced by exactly `refs` extents that
// lie inside it, and its 'h' record points back to it.
Status Pass::ScanBlobs() {
  auto cursor = index_.NewCursor(Family::kBlob, "");
  std::map<uint64_t, std::string> by_hash;  // physical -> hash named by an 'h' record
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    std::string_view key = cursor->key();
    if (key.size() == 9 && key[0] == 'p') {
      auto blob = BlobRecord::Decode(cursor->value());
      if (!blob.ok()) {
        Add(ProblemKind::kBadRecord, 0, "malformed blob record: " + blob.status().message());
        continue;
      }
      blobs_.emplace(coding::DecodeFixed64BE(key.data() + 1), *blob);
    } else if (key.size() == 17 && key[0] == 'h' && cursor->value().size() == 8) {
      by_hash[coding::DecodeFixed64BE(cursor->value().data())] = std::string(key.substr(1));
    } else {
      Add(ProblemKind::kBadRecord, 0, "malformed blob key");
    }
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  for (const auto& [physical, hash] : by_hash) {
    auto it = blobs_.find(physical);
    if (it == blobs_.end() || it->second.hash != hash) {
      Add(ProblemKind::kBlob, 0, fmt::format("hash record points to blob {} that does not match", physical), {},
          physical);
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

// The free list and the mapped extents must partition the data area.
void Pass::CheckSpace() {
  struct Interval {
    uint64_t start, end;
    int64_t source;  // >= 0: extents_ index; < 0: -1 - free_ index
  };
  std::vector<Interval> intervals;
  intervals.reserve(extents_.size() + free_.size());
  auto clip = [&](uint64_t start, uint64_t length, int64_t source) {
    uint64_t end = start + length < start ? UINT64_MAX : start + length;
    start = std::max(RoundDown(start, bs_), sb_.data_offset);
    end = std::min(RoundUp(end, bs_), sb_.data_size);
    if (start < end) intervals.push_back(Interval{start, end, source});
  };
  // A dedup blob owns its whole range, however much of it extents still name.
  std::vector<ExtentInfo> blob_ranges;
  for (const auto& [physical, blob] : blobs_) {
    ExtentInfo range;
    range.physical = physical;
    range.length = blob.length;
    range.blob_id = physical;
    blob_ranges.push_back(range);
  }
  for (size_t i = 0; i < extents_.size(); ++i) {
    if (extents_[i].blob_id != 0 && blobs_.count(extents_[i].blob_id)) continue;
    clip(extents_[i].physical, extents_[i].length, static_cast<int64_t>(i));
  }
  const size_t blob_base = extents_.size();
  extents_.insert(extents_.end(), blob_ranges.begin(), blob_ranges.end());
  for (size_t i = blob_base; i < extents_.size(); ++i)
    clip(extents_[i].physical, extents_[i].length, static_cast<int64_t>(i));
  for (size_t i = 0; i < free_.size(); ++i) clip(free_[i].offset, free_[i].length, -1 - static_cast<int64_t>(i));
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return std::tie(a.start, a.end) < std::tie(b.start, b.end); });

  auto describe = [&](int64_t source) -> std::string {
    if (source < 0) return "free";
    const ExtentInfo& e = extents_[static_cast<size_t>(source)];
    return fmt::format("mapped to {} at file offset {}", Who(e.ino), e.file_offset);
  };
  std::multimap<uint64_t, size_t> active;  // end -> intervals index
  uint64_t covered = sb_.data_offset;
  for (size_t i = 0; i < intervals.size(); ++i) {
    if (i % (kProgressEvery * 16) == 0) Progress("space", i, intervals.size());
    const Interval& cur = intervals[i];
    while (!active.empty() && active.begin()->first <= cur.start) active.erase(active.begin());
    for (const auto& [end, j] : active) {
      const Interval& other = intervals[j];
      uint64_t from = cur.start, to = std::min(end, cur.end);
      if (other.source < 0 && cur.source < 0) {
        Add(ProblemKind::kFreeOverlap, 0, fmt::format("free-list records overlap at physical [{}, {})", from, to), {},
            from, to - from);
        continue;
      }
      if (other.source >= 0 && cur.source >= 0) {
        const ExtentInfo& a = extents_[static_cast<size_t>(other.source)];
        const ExtentInfo& b = extents_[static_cast<size_t>(cur.source)];
        if (a.blob_id != 0 && a.blob_id == b.blob_id) continue;  // one dedup blob, shared
      }
      const int64_t mapped = cur.source >= 0 ? cur.source : other.source;
      const ExtentInfo& m = extents_[static_cast<size_t>(mapped)];
      Add(ProblemKind::kDoubleUse, m.ino,
          fmt::format("physical [{}, {}) is used twice: {} and {}", from, to, describe(other.source),
                      describe(cur.source)),
          m.file_offset + (from - std::min(from, m.physical)), from, to - from);
    }
    if (cur.start > covered) {
      Add(ProblemKind::kLeak, 0,
          fmt::format("{} bytes at physical [{}, {}) are neither free nor mapped (leaked)", cur.start - covered,
                      covered, cur.start),
          {}, covered, cur.start - covered);
    }
    covered = std::max(covered, cur.end);
    active.emplace(cur.end, i);
  }
  if (covered < sb_.data_size) {
    Add(ProblemKind::kLeak, 0,
        fmt::format("{} bytes at physical [{}, {}) are neither free nor mapped (leaked)", sb_.data_size - covered,
                    covered, sb_.data_size),
        {}, covered, sb_.data_size - covered);
  }
  extents_.resize(blob_base);  // the blob ranges were only for this check
}

void Pass::CheckNamespace() {
  // Reachability: walk down from the root through live dirents.
  std::unordered_map<InodeNumber, std::vector<InodeNumber>> children;
  for (const DirentInfo& d : dirents_) {
    if (d.live) children[d.parent].push_back(d.record.ino);
  }
  std::deque<InodeNumber> queue;
  auto root = inodes_.find(kRootInode);
  if (root != inodes_.end()) {
    root->second.reachable = true;
    queue.push_back(kRootInode);
  }
  while (!queue.empty()) {
    InodeNumber dir = queue.front();
    queue.pop_front();
    auto it = children.find(dir);
    if (it == children.end()) continue;
    for (InodeNumber child : it->second) {
      InodeInfo& c = inodes_[child];
      if (c.reachable) continue;
      c.reachable = true;
      if (IsDirMode(c.record.mode)) queue.push_back(child);
    }
  }

  uint64_t n = 0;
  for (InodeNumber ino : inode_order_) {
    if (++n % kProgressEvery == 0) Progress("namespace", n, inode_order_.size());
    InodeInfo& info = inodes_[ino];
    const InodeRecord& r = info.record;
    bool dir = IsDirMode(r.mode);
    if (ino == kRootInode) {
      if (r.nlink != 2 + info.subdirs) {
        Add(ProblemKind::kNlink, ino,
            fmt::format("/ (inode 1) has nlink {}, {} expected (2 + {} subdirectories)", r.nlink, 2 + info.subdirs,
                        info.subdirs));
      }
      if (r.parent != kRootInode) {
        Add(ProblemKind::kParent, ino, fmt::format("/ (inode 1) names parent {}, 1 expected", r.parent));
      }
    } else if (info.links == 0) {
      if (r.nlink == 0 && info.orphan) {
        Add(ProblemKind::kOrphan, ino,
            fmt::format("inode {} ({}, {} bytes) is an orphan: unlinked while open; the next mount "
                        "or --repair "
                        "reclaims it",
                        ino, TypeName(r.mode), r.size));
      } else if (r.nlink == 0) {
        Add(ProblemKind::kUnlinkedInode, ino,
            fmt::format("inode {} ({}, {} bytes) has nlink 0 and no orphan record: it is never reclaimed", ino,
                        TypeName(r.mode), r.size));
      } else {
        Add(ProblemKind::kUnreachable, ino,
            fmt::format("inode {} ({}, {} bytes, nlink {}) has no name: no dirent names it{}", ino, TypeName(r.mode),
                        r.size, r.nlink, info.orphan ? " (yet it has an orphan record)" : ""));
      }
    } else {
      if (dir && info.links > 1) {
        Add(ProblemKind::kDirectoryLinks, ino,
            fmt::format("directory {} has {} names (directories have exactly one)", Who(ino), info.links));
      }
      uint32_t expected = dir ? 2 + info.subdirs : info.links;
      if (r.nlink != expected) {
        Add(ProblemKind::kNlink, ino,
            dir ? fmt::format("{} has nlink {}, {} expected (2 + {} subdirectories)", Who(ino), r.nlink, expected,
                              info.subdirs)
                : fmt::format("{} has nlink {}, {} expected ({} dirents name it)", Who(ino), r.nlink, expected,
                              info.links));
      }
      if (dir && r.parent != info.name_parent) {
        Add(ProblemKind::kParent, ino,
            fmt::format("directory {} names parent {}, but it lies in directory {}", Who(ino), r.parent,
                        info.name_parent));
      }
      if (!info.reachable) {
        Add(ProblemKind::kUnreachable, ino,
            fmt::format("inode {} (named {:?} in directory {}) is not reachable from the root (a detached "
                        "directory cycle)",
                        ino, info.name, info.name_parent));
      }
      if (info.orphan) {
        Add(ProblemKind::kStaleOrphan, ino,
            fmt::format("{} is linked but has an orphan record: the next mount would delete it", Who(ino)));
      }
    }
    if (r.allocated_bytes != info.extent_bytes) {
      Add(ProblemKind::kAllocatedBytes, ino,
          fmt::format("{} has allocated_bytes {}, its extents add up to {}", Who(ino), r.allocated_bytes,
                      info.extent_bytes));
    }
  }
  for (InodeNumber ino : orphan_keys_) {
    if (inodes_.find(ino) == inodes_.end()) {
      Add(ProblemKind::kStaleOrphan, ino, fmt::format("orphan record of missing inode {}", ino));
    }
  }
  if (next_ino_ && *next_ino_ <= max_ino_) {
    Add(ProblemKind::kNextIno, 0,
        fmt::format("meta next_ino is {} but inode {} exists: new files would reuse inode numbers", *next_ino_,
                    max_ino_));
  }
}

void Pass::VerifyExtent(const ExtentInfo& e, const std::vector<uint32_t>& sums, const char* data) {
  uint64_t blocks = e.length / bs_;
  report_.bytes_scrubbed += e.length;
  report_.blocks_scrubbed += blocks;
  if (sums.size() != blocks) return;  // reported as kChecksumCount already (or checksums are off)
  uint64_t run_start = 0, run_blocks = 0;
  auto flush = [&] {
    if (run_blocks == 0) return;
    uint64_t file_offset = e.file_offset + run_start * bs_;
    uint64_t physical = e.physical + run_start * bs_;
    Add(ProblemKind::kChecksumMismatch, e.ino,
        fmt::format("{}: {} bytes at file offset {} do not match their checksums (physical {})", Who(e.ino),
                    run_blocks * bs_, file_offset, physical),
        file_offset, physical, run_blocks * bs_);
    run_blocks = 0;
  };
  for (uint64_t b = 0; b < blocks; ++b) {
    bool good = BlockChecksum(data + b * bs_, bs_) == sums[b];
    if (good) {
      flush();
    } else {
      if (run_blocks == 0) run_start = b;
      ++run_blocks;
    }
  }
  flush();
}

void Pass::ScrubBatch(std::vector<std::pair<ExtentInfo, std::vector<uint32_t>>>* batch, AlignedBuffer* buffer) {
  if (batch->empty()) return;
  uint64_t total = 0;
  for (const auto& [e, sums] : *batch) total += e.length;
  buffer->Resize(total);
  std::vector<IoSlice> slices;
  uint64_t at = 0;
  for (const auto& [e, sums] : *batch) {
    slices.push_back(IoSlice{e.physical, buffer->data() + at, e.length});
    at += e.length;
  }
  Status read = volume_.store().ReadSlices(slices);
  at = 0;
  for (size_t i = 0; i < batch->size(); ++i) {
    const auto& [e, sums] = (*batch)[i];
    if (!read.ok()) {
      // Find which extent failed.
      Status one = volume_.store().ReadAt(e.physical, buffer->data() + at, e.length);
      if (!one.ok()) {
        Add(ProblemKind::kReadError, e.ino,
            fmt::format("{}: cannot read {} bytes at file offset {} (physical {}): {}", Who(e.ino), e.length,
                        e.file_offset, e.physical, one.ToString()),
            e.file_offset, e.physical, e.length);
        at += e.length;
        continue;
      }
    }
    VerifyExtent(e, sums, buffer->data() + at);
    at += e.length;
  }
  batch->clear();
}

Status Pass::Scrub() {
  uint64_t total = 0;
  for (const ExtentInfo& e : extents_) {
    if (e.sane && !e.unwritten()) total += e.length;
  }
  auto cursor = index_.NewCursor(Family::kExtent, "");
  std::vector<std::pair<ExtentInfo, std::vector<uint32_t>>> batch;
  uint64_t batch_bytes = 0;
  AlignedBuffer buffer;
  Progress("scrub", 0, total);
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (cursor->key().size() != 16) continue;
    auto record = ExtentRecord::Decode(cursor->value());
    if (!record.ok() || record->unwritten()) continue;
    ExtentInfo e;
    e.ino = keys::DecodeIno(cursor->key());
    e.file_offset = keys::ExtentOffset(cursor->key());
    e.physical = record->physical;
    e.length = record->length;
    e.flags = record->flags;
    if (e.length == 0 || e.length % bs_ != 0 || e.physical % bs_ != 0 || e.physical < sb_.data_offset ||
        e.physical + e.length > sb_.data_size || e.physical + e.length < e.physical) {
      continue;  // reported already; nothing sane to read
    }
    // Large extents are read in pieces of at most one batch.
    const std::vector<uint32_t>& sums = record->block_checksums;
    bool sums_fit = sums.size() == e.length / bs_;
    for (uint64_t done = 0; done < e.length; done += kScrubBatchBytes) {
      ExtentInfo piece = e;
      piece.file_offset += done;
      piece.physical += done;
      piece.length = std::min(kScrubBatchBytes, e.length - done);
      std::vector<uint32_t> piece_sums;
      if (sums_fit) {
        piece_sums.assign(sums.begin() + static_cast<long>(done / bs_),
                          sums.begin() + static_cast<long>((done + piece.length) / bs_));
      }
      if (batch_bytes + piece.length > kScrubBatchBytes && !batch.empty()) {
        ScrubBatch(&batch, &buffer);
        batch_bytes = 0;
        Progress("scrub", report_.bytes_scrubbed, total);
      }
      batch_bytes += piece.length;
      batch.emplace_back(piece, std::move(piece_sums));
    }
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  ScrubBatch(&batch, &buffer);
  Progress("scrub", report_.bytes_scrubbed, total);
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
