// The kernels of FeatureCache (feature_launch.h): the gather (an index check,
// then warps resolving up to 32 rows at once: HBM line, hot-node buffer over
// PCIe, else a request-ring entry, and copying them), and the fill
// (evictions into the victim buffer, staged rows scattered to the output and
// installed into their slots). Per-line state is touched with atomics only
// (stamps, counters, the ring's tail): no lock.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_util.h"
#include "feature_launch.h"

namespace spillfs::cuda::internal {
namespace {

constexpr int kWarp = 32;
constexpr int kBlockThreads = 256;
constexpr int kWarpsPerBlock = kBlockThreads / kWarp;

// The warp's lanes copy `bytes` from src to dst in the widest words both
// addresses and the length allow.
__device__ __forceinline__ void WarpCopy(char* dst, const char* src, uint64_t bytes, int lane) {
  const uintptr_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes;
  if (align % 16 == 0) {
    const int4* s = reinterpret_cast<const int4*>(src);
    int4* d = reinterpret_cast<int4*>(dst);
    for (uint64_t i = lane; i < bytes / 16; i += kWarp) d[i] = s[i];
  } else if (align % 4 == 0) {
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    for (uint64_t i = lane; i < bytes / 4; i += kWarp) d[i] = s[i];
  } else {
    for (uint64_t i = lane; i < bytes; i += kWarp) dst[i] = src[i];
  }
}

// The gather keeps 4 blocks (32 warps) an SM resident: at most 64 registers
// a thread, room for kCopyUnroll 16-byte words a lane in flight.
constexpr int kGatherMinBlocks = 4;
constexpr int kCopyUnroll = 8;
constexpr unsigned kAllLanes = 0xffffffffu;

__device__ __forceinline__ unsigned long long WarpSum(unsigned long long v) {
  for (int d = kWarp / 2; d > 0; d /= 2) v += __shfl_down_sync(kAllLanes, v, d);
  return v;  // in lane 0
}

// Before the gather, on its stream: the first position whose index is outside
// [-rows, rows) into counters[kFirstRefused]. A pass of its own so that a
// refused batch changes nothing (no stamp raised, no ring entry); it also
// brings the index into L2 for the gather.
__global__ void CheckIndexKernel(const int64_t* index, size_t n, int64_t rows, unsigned long long* first_refused) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t v = index[i];
    if (v < -rows || v >= rows) atomicMin(first_refused, static_cast<unsigned long long>(i));
  }
}

