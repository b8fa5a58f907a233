// Internal to fsck (not installed): the model that one Pass reads from the
// index, with its checks (fsck_pass.cc), and the repair that edits that model
// and writes it back (fsck_repair.cc). fsck.cc's Checker drives them: a
// Pass, a repair of what it found, and a second Pass that verifies it.
#pragma once

#include <sys/stat.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "spillfs/common/aligned_buffer.h"
#include "spillfs/common/rounding.h"
#include "spillfs/inspect/fsck.h"
#include "spillfs/kvindex/records.h"

namespace spillfs::fsck::internal {

inline constexpr uint64_t kScrubBatchBytes = 16ull << 20;
inline constexpr uint64_t kProgressEvery = 4096;  // records between progress calls
inline constexpr size_t kMaxPathDepth = 4096;
inline constexpr const char* kLostAndFound = "lost+found";

// "file", "directory", ... for the type bits of `mode`.
const char* TypeName(uint32_t mode);

inline bool IsDirMode(uint32_t mode) { return S_ISDIR(mode); }

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

// An extent as the report lists it (file offset, physical, length, flags,
// blob), with what the pass keeps beside it.
struct ExtentInfo : FileExtents::Extent {
  InodeNumber ino = 0;
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

  // Visits every record of `family` in key order, calling Progress(phase)
  // every kProgressEvery records (never where `phase` is empty); the
  // cursor's status at the end.
  Status EachRecord(Family family, std::string_view phase,
                    const std::function<void(std::string_view key, std::string_view value)>& visit);
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
  Status ScrubBatch(std::vector<std::pair<ExtentInfo, std::vector<uint32_t>>>* batch, AlignedBuffer* buffer);
  void VerifyExtent(const ExtentInfo& e, const std::vector<uint32_t>& sums, const char* data);

  std::unordered_map<InodeNumber, std::string> dir_paths_;
  std::map<ProblemKind, uint64_t> per_kind_;
};

// Fixes what `pass` found (the repairable kinds): edits its model and writes
// one index batch that brings the index in line with it.
Status Repair(Pass& pass);

}  // namespace spillfs::fsck::internal
