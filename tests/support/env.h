// Knobs of the long-running suites (iterations, seeds, durations), read from
// the environment.
#pragma once

#include <cstdint>

namespace spillfs::testing {

// The environment variable `name` as a number, or `fallback` where it is unset or empty.
uint64_t EnvU64(const char* name, uint64_t fallback);

}  // namespace spillfs::testing
