#include "support/run_fsck.h"

#include "support/mounted_volume.h"

namespace spillfs::testing {

FsckResult RunFsck(const std::string& volume, const std::string& flags, bool json) {
  FsckResult result;
  result.rc = RunSpillfs("fsck " + volume + (json ? " --json " : " ") + flags, &result.output);
  size_t start = result.output.find('{');
  if (json && start != std::string::npos) {
    result.report = nlohmann::json::parse(result.output.substr(start), nullptr, false);
    if (result.report.is_discarded()) {
      result.report = nullptr;
    } else if (result.report.contains("problems")) {
      for (const auto& p : result.report["problems"]) result.kinds.insert(p.value("kind", "?"));
    }
  }
  return result;
}

}  // namespace spillfs::testing
