// Human sizes: parsing "512M", "1G", "4096" and printing "1.5 GiB".
#pragma once

#include <cstdint>
#include <string>

#include "spillfs/common/status.h"

namespace spillfs::cli {

// Accepts a number with an optional K/M/G/T/P suffix (powers of 1024,
// optionally followed by "iB" or "B").
Result<uint64_t> ParseSize(const std::string& text);
std::string HumanBytes(uint64_t bytes);

}  // namespace spillfs::cli
