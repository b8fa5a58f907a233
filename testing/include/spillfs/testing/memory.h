// Out-of-memory injection (test-only, target spillfs_testing): a RAM tier
// whose memory runs out on cue, through the product's seam
// BufferPool::SlabFault (FilesystemOptions::ram_tier_slab_fault). A write
// that needs a fresh chunk then fails with ENOMEM, as it would where the
// system has no memory left, and the mount goes on serving.
#pragma once

#include <cstdint>

#include "spillfs/store/buffer_pool.h"

namespace spillfs::memory {

// Makes spillfs-faulty's RAM tier fail every slab mapping after the first N
// (a slab is 32 MiB: 128 chunks).
inline constexpr const char* kRamTierSlabsEnv = "SPILLFS_FAULTY_RAM_TIER_SLABS";

// Lets `slabs` mappings through, then fails every later one.
BufferPool::SlabFault FailSlabsAfter(uint64_t slabs);

}  // namespace spillfs::memory