// A warp takes `step_rows` (8, 16 or 32) consecutive positions at a time.
// 1. Lane j resolves position base + j: its index, the line's slot (HBM),
//    else its hot slot, else a ring entry; the loads of the step's rows are
//    all in flight together rather than one dependent chain a row.
// 2. The warp copies the step's rows (consecutive in the output) as one run
//    of words: word w is word w % row_words of row w / row_words, whose
//    source the lane takes from the row's lane (a shuffle). Each lane loads
//    kCopyUnroll words before it stores any: with 16-byte words 4 KiB a warp
//    in flight, which is what keeps HBM busy (a warp a row with one word a
//    lane had 512 B in flight behind two dependent loads).
// Rows are read and written once: streaming loads and stores (evict-first)
// keep the index, slot and stamp tables in L2.
template <typename Word>
__global__ void __launch_bounds__(kBlockThreads, kGatherMinBlocks) GatherKernel(GatherLaunch a, uint32_t step_rows) {
  __shared__ unsigned long long block_hits[2];
  if (threadIdx.x < 2) block_hits[threadIdx.x] = 0;
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  const uint32_t row_words = static_cast<uint32_t>(a.g.row_bytes / sizeof(Word));
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  unsigned long long hits = 0, hot_hits = 0;
  // Written by CheckIndexKernel, before this kernel on the stream.
  const bool refused = *const_cast<volatile unsigned long long*>(&a.counters[kFirstRefused]) != kNoPosition;
  for (uint64_t base = (static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) * step_rows;
       !refused && base < a.n; base += warps * step_rows) {
    const uint64_t i = base + lane;
    const char* src = nullptr;
    bool miss = false;
    int64_t row = 0;
    if (static_cast<uint32_t>(lane) < step_rows && i < a.n) {
      row = a.index[i];
      if (row < 0) row += static_cast<int64_t>(a.rows);
      const uint64_t line = static_cast<uint64_t>(row) / a.g.rows_per_line;
      const uint64_t within = (static_cast<uint64_t>(row) - line * a.g.rows_per_line) * a.g.row_bytes;
      const int32_t slot = a.slot_of_line[line];
      if (slot >= 0) {
        src = a.lines + static_cast<uint64_t>(slot) * a.g.line_bytes + within;
        // Unconditional: its result unused, atomicMax is a fire-and-forget
        // reduction at L2; reading the stamp first to skip it would cost a
        // dependent load and as many L2 accesses.
        atomicMax(&a.stamps[slot], a.stamp);
        ++hits;
      } else {
        const int32_t hot = a.hot_slot_of_line != nullptr ? a.hot_slot_of_line[line] : -1;
        if (hot >= 0) {
          src = a.hot + static_cast<uint64_t>(hot) * a.g.line_bytes + within;
          ++hot_hits;
        } else {
          miss = true;
        }
      }
    }
    // The warp's misses take their ring entries with one atomicAdd, in lane order.
    const unsigned missed = __ballot_sync(kAllLanes, miss);
    if (missed != 0) {
      const int leader = __ffs(missed) - 1;
      unsigned long long first = 0;
      if (lane == leader) first = atomicAdd(&a.counters[kRingTail], static_cast<unsigned long long>(__popc(missed)));
      first = __shfl_sync(kAllLanes, first, leader);
      if (miss) {
        const unsigned long long k = first + __popc(missed & ((1u << lane) - 1));
        if (k < a.ring_capacity) {
          a.ring[2 * k] = row;
          a.ring[2 * k + 1] = static_cast<int64_t>(i);
        }
      }
    }
    // Rows that missed are left for the fill (their words are skipped).
    const uint64_t left = a.n - base;
    const uint32_t total = (left < step_rows ? static_cast<uint32_t>(left) : step_rows) * row_words;
    Word* dst = reinterpret_cast<Word*>(a.out + base * a.g.row_bytes);
    for (uint32_t w0 = 0; w0 < total; w0 += kWarp * kCopyUnroll) {
      Word v[kCopyUnroll];
      unsigned loaded = 0;
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const uint32_t w = w0 + u * kWarp + lane;
        const uint32_t r = min(w / row_words, static_cast<uint32_t>(kWarp - 1));  // < 32 wherever w < total
        const auto* from = reinterpret_cast<const Word*>(
            __shfl_sync(kAllLanes, reinterpret_cast<unsigned long long>(src), static_cast<int>(r)));
        if (w < total && from != nullptr) {
          v[u] = __ldcs(from + (w - r * row_words));
          loaded |= 1u << u;
        }
      }
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        if (loaded & (1u << u)) __stcs(dst + w0 + u * kWarp + lane, v[u]);
      }
    }
  }
  // Counts: a warp's, then the block's, then one atomicAdd each.
  hits = WarpSum(hits);
  hot_hits = WarpSum(hot_hits);
  if (lane == 0 && (hits | hot_hits) != 0) {
    atomicAdd(&block_hits[0], hits);
    atomicAdd(&block_hits[1], hot_hits);
  }
  // The ring's tail needs no fence here: each leader waited for its
  // atomicAdd's result, so those are done before the barrier. The rows and
  // ring entries are the host's once the kernel has ended.
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (block_hits[0] != 0) atomicAdd(&a.counters[kGpuHits], block_hits[0]);
  if (block_hits[1] != 0) atomicAdd(&a.counters[kHotHits], block_hits[1]);
  __threadfence();  // the block's counts before its "done"
  // The last block: every other block has counted; report, and leave the
  // counters idle for the next gather.
  if (atomicAdd(&a.counters[kBlocksDone], 1ull) == gridDim.x - 1) {
    __threadfence();
    volatile unsigned long long* report = a.report;
    report[kGpuHits] = atomicExch(&a.counters[kGpuHits], 0ull);
    report[kHotHits] = atomicExch(&a.counters[kHotHits], 0ull);
    report[kRingTail] = atomicExch(&a.counters[kRingTail], 0ull);
    report[kFirstRefused] = atomicExch(&a.counters[kFirstRefused], kNoPosition);
    atomicExch(&a.counters[kBlocksDone], 0ull);
    __threadfence_system();
  }
}

