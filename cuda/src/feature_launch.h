// Internal to spillfs_cuda (CUDA builds): the kernels of FeatureCache
// (feature_kernels.cu), launched by feature_cache.cc on the caller's stream.
// Every pointer is a device pointer (HBM, or the device alias of pinned,
// mapped host memory). A warp per row (or per line); rows are copied in 16-,
// 4- or 1-byte words by the warp's lanes as alignment allows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spillfs/common/status.h"

namespace spillfs::cuda::internal {

struct FeatureGeometry {
  uint64_t row_bytes = 0;
  uint64_t rows_per_line = 1;
  uint64_t line_bytes = 0;
};

// counters: [0] gpu hits, [1] hot hits, [2] ring entries (misses); zeroed by
// the caller. ring: 2 x ring_capacity int64 (row, position) pairs.
struct GatherLaunch {
  FeatureGeometry g;
  const int64_t* index = nullptr;
  size_t n = 0;
  char* out = nullptr;
  const char* lines = nullptr;
  const int32_t* slot_of_line = nullptr;
  const int32_t* hot_slot_of_line = nullptr;
  const char* hot = nullptr;
  uint32_t* stamps = nullptr;
  uint32_t stamp = 0;
  unsigned long long* counters = nullptr;
  int64_t* ring = nullptr;
  unsigned long long ring_capacity = 0;
};
Status LaunchGather(const GatherLaunch& a, uintptr_t stream);

struct FillLaunch {
  FeatureGeometry g;
  // Evictions.
  size_t n_evicted = 0;
  const int64_t* evicted_lines = nullptr;
  const int64_t* evicted_slots = nullptr;
  const int64_t* victim_slots = nullptr;
  char* victim = nullptr;
  // Staged lines (in HBM) and their slots.
  size_t n_staged = 0;
  const char* staging = nullptr;
  const int64_t* staged_lines = nullptr;
  const int64_t* install_slots = nullptr;
  // Ring entries served.
  size_t n_entries = 0;
  const int64_t* entry_rows = nullptr;
  const int64_t* entry_positions = nullptr;
  const int64_t* entry_staged = nullptr;
  char* out = nullptr;
  // The cache.
  char* lines = nullptr;
  int32_t* slot_of_line = nullptr;
  uint32_t* stamps = nullptr;
  uint32_t stamp = 0;
};
// Evictions (kernel 1) then, after the caller's copy of staging to HBM,
// scatter and install (kernels 2 and 3): two calls around the copy.
Status LaunchEvict(const FillLaunch& a, uintptr_t stream);
Status LaunchScatterInstall(const FillLaunch& a, uintptr_t stream);

// Sets slot_of_line[lines[i]] = i (hot slots).
Status LaunchSetSlots(int32_t* slot_of_line, const int64_t* lines, size_t n, uintptr_t stream);

}  // namespace spillfs::cuda::internal
