// The checks of fsck's Pass across its whole model: the data area's
// partition into mapped and free space, and the namespace (links, names,
// reachability, inode numbers).
#include "fsck_pass.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <tuple>
#include <unordered_map>

namespace spillfs::fsck::internal {

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

}  // namespace spillfs::fsck::internal