__global__ void ResetCountersKernel(unsigned long long* counters) {
  if (threadIdx.x < kGatherCounters) counters[threadIdx.x] = threadIdx.x == kFirstRefused ? kNoPosition : 0;
}

// Runs body(k, lane) for each k < n, a warp per k (the grid's warps stride
// over them): the fill kernels' shape.
template <typename Body>
__device__ void ForEachByWarp(uint64_t n, Body body) {
  const int lane = threadIdx.x % kWarp;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; k < n; k += warps) {
    body(k, lane);
  }
}

__global__ void __launch_bounds__(kBlockThreads) EvictKernel(FillLaunch a) {
  ForEachByWarp(a.plan.n_evicted, [&](uint64_t k, int lane) {
    const int64_t slot = a.plan.evicted_slots[k];
    const int64_t victim = a.plan.victim_slots != nullptr ? a.plan.victim_slots[k] : -1;
    if (victim >= 0 && a.victim != nullptr) {
      WarpCopy(a.victim + static_cast<uint64_t>(victim) * a.g.line_bytes,
               a.lines + static_cast<uint64_t>(slot) * a.g.line_bytes, a.g.line_bytes, lane);
    }
    if (lane == 0) a.slot_of_line[a.plan.evicted_lines[k]] = -1;
  });
}

__global__ void __launch_bounds__(kBlockThreads) ScatterKernel(FillLaunch a) {
  ForEachByWarp(a.plan.n_entries, [&](uint64_t k, int lane) {
    const uint64_t row = static_cast<uint64_t>(a.plan.entry_rows[k]);
    const uint64_t within = (row % a.g.rows_per_line) * a.g.row_bytes;
    const char* src = a.staging + static_cast<uint64_t>(a.plan.entry_staged[k]) * a.g.line_bytes + within;
    WarpCopy(a.out + static_cast<uint64_t>(a.plan.entry_positions[k]) * a.g.row_bytes, src, a.g.row_bytes, lane);
  });
}

__global__ void __launch_bounds__(kBlockThreads) InstallKernel(FillLaunch a) {
  ForEachByWarp(a.plan.n_staged, [&](uint64_t k, int lane) {
    const int64_t slot = a.plan.install_slots[k];
    if (slot < 0) return;
    WarpCopy(a.lines + static_cast<uint64_t>(slot) * a.g.line_bytes, a.staging + k * a.g.line_bytes, a.g.line_bytes,
             lane);
    if (lane == 0) {
      a.slot_of_line[a.plan.staged_lines[k]] = static_cast<int32_t>(slot);
      a.stamps[slot] = a.stamp;
    }
  });
}

__global__ void SetSlotsKernel(int32_t* slot_of_line, const int64_t* lines, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    slot_of_line[lines[i]] = static_cast<int32_t>(i);
  }
}

