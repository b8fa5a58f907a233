// /proc/self/mountinfo, parsed once for the daemon (the FUSE connection of its
// mount), the tools (which volume is mounted where) and the client library
// (is a path a spillfs mount). Reading it never touches a mount, which before
// FUSE's INIT is answered would wait.
//
// A line (proc(5)):
//   36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//   id parent major:minor root mountpoint options [optional fields...] - fstype source super-options
// Fields escape space, tab, newline and backslash as \ooo (octal).
#pragma once

#include <fstream>
#include <istream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace spillfs {

struct MountEntry {
  std::string device;      // "major:minor" (for FUSE, the bdi's name; the minor is the connection)
  std::string root;        // the mounted directory inside its file system
  std::string mountpoint;  // canonical
  std::string fstype;      // "fuse.spillfs" for spillfs (control_protocol.h, kFsType)
  std::string source;      // the volume directory for spillfs
};

// `field` with its \ooo escapes decoded.
inline std::string UnescapeMountField(std::string_view field) {
  std::string out;
  out.reserve(field.size());
  auto octal = [](char c) { return c >= '0' && c <= '7'; };
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && octal(field[i + 1]) && octal(field[i + 2]) && octal(field[i + 3])) {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

// The entries of a mountinfo text, in its order (malformed lines skipped).
inline std::vector<MountEntry> ParseMountInfo(std::istream& in) {
  std::vector<MountEntry> entries;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> parts;
    std::string part;
    while (fields >> part) parts.push_back(part);
    // The optional fields start at index 6 and end with "-".
    size_t dash = 6;
    while (dash < parts.size() && parts[dash] != "-") ++dash;
    if (dash + 2 >= parts.size()) continue;
    entries.push_back(MountEntry{parts[2], UnescapeMountField(parts[3]), UnescapeMountField(parts[4]),
                                 UnescapeMountField(parts[dash + 1]), UnescapeMountField(parts[dash + 2])});
  }
  return entries;
}

// This process's mount table.
inline std::vector<MountEntry> ReadMountInfo() {
  std::ifstream in("/proc/self/mountinfo");
  return ParseMountInfo(in);
}

// The entry mounted exactly at canonical `mountpoint`, if any; the last one
// when mounts are stacked (it hides those under it).
inline std::optional<MountEntry> FindMountAt(const std::vector<MountEntry>& table, std::string_view mountpoint) {
  std::optional<MountEntry> found;
  for (const MountEntry& entry : table) {
    if (entry.mountpoint == mountpoint) found = entry;
  }
  return found;
}
inline std::optional<MountEntry> FindMountAt(std::string_view mountpoint) {
  return FindMountAt(ReadMountInfo(), mountpoint);
}

// True when canonical `path` is `mountpoint` or lies below it.
inline bool PathIsUnder(std::string_view path, std::string_view mountpoint) {
  if (mountpoint == "/") return true;
  return path.size() >= mountpoint.size() && path.compare(0, mountpoint.size(), mountpoint) == 0 &&
         (path.size() == mountpoint.size() || path[mountpoint.size()] == '/');
}

// The mount that holds canonical `path`: the longest mount point above it
// (or at it), the last one listed when mounts are stacked.
inline std::optional<MountEntry> FindMountHolding(const std::vector<MountEntry>& table, std::string_view path) {
  std::optional<MountEntry> found;
  for (const MountEntry& entry : table) {
    if (!PathIsUnder(path, entry.mountpoint)) continue;
    if (!found || entry.mountpoint.size() >= found->mountpoint.size()) found = entry;
  }
  return found;
}
inline std::optional<MountEntry> FindMountHolding(std::string_view path) {
  return FindMountHolding(ReadMountInfo(), path);
}

// The first mount of type `fstype` whose source is `source` (for spillfs:
// where volume directory `source` is mounted), if any.
inline std::optional<MountEntry> FindMountOfSource(const std::vector<MountEntry>& table, std::string_view fstype,
                                                   std::string_view source) {
  for (const MountEntry& entry : table) {
    if (entry.fstype == fstype && entry.source == source) return entry;
  }
  return std::nullopt;
}
inline std::optional<MountEntry> FindMountOfSource(std::string_view fstype, std::string_view source) {
  return FindMountOfSource(ReadMountInfo(), fstype, source);
}

}  // namespace spillfs
