// The kernels of FeatureCache (feature_launch.h): the gather (a warp per row:
// HBM line, hot-node buffer over PCIe, else a request-ring entry), and the
// fill (evictions into the victim buffer, staged rows scattered to the
// output and installed into their slots). Per-line state is touched by the
// warp of that row only, with atomics (stamps, counters, the ring's tail):
// no lock.
#include <cuda_runtime.h>

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

__global__ void __launch_bounds__(kBlockThreads) GatherKernel(GatherLaunch a) {
  __shared__ unsigned long long counts[3];
  if (threadIdx.x < 3) counts[threadIdx.x] = 0;
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  unsigned long long mine[3] = {0, 0, 0};
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; i < a.n; i += warps) {
    const int64_t row = a.index[i];
    const uint64_t line = static_cast<uint64_t>(row) / a.g.rows_per_line;
    const uint64_t within = (static_cast<uint64_t>(row) - line * a.g.rows_per_line) * a.g.row_bytes;
    const char* src = nullptr;
    const int32_t slot = a.slot_of_line[line];
    if (slot >= 0) {
      src = a.lines + static_cast<uint64_t>(slot) * a.g.line_bytes + within;
      if (lane == 0) {
        atomicMax(&a.stamps[slot], a.stamp);
        ++mine[0];
      }
    } else {
      const int32_t hot = a.hot_slot_of_line != nullptr ? a.hot_slot_of_line[line] : -1;
      if (hot >= 0) {
        src = a.hot + static_cast<uint64_t>(hot) * a.g.line_bytes + within;
        if (lane == 0) ++mine[1];
      } else if (lane == 0) {
        ++mine[2];
        const unsigned long long k = atomicAdd(&a.counters[2], 1ull);
        if (k < a.ring_capacity) {
          a.ring[2 * k] = row;
          a.ring[2 * k + 1] = static_cast<int64_t>(i);
        }
      }
    }
    if (src != nullptr) WarpCopy(a.out + i * a.g.row_bytes, src, a.g.row_bytes, lane);
  }
  if (lane == 0) {
    atomicAdd(&counts[0], mine[0]);
    atomicAdd(&counts[1], mine[1]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (counts[0]) atomicAdd(&a.counters[0], counts[0]);
    if (counts[1]) atomicAdd(&a.counters[1], counts[1]);
  }
}

__global__ void __launch_bounds__(kBlockThreads) EvictKernel(FillLaunch a) {
  const int lane = threadIdx.x % kWarp;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; k < a.n_evicted;
       k += warps) {
    const int64_t slot = a.evicted_slots[k];
    const int64_t victim = a.victim_slots != nullptr ? a.victim_slots[k] : -1;
    if (victim >= 0 && a.victim != nullptr) {
      WarpCopy(a.victim + static_cast<uint64_t>(victim) * a.g.line_bytes,
               a.lines + static_cast<uint64_t>(slot) * a.g.line_bytes, a.g.line_bytes, lane);
    }
    if (lane == 0) a.slot_of_line[a.evicted_lines[k]] = -1;
  }
}

__global__ void __launch_bounds__(kBlockThreads) ScatterKernel(FillLaunch a) {
  const int lane = threadIdx.x % kWarp;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; k < a.n_entries;
       k += warps) {
    const uint64_t row = static_cast<uint64_t>(a.entry_rows[k]);
    const uint64_t within = (row % a.g.rows_per_line) * a.g.row_bytes;
    const char* src = a.staging + static_cast<uint64_t>(a.entry_staged[k]) * a.g.line_bytes + within;
    WarpCopy(a.out + static_cast<uint64_t>(a.entry_positions[k]) * a.g.row_bytes, src, a.g.row_bytes, lane);
  }
}

__global__ void __launch_bounds__(kBlockThreads) InstallKernel(FillLaunch a) {
  const int lane = threadIdx.x % kWarp;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; k < a.n_staged;
       k += warps) {
    const int64_t slot = a.install_slots[k];
    if (slot < 0) continue;
    WarpCopy(a.lines + static_cast<uint64_t>(slot) * a.g.line_bytes, a.staging + k * a.g.line_bytes, a.g.line_bytes,
             lane);
    if (lane == 0) {
      a.slot_of_line[a.staged_lines[k]] = static_cast<int32_t>(slot);
      a.stamps[slot] = a.stamp;
    }
  }
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
  GatherKernel<<<Blocks(a.n), kBlockThreads, 0, AsStream(stream)>>>(a);
  return CudaStatus(cudaGetLastError(), "gather kernel launch");
}

Status LaunchEvict(const FillLaunch& a, uintptr_t stream) {
  if (a.n_evicted == 0) return Status::OK();
  EvictKernel<<<Blocks(a.n_evicted), kBlockThreads, 0, AsStream(stream)>>>(a);
  return CudaStatus(cudaGetLastError(), "evict kernel launch");
}

Status LaunchScatterInstall(const FillLaunch& a, uintptr_t stream) {
  if (a.n_entries > 0) {
    ScatterKernel<<<Blocks(a.n_entries), kBlockThreads, 0, AsStream(stream)>>>(a);
    SPILLFS_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "scatter kernel launch"));
  }
  if (a.n_staged > 0) {
    InstallKernel<<<Blocks(a.n_staged), kBlockThreads, 0, AsStream(stream)>>>(a);
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
