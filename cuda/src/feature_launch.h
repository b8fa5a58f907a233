// Internal to spillfs_cuda (CUDA builds): the kernels of FeatureCache
// (feature_kernels.cu), launched by feature_cache.cc on the caller's stream.
// Every pointer is a device pointer (HBM, or the device alias of pinned,
// mapped host memory). The gather resolves up to 32 rows a warp at once (a
// lane a row) and copies them in 16-, 8-, 4- or 1-byte words as alignment
// allows; the fill kernels take a warp per row (or per line).
#pragma once

#include <cstddef>
#include <cstdint>

#include "spillfs/common/status.h"
#include "spillfs/cuda/feature_cache.h"

namespace spillfs::cuda::internal {

struct FeatureGeometry {
  uint64_t row_bytes = 0;
  uint64_t rows_per_line = 1;
  uint64_t line_bytes = 0;
};

// The gather's device counters (`counters`, kGatherCounters of them) are idle
// between gathers: zero, kFirstRefused at kNoPosition. Create makes them so;
// the last block of each gather kernel copies the results to `report` (pinned,
// mapped: kGatherReported values the host reads once the stream has run) and
// makes them idle again, so a gather needs no memset and no copy of its own.
enum GatherCounter : int {
  kGpuHits = 0,       // rows served from HBM lines
  kHotHits = 1,       // rows served from the hot-node buffer
  kRingTail = 2,      // ring entries posted (misses)
  kFirstRefused = 3,  // the first position whose index is out of range, else kNoPosition
  kBlocksDone = 4,    // gather blocks finished (finds the last one)
  kGatherCounters = 5,
  kGatherReported = 4,  // [0, kBlocksDone) are reported
};
constexpr unsigned long long kNoPosition = ~0ull;

// index: n int64 in [-rows, rows) (negatives count from the end); where any
// is not, nothing is gathered and report[kFirstRefused] names its position.
// ring: 2 x ring_capacity int64 (row, position) pairs.
struct GatherLaunch {
  FeatureGeometry g;
  uint64_t rows = 0;
  int sm_count = 1;  // sizes the grid
  const int64_t* index = nullptr;
  size_t n = 0;
  char* out = nullptr;
  const char* lines = nullptr;
  const int32_t* slot_of_line = nullptr;
  const int32_t* hot_slot_of_line = nullptr;
  const char* hot = nullptr;
  uint32_t* stamps = nullptr;
  uint32_t stamp = 0;
  unsigned long long* counters = nullptr;  // device, kGatherCounters
  unsigned long long* report = nullptr;    // mapped, kGatherReported
  int64_t* ring = nullptr;
  unsigned long long ring_capacity = 0;
};
// The index check, then the gather (the counters idle before and after).
Status LaunchGather(const GatherLaunch& a, uintptr_t stream);
// Makes the counters idle (Create; after a failed launch).
Status ResetGatherCounters(unsigned long long* counters, uintptr_t stream);

struct FillLaunch {
  FeatureGeometry g;
  // The caller's FillPlan with its arrays copied to the device.
  FillPlan plan;
  char* victim = nullptr;         // the victim buffer (evictions)
  const char* staging = nullptr;  // staged lines, in HBM
  char* out = nullptr;            // the output the ring entries go to
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
