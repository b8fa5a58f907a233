// ReadBytes: the bytes of one Filesystem::Read as a string, for the unit
// tests that drive the POSIX core directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "spillfs/core/filesystem.h"

namespace spillfs::testing {

Result<std::string> ReadBytes(Filesystem& fs, InodeNumber ino, uint64_t offset, size_t size);

}  // namespace spillfs::testing
