#include "mount_table.h"

#include <fstream>
#include <sstream>

namespace spillfs::cli {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      int value = 0;
      bool octal = true;
      for (size_t j = 1; j <= 3; ++j) {
        char c = field[i + j];
        if (c < '0' || c > '7') octal = false;
        value = value * 8 + (c - '0');
      }
      if (octal) {
        out.push_back(static_cast<char>(value));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

}  // namespace

std::vector<MountEntry> ReadMountTable() {
  std::vector<MountEntry> entries;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> parts;
    std::string part;
    while (fields >> part) parts.push_back(part);
    size_t dash = 0;
    while (dash < parts.size() && parts[dash] != "-") ++dash;
    if (parts.size() < 5 || dash + 2 >= parts.size()) continue;
    entries.push_back(MountEntry{Unescape(parts[4]), parts[dash + 1], Unescape(parts[dash + 2])});
  }
  return entries;
}

std::optional<MountEntry> FindMount(const std::string& path) {
  std::optional<MountEntry> found;
  for (auto& entry : ReadMountTable()) {
    if (entry.mountpoint == path) found = entry;
  }
  return found;
}

std::optional<MountEntry> FindVolumeMount(const std::string& volume) {
  for (auto& entry : ReadMountTable()) {
    if (entry.fstype == kFsType && entry.source == volume) return entry;
  }
  return std::nullopt;
}

}  // namespace spillfs::cli
