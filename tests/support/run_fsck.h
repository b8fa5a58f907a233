// RunFsck: `spillfs fsck` on a volume, as the mounted suites see it.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace spillfs::testing {

struct FsckResult {
  int rc = -1;
  std::string output;           // stdout and stderr
  nlohmann::json report;        // the --json report; null where none was parsed
  std::set<std::string> kinds;  // kinds of the problems the report lists
};

// Runs `spillfs fsck VOLUME [--json] FLAGS`.
FsckResult RunFsck(const std::string& volume, const std::string& flags = "", bool json = true);

}  // namespace spillfs::testing
