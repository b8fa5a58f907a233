#include "spillfs/inspect/inspector.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <ctime>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <unordered_set>
#include <utility>

#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {
namespace {

using nlohmann::json;

constexpr int kMaxSymlinks = 40;  // as Linux's MAXSYMLINKS

// Visits every key of `family` that starts with `prefix`, in order.
template <typename Fn>
Status Scan(const Index& index, Family family, std::string_view prefix, Fn&& fn) {
  auto cursor = index.NewCursor(family, prefix);
  for (cursor->Seek(prefix); cursor->Valid(); cursor->Next()) {
    SPILLFS_RETURN_IF_ERROR(fn(cursor->key(), cursor->value()));
  }
  return cursor->status();
}

// Decodes an extent key + value; Corruption when malformed.
Result<std::pair<uint64_t, ExtentRecord>> DecodeExtent(std::string_view key, std::string_view value) {
  if (key.size() != 16) return Status::Corruption("malformed extent key");
  auto record = ExtentRecord::Decode(value);
  if (!record.ok()) {
    return record.status().WithContext(
        fmt::format("extent of inode {} at {}", keys::DecodeIno(key), keys::ExtentOffset(key)));
  }
  return std::make_pair(keys::ExtentOffset(key), std::move(record).value());
}

// The same without decoding its checksums, where only its place matters (a
// 2.5 GiB checkpoint's extents hold 660,000 of them).
Result<ExtentView> ParseExtent(std::string_view key, std::string_view value) {
  if (key.size() != 16) return Status::Corruption("malformed extent key");
  auto view = ExtentView::Parse(value);
  if (!view.ok()) {
    return view.status().WithContext(
        fmt::format("extent of inode {} at {}", keys::DecodeIno(key), keys::ExtentOffset(key)));
  }
  return view;
}

Result<InodeRecord> LoadInode(const Index& index, InodeNumber ino) {
  auto record = index.GetInode(ino);
  if (!record.ok()) {
    if (record.status().IsNotFound()) return Status::Error(ENOENT, fmt::format("no inode {}", ino));
    return record.status().WithContext(fmt::format("inode {}", ino));
  }
  return record;
}

// Bytes covered by the union of [offset, offset + length) ranges.
uint64_t UnionBytes(std::vector<std::pair<uint64_t, uint64_t>>* ranges) {
  std::sort(ranges->begin(), ranges->end());
  uint64_t total = 0;
  uint64_t covered_to = 0;  // end of what has been counted so far
  bool any = false;
  for (const auto& [offset, length] : *ranges) {
    uint64_t end = offset + length;
    if (!any || offset >= covered_to) {
      total += length;
      covered_to = end;
      any = true;
    } else if (end > covered_to) {
      total += end - covered_to;
      covered_to = end;
    }
  }
  return total;
}

std::vector<std::string> SplitPath(std::string_view path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) parts.emplace_back(path.substr(i, j - i));
    i = j + 1;
  }
  return parts;
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty() || dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

// The volume path in canonical form: leading '/', no repeated or trailing
// slashes ("." and ".." are kept as given).
std::string CanonicalPath(std::string_view path) {
  std::string out;
  for (const std::string& part : SplitPath(path)) out += "/" + part;
  return out.empty() ? "/" : out;
}

std::string BaseName(const std::string& path) {
  auto parts = SplitPath(path);
  return parts.empty() ? "/" : parts.back();
}

std::string Rfc3339(int64_t ns) {
  int64_t sec = ns / 1000000000;
  int64_t frac = ns % 1000000000;
  if (frac < 0) {
    frac += 1000000000;
    --sec;
  }
  time_t t = static_cast<time_t>(sec);
  struct tm tm {};
  if (gmtime_r(&t, &tm) == nullptr) return "";
  char buf[64];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:09d}Z", buf, frac);
}

std::string ChecksumHex(const std::vector<uint32_t>& sums) {
  std::string bytes;
  bytes.reserve(sums.size() * 4);
  for (uint32_t v : sums) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  return fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
}

// Blob reference counts, computed at most once per call and only when an
// extent with a blob id is met.
struct BlobCache {
  std::optional<std::unordered_map<uint64_t, uint64_t>> refs;
};

}  // namespace

