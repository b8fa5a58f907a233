// Stand-in (see README): host hashing only.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "spillfs/common/block_checksum.h"
#include "spillfs/common/status.h"

namespace spillfs::cuda {
struct Hash128 {
  uint64_t low64, high64;
};
inline Status UnitHashes(const void*, size_t, size_t, Hash128*, uintptr_t) {
  return Status::Error(ENODEV, "built without CUDA");
}
inline Status UnitHashesHost(const void* ptr, size_t length, size_t unit_bytes, Hash128* out) {
  for (size_t i = 0; (i + 1) * unit_bytes <= length; ++i) {
    XXH128_hash_t h = ContentHash128(static_cast<const char*>(ptr) + i * unit_bytes, unit_bytes);
    out[i] = Hash128{h.low64, h.high64};
  }
  return Status::OK();
}
}  // namespace spillfs::cuda
