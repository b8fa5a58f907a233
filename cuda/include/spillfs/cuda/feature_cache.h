// FeatureCache: the GPU software cache of a feature table (GIDS's programming
// model without its driver: BaM/GIDS drive NVMe queues from GPU threads,
// which needs the SSD unbound from the kernel, impossible for a filesystem
// that shares the drive; here a gather kernel serves rows from HBM and
// pinned host buffers and posts the rest to a ring that host threads turn
// into io_uring reads; docs/design.md, "GNN feature tables"). The mechanism
// only: which lines to keep, evict and park is decided by the caller
// (spillfs.gnn's policies) on the host.
//
// Memory:
//  - lines in HBM: `cache_lines` slots of one line each (rows_per_line
//    consecutive rows); per line a slot index (slot_of_line, -1: absent) and
//    per slot a last-use stamp the gather kernel raises with atomicMax (no
//    global lock: a warp touches only its row's line state);
//  - the hot-node buffer: `hot_lines` lines in pinned, GPU-mapped host memory
//    that the kernel reads over PCIe (zero copy); never evicted;
//  - the victim buffer: `victim_lines` lines in pinned, GPU-mapped host
//    memory, written by the eviction kernel straight from HBM;
//  - the request ring: pinned, GPU-mapped (row, output position) pairs that
//    the gather kernel posts for the rows no tier holds;
//  - staging: `staging_lines` lines of pinned host memory the host fills (from
//    the victim buffer or storage), copied to the GPU in one transfer, then
//    scattered to the output and installed into their slots.
//
// One batch: Gather (an index check, then warps resolving up to 32 rows at
// once: HBM line, else hot buffer, else a ring entry; one wait for the
// stream, the counts written by the kernel into mapped memory), then, where
// rows missed, Misses, Stamps and one Fill per staging load.
//
// Threading: thread-compatible (one call at a time: the caller's lock). Work
// runs on the caller's stream; Gather and Fill return once it has run.
// Error convention: Status; Create fails with ENOTSUP "built without CUDA" or
// ENODEV; CUDA failures are EIO naming the call; EINVAL for bad arguments
// (rows of more than 64 MiB among them); ERANGE for an index out of range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "spillfs/common/status.h"

namespace spillfs::cuda {

struct FeatureCacheShape {
  uint64_t row_bytes = 0;
  uint64_t rows = 0;
  uint64_t rows_per_line = 1;
  uint64_t cache_lines = 0;
  uint64_t hot_lines = 0;
  uint64_t victim_lines = 0;
  uint64_t staging_lines = 0;
  uint64_t line_bytes() const { return row_bytes * rows_per_line; }
  uint64_t lines() const { return rows_per_line == 0 ? 0 : (rows + rows_per_line - 1) / rows_per_line; }
};

struct GatherCounts {
  uint64_t gpu_hits = 0;  // rows read from HBM lines
  uint64_t hot_hits = 0;  // rows read from the hot-node buffer
  uint64_t misses = 0;    // rows posted to the request ring
};

// What one Fill does, as host arrays (copied by the call):
//  1. evict: for k < n_evicted, line evicted_lines[k] leaves slot
//     evicted_slots[k]; where victim_slots[k] >= 0 its bytes go to that slot
//     of the victim buffer first;
//  2. the first n_staged lines of staging go to the GPU;
//  3. entry k (a ring entry: row entry_rows[k], from staged line
//     entry_staged[k]) is copied to row entry_positions[k] of the output;
//  4. staged line k is installed into slot install_slots[k] (-1: not kept).
struct FillPlan {
  size_t n_evicted = 0;
  const int64_t* evicted_lines = nullptr;
  const int64_t* evicted_slots = nullptr;
  const int64_t* victim_slots = nullptr;
  size_t n_staged = 0;
  const int64_t* staged_lines = nullptr;
  const int64_t* install_slots = nullptr;
  size_t n_entries = 0;
  const int64_t* entry_rows = nullptr;
  const int64_t* entry_positions = nullptr;
  const int64_t* entry_staged = nullptr;
};

class FeatureCache {
 public:
  enum HostBuffer { kHot = 0, kVictim = 1, kStaging = 2 };

  static Result<std::unique_ptr<FeatureCache>> Create(int device, const FeatureCacheShape& shape);
  ~FeatureCache();
  FeatureCache(const FeatureCache&) = delete;
  FeatureCache& operator=(const FeatureCache&) = delete;

  const FeatureCacheShape& shape() const { return shape_; }
  int device() const { return device_; }
  // The pinned host buffers (line after line), for the caller to fill (hot,
  // staging) or read (victim); null where empty.
  char* host_buffer(HostBuffer which) const;

  // Hot line lines[i] is in slot i of the hot buffer (i < hot_lines).
  Status SetHot(const int64_t* lines, size_t n);
  // out[i] = row index[i] (device memory, each in [-rows, rows): negatives
  // count from the end) for the rows the GPU tiers hold; the others are
  // posted to the ring (their rows in [0, rows)). `stamp` marks the lines
  // hit. Returns once the kernels have run. An index out of range: ERANGE
  // naming it and its position, and nothing gathered, counted or stamped.
  Status Gather(const int64_t* index, size_t n, void* out, uint32_t stamp, uintptr_t stream, GatherCounts* counts);
  // The first n ring entries of the last Gather (n <= its misses).
  Status Misses(int64_t* rows, int64_t* positions, size_t n) const;
  // Every slot's last-use stamp (cache_lines values).
  Status Stamps(uint32_t* out) const;
  // See FillPlan; `out` is the last Gather's output. Returns once done.
  Status Fill(const FillPlan& plan, void* out, uint32_t stamp, uintptr_t stream);

  struct Impl;

 private:
  FeatureCache(int device, const FeatureCacheShape& shape, std::unique_ptr<Impl> impl);
  const int device_;
  const FeatureCacheShape shape_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spillfs::cuda