const char* FileTypeName(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "file";
    case S_IFDIR:
      return "dir";
    case S_IFLNK:
      return "symlink";
    case S_IFIFO:
      return "fifo";
    case S_IFSOCK:
      return "socket";
    case S_IFCHR:
      return "chardev";
    case S_IFBLK:
      return "blockdev";
    default:
      return "unknown";
  }
}

Inspector::Inspector(const Index& index, const Superblock& superblock) : index_(index), superblock_(superblock) {}

Result<InodeNumber> Inspector::ResolvePath(std::string_view path) const {
  std::deque<std::string> parts;
  for (auto& part : SplitPath(path)) parts.push_back(std::move(part));
  bool want_dir = !path.empty() && path.back() == '/';
  InodeNumber current = kRootInode;
  int links = 0;
  while (!parts.empty()) {
    std::string name = std::move(parts.front());
    parts.pop_front();
    if (name == ".") continue;
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord dir, LoadInode(index_, current));
    if (!S_ISDIR(dir.mode)) {
      return Status::Error(ENOTDIR, fmt::format("{}: not a directory", path));
    }
    if (name == "..") {
      current = dir.parent != 0 ? dir.parent : kRootInode;
      continue;
    }
    auto dirent = index_.GetDirent(current, name);
    if (!dirent.ok()) {
      if (dirent.status().IsNotFound()) {
        return Status::Error(ENOENT, fmt::format("{}: no such file or directory", path));
      }
      return dirent.status().WithContext(std::string(path));
    }
    if (S_ISLNK(dirent->type) && (!parts.empty() || want_dir)) {
      if (++links > kMaxSymlinks) {
        return Status::Error(ELOOP, fmt::format("{}: too many levels of symbolic links", path));
      }
      SPILLFS_ASSIGN_OR_RETURN(InodeRecord link, LoadInode(index_, dirent->ino));
      if (link.symlink_target.empty() || link.symlink_target.front() == '/') {
        return Status::Error(ENOTDIR, fmt::format("{}: {} is a symbolic link to '{}', which names no path "
                                                  "inside the volume",
                                                  path, name, link.symlink_target));
      }
      auto target = SplitPath(link.symlink_target);
      parts.insert(parts.begin(), target.begin(), target.end());
      continue;  // resolved relative to `current`
    }
    current = dirent->ino;
  }
  if (want_dir) {
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord last, LoadInode(index_, current));
    if (!S_ISDIR(last.mode)) return Status::Error(ENOTDIR, fmt::format("{}: not a directory", path));
  }
  return current;
}

Result<std::unordered_map<uint64_t, uint64_t>> Inspector::BlobReferences() const {
  std::unordered_map<uint64_t, uint64_t> refs;
  SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kExtent, "", [&](auto key, auto value) {
    SPILLFS_ASSIGN_OR_RETURN(ExtentView extent, ParseExtent(key, value));
    if (extent.blob_id != 0) ++refs[extent.blob_id];
    return Status::OK();
  }));
  return refs;
}

nlohmann::json Inspector::Volume() const {
  nlohmann::json out;
  out["uuid"] = superblock_.UuidString();
  out["format_version"] = superblock_.format_version;
  out["block_size"] = superblock_.block_size;
  out["checksums"] = superblock_.checksums;
  out["dedup"] = superblock_.dedup;
  return out;
}