unsigned Blocks(size_t warps_needed) {
  const size_t blocks = (warps_needed + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

cudaStream_t AsStream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

Status LaunchGather(const GatherLaunch& a, uintptr_t stream) {
  if (a.n == 0) return Status::OK();
  cudaStream_t s = AsStream(stream);
  const uint64_t sms = a.sm_count > 0 ? static_cast<uint64_t>(a.sm_count) : 1;
  const uint64_t check_blocks = std::min<uint64_t>((a.n + kBlockThreads - 1) / kBlockThreads, sms * 8);
  CheckIndexKernel<<<static_cast<unsigned>(check_blocks), kBlockThreads, 0, s>>>(
      a.index, a.n, static_cast<int64_t>(a.rows), &a.counters[kFirstRefused]);
  SPILLFS_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "index check kernel launch"));
  // 32 rows a warp step (a lane each), fewer where that would leave resident
  // warps idle (a batch of tens of thousands of rows).
  const uint64_t resident_warps = sms * kGatherMinBlocks * kWarpsPerBlock;
  uint32_t step_rows = kWarp;
  while (step_rows > 8 && (a.n + step_rows - 1) / step_rows < resident_warps) step_rows /= 2;
  const uint64_t steps = (a.n + step_rows - 1) / step_rows;
  // A step a warp, up to 8 resident waves of blocks; past that the warps loop.
  const uint64_t blocks = std::min<uint64_t>((steps + kWarpsPerBlock - 1) / kWarpsPerBlock, sms * kGatherMinBlocks * 8);
  // The widest word that the row size and every base address allow (lines,
  // hot rows and output rows then all lie at multiples of it).
  const uintptr_t align = a.g.row_bytes | reinterpret_cast<uintptr_t>(a.out) | reinterpret_cast<uintptr_t>(a.lines) |
                          reinterpret_cast<uintptr_t>(a.hot);
  const dim3 grid(static_cast<unsigned>(blocks));
  if (align % 16 == 0) {
    GatherKernel<uint4><<<grid, kBlockThreads, 0, s>>>(a, step_rows);
  } else if (align % 8 == 0) {
    GatherKernel<uint2><<<grid, kBlockThreads, 0, s>>>(a, step_rows);
  } else if (align % 4 == 0) {
    GatherKernel<unsigned int><<<grid, kBlockThreads, 0, s>>>(a, step_rows);
  } else {
    GatherKernel<unsigned char><<<grid, kBlockThreads, 0, s>>>(a, step_rows);
  }
  return CudaStatus(cudaGetLastError(), "gather kernel launch");
}

Status ResetGatherCounters(unsigned long long* counters, uintptr_t stream) {
  ResetCountersKernel<<<1, kWarp, 0, AsStream(stream)>>>(counters);
  return CudaStatus(cudaGetLastError(), "counter reset kernel launch");
}

Status LaunchEvict(const FillLaunch& a, uintptr_t stream) {
  if (a.plan.n_evicted == 0) return Status::OK();
  EvictKernel<<<Blocks(a.plan.n_evicted), kBlockThreads, 0, AsStream(stream)>>>(a);
  return CudaStatus(cudaGetLastError(), "evict kernel launch");
}

Status LaunchScatterInstall(const FillLaunch& a, uintptr_t stream) {
  if (a.plan.n_entries > 0) {
    ScatterKernel<<<Blocks(a.plan.n_entries), kBlockThreads, 0, AsStream(stream)>>>(a);
    SPILLFS_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "scatter kernel launch"));
  }
  if (a.plan.n_staged > 0) {
    InstallKernel<<<Blocks(a.plan.n_staged), kBlockThreads, 0, AsStream(stream)>>>(a);
    SPILLFS_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "install kernel launch"));
  }
  return Status::OK();
}

Status LaunchSetSlots(int32_t* slot_of_line, const int64_t* lines, size_t n, uintptr_t stream) {
  if (n == 0) return Status::OK();
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 > 65535 ? 65535 : n / 256 + 1);
  SetSlotsKernel<<<blocks, 256, 0, AsStream(stream)>>>(slot_of_line, lines, n);
  return CudaStatus(cudaGetLastError(), "set-slots kernel launch");
}

}  // namespace spillfs::cuda::internal
