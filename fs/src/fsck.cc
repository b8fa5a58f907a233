// The consistency checker (see fsck.h for the invariants it checks).
//
// One Pass reads the whole index into a compact model (inodes, dirents,
// extents without their checksums, free list) and checks it, collecting
// problems. Repair edits that model, writes one index batch that brings the
// index in line with it, and a second Pass verifies the result.
#include "spillfs/fs/fsck.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "spillfs/fs/aligned_buffer.h"
#include "spillfs/fs/clock.h"
#include "spillfs/kvindex/block_checksum.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs::fsck {
namespace {

constexpr uint64_t kScrubBatchBytes = 16ull << 20;
constexpr uint64_t kProgressEvery = 4096;  // records between progress calls
constexpr size_t kMaxPathDepth = 4096;
constexpr const char* kLostAndFound = "lost+found";

uint64_t RoundUp(uint64_t value, uint64_t unit) { return (value + unit - 1) / unit * unit; }
uint64_t RoundDown(uint64_t value, uint64_t unit) { return value / unit * unit; }

bool IsDirMode(uint32_t mode) { return S_ISDIR(mode); }

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

// Problems a repair may fix; the others stay unrepaired without a recheck.
bool Repairable(ProblemKind kind) {
  switch (kind) {
    case ProblemKind::kNextIno:
    case ProblemKind::kDataPastEof:
    case ProblemKind::kStrayExtent:
    case ProblemKind::kDoubleUse:
    case ProblemKind::kFreeOverlap:
    case ProblemKind::kLeak:
    case ProblemKind::kDanglingDirent:
    case ProblemKind::kDirentType:
    case ProblemKind::kNlink:
    case ProblemKind::kParent:
    case ProblemKind::kUnreachable:
    case ProblemKind::kAllocatedBytes:
    case ProblemKind::kOrphan:
    case ProblemKind::kUnlinkedInode:
    case ProblemKind::kStaleOrphan:
    case ProblemKind::kStrayXattr:
    case ProblemKind::kBlob:
      return true;
    default:
      return false;
  }
}

struct InodeInfo {
  InodeRecord record;
  uint32_t links = 0;    // live dirents naming it
  uint32_t subdirs = 0;  // live dirents in it naming directories
  uint32_t entries = 0;  // live dirents in it
  uint64_t extent_bytes = 0;
  InodeNumber name_parent = 0;  // directory of the first dirent naming it
  std::string name;             // that dirent's name
  bool orphan = false;
  bool reachable = false;
  bool removed = false;  // repair: reclaimed
};

struct DirentInfo {
  InodeNumber parent = 0;
  std::string name;
  DirentRecord record;
  bool live = false;  // decodes, names a live inode in a live directory
};

struct ExtentInfo {
  InodeNumber ino = 0;
  uint64_t file_offset = 0;
  uint64_t physical = 0;
  uint64_t length = 0;
  uint32_t flags = 0;
  uint64_t blob_id = 0;
  uint64_t checksums = 0;
  bool sane = true;      // aligned, non-empty, inside the data area
  bool removed = false;  // repair: unmapped
  bool unwritten() const { return (flags & kExtentUnwritten) != 0; }
};

struct FreeInfo {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool sane = true;
};

using ProblemKey = std::tuple<int, InodeNumber, uint64_t, uint64_t>;

ProblemKey KeyOf(const Problem& p) {
  return {static_cast<int>(p.kind), p.ino, p.file_offset.value_or(UINT64_MAX), p.physical.value_or(UINT64_MAX)};
}

// One read of the whole index, with its checks.
class Pass {
 public:
  Pass(Volume& volume, const Checker::Options& options, bool scrub)
      : volume_(volume),
        index_(volume.index()),
        options_(options),
        scrub_(scrub),
        sb_(volume.superblock()),
        bs_(sb_.block_size) {}

  Status Run();

  // The model, for repair.
  Volume& volume_;
  Index& index_;
  const Checker::Options& options_;
  const bool scrub_;
  const Superblock sb_;
  const uint64_t bs_;
  std::unordered_map<InodeNumber, InodeInfo> inodes_;
  std::vector<InodeNumber> inode_order_;  // key order
  std::vector<DirentInfo> dirents_;
  std::vector<ExtentInfo> extents_;  // key order: by inode, then file offset
  std::vector<FreeInfo> free_;
  std::map<uint64_t, BlobRecord> blobs_;    // physical -> record (dedup blobs own their whole range)
  std::vector<std::string> bad_free_keys_;  // undecodable free records (rebuilt by repair)
  std::set<InodeNumber> orphan_keys_;
  std::map<InodeNumber, std::vector<std::string>> stray_xattrs_;  // missing owner -> keys
  std::optional<uint64_t> next_ino_;
  InodeNumber max_ino_ = 0;
  Report report_;

  std::string PathOf(InodeNumber ino);
  std::string Who(InodeNumber ino);

 private:
  void Add(ProblemKind kind, InodeNumber ino, std::string message, std::optional<uint64_t> file_offset = {},
           std::optional<uint64_t> physical = {}, std::optional<uint64_t> length = {});
  void Progress(std::string_view phase, uint64_t done, uint64_t total = 0) {
    if (options_.progress) options_.progress(phase, done, total);
  }