Result<nlohmann::json> Inspector::Stat(const RuntimeStats& runtime) const {
  uint64_t inodes = 0, files = 0, directories = 0, symlinks = 0, special = 0;
  uint64_t logical = 0;
  SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kInode, "", [&](auto key, auto value) {
    if (key.size() != 8) return Status::Corruption("malformed inode key");
    auto record = InodeRecord::Decode(value);
    if (!record.ok()) return record.status().WithContext(fmt::format("inode {}", keys::DecodeIno(key)));
    ++inodes;
    uint32_t type = record->mode & S_IFMT;
    if (type == S_IFREG) {
      ++files;
      logical += record->size;
    } else if (type == S_IFDIR) {
      ++directories;
    } else if (type == S_IFLNK) {
      ++symlinks;
    } else {
      ++special;
    }
    return Status::OK();
  }));

  uint64_t orphans = 0;
  SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kOrphan, "", [&](auto, auto) {
    ++orphans;
    return Status::OK();
  }));

  uint64_t referenced = 0, extents = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kExtent, "", [&](auto key, auto value) {
    SPILLFS_ASSIGN_OR_RETURN(ExtentView extent, ParseExtent(key, value));
    ++extents;
    referenced += extent.length;
    ranges.emplace_back(extent.physical, extent.length);
    return Status::OK();
  }));
  uint64_t physical = UnionBytes(&ranges);

  uint64_t capacity =
      superblock_.data_size > superblock_.data_offset ? superblock_.data_size - superblock_.data_offset : 0;
  uint64_t free_bytes = 0;
  if (runtime.has_free_bytes) {
    free_bytes = runtime.free_bytes;
  } else {
    SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kFree, "", [&](auto key, auto value) {
      coding::Reader reader(value);
      uint64_t length = 0;
      if (key.size() != 8 || !reader.GetVarint64(&length)) {
        return Status::Corruption("malformed free-space record");
      }
      free_bytes += length;
      return Status::OK();
    }));
  }
  free_bytes = std::min(free_bytes, capacity);

  json out = Volume();
  out["capacity_bytes"] = capacity;
  out["used_bytes"] = capacity - free_bytes;
  out["free_bytes"] = free_bytes;
  out["logical_bytes"] = logical;
  out["referenced_bytes"] = referenced;
  out["physical_bytes"] = physical;
  out["dedup_ratio"] = physical == 0 ? 1.0 : static_cast<double>(referenced) / static_cast<double>(physical);
  out["inodes"] = inodes;
  out["files"] = files;
  out["directories"] = directories;
  out["symlinks"] = symlinks;
  out["special_files"] = special;
  out["orphans"] = orphans;
  out["extents"] = extents;
  out["index_bytes"] = index_.ApproximateSizeBytes();
  out["data_sync_failed"] = !runtime.data_sync_error.empty();
  out["data_sync_error"] = runtime.data_sync_error.empty() ? json() : json(runtime.data_sync_error);
  // The daemon's counters, as RuntimeStats holds them.
  for (const StatKey& key : kStatKeys) {
    if (key.count != nullptr) out[key.key] = runtime.*key.count;
    if (key.seconds != nullptr) out[key.key] = runtime.*key.seconds;
    if (key.flag != nullptr) out[key.key] = runtime.*key.flag;
  }
  return out;
}

namespace {

Result<json> ExtentsOf(const Index& index, InodeNumber ino,
                       const std::function<Result<std::unordered_map<uint64_t, uint64_t>>()>& refs_fn,
                       BlobCache* cache) {
  json list = json::array();
  std::string prefix = keys::Ino(ino);
  SPILLFS_RETURN_IF_ERROR(Scan(index, Family::kExtent, prefix, [&](auto key, auto value) {
    SPILLFS_ASSIGN_OR_RETURN(auto extent, DecodeExtent(key, value));
    const ExtentRecord& r = extent.second;
    uint64_t shared = 1;
    if (r.blob_id != 0) {
      if (!cache->refs) {
        SPILLFS_ASSIGN_OR_RETURN(cache->refs, refs_fn());
      }
      auto it = cache->refs->find(r.blob_id);
      shared = it == cache->refs->end() ? 1 : std::max<uint64_t>(1, it->second);
    }
    json e;
    e["file_offset"] = extent.first;
    e["physical_offset"] = r.physical;
    e["length"] = r.length;
    e["checksum"] = r.block_checksums.empty() ? json(nullptr) : json(ChecksumHex(r.block_checksums));
    e["shared"] = shared;
    e["unwritten"] = r.unwritten();
    e["blob_id"] = r.blob_id;
    list.push_back(std::move(e));
    return Status::OK();
  }));
  return list;
}

}  // namespace

Result<nlohmann::json> Inspector::Extents(InodeNumber ino) const {
  SPILLFS_RETURN_IF_ERROR(LoadInode(index_, ino).status());
  BlobCache cache;
  return ExtentsOf(
      index_, ino, [this] { return BlobReferences(); }, &cache);
}

