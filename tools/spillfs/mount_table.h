// Reads /proc/self/mountinfo: which spillfs volume is mounted where.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace spillfs::cli {

struct MountEntry {
  std::string mountpoint;
  std::string fstype;  // "fuse.spillfs" for ours
  std::string source;  // the volume path for ours
};

std::vector<MountEntry> ReadMountTable();
// The entry mounted exactly at `path` (already canonical), if any; the last
// one wins when mounts are stacked.
std::optional<MountEntry> FindMount(const std::string& path);
// The spillfs mount whose source is `volume` (canonical), if any.
std::optional<MountEntry> FindVolumeMount(const std::string& volume);

inline constexpr const char* kFsType = "fuse.spillfs";

}  // namespace spillfs::cli