  Status CheckMeta();
  Status ScanInodes();
  Status ScanDirents();
  Status ScanOrphans();
  Status ScanXattrs();
  Status ScanExtents();
  Status ScanFree();
  Status ScanBlobs();
  void CheckSpace();
  void CheckNamespace();
  Status Scrub();
  void ScrubBatch(std::vector<std::pair<ExtentInfo, std::vector<uint32_t>>>* batch, AlignedBuffer* buffer);
  void VerifyExtent(const ExtentInfo& e, const std::vector<uint32_t>& sums, const char* data);

  std::unordered_map<InodeNumber, std::string> dir_paths_;
  std::map<ProblemKind, uint64_t> per_kind_;
};

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

// ---------------------------------------------------------------- repair

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
      batch_.Delete(Family::kBlob, keys::BlobByHash(blob.hash));
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

const char* ProblemKindName(ProblemKind kind) {
  switch (kind) {
    case ProblemKind::kSuperblock:
      return "superblock";
    case ProblemKind::kBadRecord:
      return "bad-record";
    case ProblemKind::kNextIno:
      return "next-ino";
    case ProblemKind::kExtentRange:
      return "extent-range";
    case ProblemKind::kExtentAlignment:
      return "extent-alignment";
    case ProblemKind::kChecksumCount:
      return "checksum-count";
    case ProblemKind::kExtentOverlap:
      return "extent-overlap";
    case ProblemKind::kDataPastEof:
      return "data-past-eof";
    case ProblemKind::kStrayExtent:
      return "stray-extent";
    case ProblemKind::kDoubleUse:
      return "double-use";
    case ProblemKind::kFreeOverlap:
      return "free-list";
    case ProblemKind::kLeak:
      return "leak";
    case ProblemKind::kDanglingDirent:
      return "dangling-dirent";
    case ProblemKind::kDirentType:
      return "dirent-type";
    case ProblemKind::kDirectoryLinks:
      return "directory-links";
    case ProblemKind::kNlink:
      return "nlink";
    case ProblemKind::kParent:
      return "parent";
    case ProblemKind::kUnreachable:
      return "unreachable";
    case ProblemKind::kAllocatedBytes:
      return "allocated-bytes";
    case ProblemKind::kOrphan:
      return "orphan";
    case ProblemKind::kUnlinkedInode:
      return "unlinked-inode";
    case ProblemKind::kStaleOrphan:
      return "stale-orphan";
    case ProblemKind::kStrayXattr:
      return "stray-xattr";
    case ProblemKind::kBlob:
      return "blob";
    case ProblemKind::kChecksumMismatch:
      return "checksum-mismatch";
    case ProblemKind::kReadError:
      return "read-error";
  }
  return "unknown";
}

Checker::Checker(Volume& volume, Options options) : volume_(volume), options_(std::move(options)) {}

Result<Report> Checker::Run() {
  Pass first(volume_, options_, options_.scrub);
  SPILLFS_RETURN_IF_ERROR(first.Run());
  Report report = std::move(first.report_);
  report.repair = options_.repair;
  if (!options_.repair || report.problems_found == 0) return report;

  // The repair edits the first pass's model; a second pass verifies it.
  if (options_.progress) options_.progress("repair", 0, 0);
  Repairer repairer(first);
  Status repaired = repairer.Run();
  if (!repaired.ok()) return repaired.WithContext("repair");
  Checker::Options verify_options;
  verify_options.max_problems_per_kind = options_.max_problems_per_kind;
  verify_options.progress = options_.progress;
  Pass verify(volume_, verify_options, /*scrub=*/false);
  SPILLFS_RETURN_IF_ERROR(verify.Run());
  const Report& after = verify.report_;

  std::set<ProblemKey> left;
  for (const Problem& p : after.problems) left.insert(KeyOf(p));
  std::set<ProblemKey> before;
  for (Problem& p : report.problems) {
    before.insert(KeyOf(p));
    auto count = after.problem_counts.find(ProblemKindName(p.kind));
    uint64_t remaining = count == after.problem_counts.end() ? 0 : count->second;
    // Only a kind whose list was not cut short can be matched one by one.
    p.repaired = Repairable(p.kind) && left.count(KeyOf(p)) == 0 && remaining < options_.max_problems_per_kind;
  }
  for (const Problem& p : after.problems) {
    if (before.count(KeyOf(p)) != 0) continue;
    Problem added = p;
    added.message = "after repair: " + added.message;
    report.problems.push_back(std::move(added));
  }
  // The verifying pass does not scrub: bad blocks found by the first remain.
  uint64_t scrub_problems = 0;
  for (ProblemKind kind : {ProblemKind::kChecksumMismatch, ProblemKind::kReadError}) {
    auto count = report.problem_counts.find(ProblemKindName(kind));
    if (count != report.problem_counts.end()) scrub_problems += count->second;
  }
  report.problems_remaining = after.problems_found + scrub_problems;
  return report;
}

}  // namespace spillfs::fsck