Result<nlohmann::json> Inspector::Ls(const std::vector<std::string>& paths, const LsOptions& options) const {
  BlobCache cache;
  auto refs_fn = [this] { return BlobReferences(); };
  auto entry = [&](const std::string& path, std::string name, InodeNumber ino, const InodeRecord& r) -> Result<json> {
    json o;
    o["path"] = path;
    o["name"] = std::move(name);
    o["ino"] = ino;
    o["type"] = FileTypeName(r.mode);
    o["mode"] = r.mode;
    o["size"] = r.size;
    o["nlink"] = r.nlink;
    o["uid"] = r.uid;
    o["gid"] = r.gid;
    o["mtime_ns"] = r.mtime_ns;
    o["mtime"] = Rfc3339(r.mtime_ns);
    o["allocated_bytes"] = r.allocated_bytes;
    if (S_ISLNK(r.mode)) o["target"] = r.symlink_target;
    if (options.long_format) {
      o["atime_ns"] = r.atime_ns;
      o["ctime_ns"] = r.ctime_ns;
      o["btime_ns"] = r.btime_ns;
      o["generation"] = r.generation;
      o["flags"] = r.flags;
      o["ephemeral"] = (r.flags & kInodeEphemeral) != 0;
      o["unsettled"] = (r.flags & kInodeUnsettled) != 0;
      o["rdev"] = r.rdev;
    }
    if (options.extents) {
      SPILLFS_ASSIGN_OR_RETURN(o["extents"], ExtentsOf(index_, ino, refs_fn, &cache));
    }
    return o;
  };

  json list = json::array();
  for (const std::string& raw : paths) {
    SPILLFS_ASSIGN_OR_RETURN(InodeNumber ino, ResolvePath(raw));
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord record, LoadInode(index_, ino));
    std::string path = CanonicalPath(raw);
    if (!S_ISDIR(record.mode) || options.directory) {
      SPILLFS_ASSIGN_OR_RETURN(json o, entry(path, BaseName(path), ino, record));
      list.push_back(std::move(o));
      continue;
    }
    std::string prefix = keys::Ino(ino);
    std::vector<std::pair<std::string, InodeNumber>> children;
    SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kDirent, prefix, [&](auto key, auto value) {
      if (key.size() <= 8) return Status::Corruption("malformed dirent key");
      SPILLFS_ASSIGN_OR_RETURN(DirentRecord d, DirentRecord::Decode(value));
      children.emplace_back(std::string(keys::DirentName(key)), d.ino);
      return Status::OK();
    }));
    for (auto& [name, child] : children) {
      SPILLFS_ASSIGN_OR_RETURN(InodeRecord r, LoadInode(index_, child));
      SPILLFS_ASSIGN_OR_RETURN(json o, entry(JoinPath(path, name), name, child, r));
      list.push_back(std::move(o));
    }
  }
  return list;
}

Result<nlohmann::json> Inspector::Du(std::string_view path) const {
  SPILLFS_ASSIGN_OR_RETURN(InodeNumber top, ResolvePath(path));
  uint64_t logical = 0, referenced = 0, files = 0, directories = 0, symlinks = 0, special = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::unordered_set<InodeNumber> seen{top};
  std::vector<InodeNumber> pending{top};
  while (!pending.empty()) {
    InodeNumber ino = pending.back();
    pending.pop_back();
    SPILLFS_ASSIGN_OR_RETURN(InodeRecord r, LoadInode(index_, ino));
    uint32_t type = r.mode & S_IFMT;
    if (type == S_IFDIR) {
      ++directories;
      SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kDirent, keys::Ino(ino), [&](auto, auto value) {
        SPILLFS_ASSIGN_OR_RETURN(DirentRecord d, DirentRecord::Decode(value));
        if (seen.insert(d.ino).second) pending.push_back(d.ino);
        return Status::OK();
      }));
      continue;
    }
    if (type == S_IFREG) {
      ++files;
      logical += r.size;
    } else if (type == S_IFLNK) {
      ++symlinks;
    } else {
      ++special;
    }
    SPILLFS_RETURN_IF_ERROR(Scan(index_, Family::kExtent, keys::Ino(ino), [&](auto key, auto value) {
      SPILLFS_ASSIGN_OR_RETURN(auto extent, DecodeExtent(key, value));
      referenced += extent.second.length;
      ranges.emplace_back(extent.second.physical, extent.second.length);
      return Status::OK();
    }));
  }
  json out;
  out["path"] = CanonicalPath(path);
  out["logical_bytes"] = logical;
  out["referenced_bytes"] = referenced;
  out["physical_bytes"] = UnionBytes(&ranges);
  out["files"] = files;
  out["directories"] = directories;
  out["symlinks"] = symlinks;
  out["special_files"] = special;
  return out;
}

}  // namespace spillfs
