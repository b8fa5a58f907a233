// Internal to spillfs_cuda, its tests and its bench: the hash kernels with
// their shape chosen by the caller, to compare shapes on a GPU. The public
// UnitHashes / BlockChecksums use the defaults below.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spillfs/common/status.h"

namespace spillfs::cuda::internal {

struct HashLaunch {
  // Threads sharing one unit's 8 lanes: 1, 2, 4 (each owns whole lane pairs,
  // 16-byte loads) or 8 (one lane each, 8-byte loads, words traded by warp
  // shuffle). 0 means the one-thread reference code of xxh3.h, whatever the
  // buffer's shape.
  int threads_per_unit = 4;
  int block_threads = 256;
};

// The defaults, per kernel (see the measurements in hash_kernels.cu).
HashLaunch DefaultUnitLaunch();
HashLaunch DefaultBlockLaunch();

// wide: XXH3-128 per whole unit into out_host (Hash128[]); else the low 32
// bits of XXH3-64 per unit, the partial last one included (uint32_t[]).
Status LaunchHashes(const void* device_ptr, size_t length, size_t unit_bytes, bool wide, void* out_host,
                    uintptr_t stream, const HashLaunch& launch);

}  // namespace spillfs::cuda::internal
