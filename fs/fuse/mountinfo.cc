#include "fuse/mountinfo.h"

#include <fstream>
#include <sstream>

namespace spillfs {

std::optional<std::string> MountDevice(const std::string& mountpoint) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  std::optional<std::string> found;
  while (std::getline(mountinfo, line)) {
    std::istringstream fields(line);
    std::string id, parent, device, root, point;
    // The last match: a mount stacked on the same point hides those under it.
    if (fields >> id >> parent >> device >> root >> point && point == mountpoint) found = device;
  }
  return found;
}

}  // namespace spillfs
