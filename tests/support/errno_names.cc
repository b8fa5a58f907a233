#include "support/errno_names.h"

#include <cstring>

namespace spillfs::testing {

std::string ErrnoName(int e) {
  if (e == 0) return "success";
  if (e < 0) return "child process failure " + std::to_string(e);
  const char* name = strerrorname_np(e);
  return name != nullptr ? name : std::to_string(e);
}

}  // namespace spillfs::testing
