#include "support/env.h"

#include <cstdlib>

namespace spillfs::testing {

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10) : fallback;
}

}  // namespace spillfs::testing
