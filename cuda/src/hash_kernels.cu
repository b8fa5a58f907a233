// The hash kernels of hash_kernels.h.
//
// XXH3's long loop is one chain per unit: 8 lanes, a 64-byte stripe at a time,
// a scramble every 1 KiB. A 256 KiB unit is 4096 stripes in a row, so a GPU
// gets its parallelism from the units (4096 in 1 GiB) and from the lanes:
// lane i needs only its own word and its neighbour i^1's. A unit is therefore
// split over kThreads threads of one warp, each owning 8 / kThreads lanes
// (whole pairs, or one lane and a warp shuffle for the neighbour's word), each
// loading its column of the stripes (16 bytes, or 8) a chunk ahead of use
// (unit_lanes.h, which CI runs on the CPU), so loads are in flight while the
// previous chunk is mixed. The unit's threads read adjacent bytes (64 a
// stripe), the keys sit in registers, and at the end the lanes are gathered
// by shuffle into the unit's first thread, which merges them with xxh3.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "cuda_util.h"
#include "hash_launch.h"
#include "spillfs/cuda/hash_kernels.h"
#include "spillfs/cuda/runtime.h"
#include "unit_lanes.h"

namespace spillfs::cuda {
namespace {

namespace x = xxh3;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxBlockThreads = 256;

// Where unit u of a launch is: one buffer, units one after another.
struct OneBuffer {
  const uint8_t* data;
  size_t unit_bytes;
  __device__ const uint8_t* Unit(size_t u) const { return data + u * unit_bytes; }
};

// Where unit u of a launch is: several buffers (16-byte aligned), their units
// numbered one after another; first[s] is buffer s's first unit number
// (first[n] the total), in device memory.
struct SpanTable {
  const uint8_t* const* ptrs;
  const uint64_t* first;
  uint32_t n;
  size_t unit_bytes;
  __device__ const uint8_t* Unit(size_t u) const {
    uint32_t lo = 0, hi = n;  // the last s with first[s] <= u
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      if (first[mid] <= u) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return ptrs[lo] + (u - first[lo]) * unit_bytes;
  }
};

// Units of `unit_bytes` (> 240, a multiple of 64) at 16-byte-aligned places
// (`where`: OneBuffer or SpanTable), kThreads threads a unit; out: Hash128[]
// (kWide) or uint32_t[], by unit number. One launch over a whole checkpoint's
// storages keeps every SM busy: a launch a storage ran a 32 MiB tensor's 128
// units on two blocks, one after another.
template <int kThreads, bool kWide, typename Where>
__global__ void __launch_bounds__(kMaxBlockThreads)
    LongUnitsKernel(Where where, size_t unit_bytes, size_t units, void* __restrict__ out) {
  constexpr int kLanes = 8 / kThreads;
  __shared__ uint64_t words[internal::kSecretWords];
  if (threadIdx.x < internal::kSecretWords) words[threadIdx.x] = x::Read64(x::Secret() + 8 * threadIdx.x);
  __syncthreads();

  // Threads past the last unit redo the last one: every thread of a warp
  // takes part in the shuffles.
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = thread / kThreads < units;
  const size_t unit = active ? thread / kThreads : units - 1;
  const int lane0 = static_cast<int>(thread % kThreads) * kLanes;
  uint64_t acc[kLanes];
  internal::UnitColumnLanes<kLanes>(where.Unit(unit), unit_bytes, lane0, words, acc);

  // Gather the 8 lanes into the unit's first thread.
  uint64_t all[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if constexpr (kThreads == 1) {
      all[i] = acc[i];
    } else {
      all[i] = __shfl_sync(kFullMask, static_cast<unsigned long long>(acc[i % kLanes]), i / kLanes, kThreads);
    }
  }
  if (active && lane0 == 0) {
    if constexpr (kWide) {
      static_cast<Hash128*>(out)[unit] = x::FinishLong128(all, unit_bytes);
    } else {
      static_cast<uint32_t*>(out)[unit] = static_cast<uint32_t>(x::FinishLong64(all, unit_bytes));
    }
  }
}

// Any shape, one thread a unit, the reference code: units of `unit_bytes`
// over `length` bytes, a partial last one hashed over its bytes.
template <bool kWide>
__global__ void ReferenceKernel(const uint8_t* data, size_t unit_bytes, size_t units, size_t length, void* out) {
  const size_t unit = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= units) return;
  const size_t offset = unit * unit_bytes;
  const size_t n = length - offset < unit_bytes ? length - offset : unit_bytes;
  if constexpr (kWide) {
    static_cast<Hash128*>(out)[unit] = Xxh3Hash128(data + offset, n);
  } else {
    static_cast<uint32_t*>(out)[unit] = static_cast<uint32_t>(Xxh3Hash64(data + offset, n));
  }
}

size_t Blocks(size_t threads, int block_threads) { return (threads + block_threads - 1) / block_threads; }

template <bool kWide, typename Where>
void EnqueueLong(int threads_per_unit, int block_threads, Where where, size_t unit_bytes, size_t units, void* out,
                 cudaStream_t stream) {
  const size_t blocks = Blocks(units * threads_per_unit, block_threads);
  switch (threads_per_unit) {
    case 1:
      LongUnitsKernel<1, kWide><<<blocks, block_threads, 0, stream>>>(where, unit_bytes, units, out);
      break;
    case 2:
      LongUnitsKernel<2, kWide><<<blocks, block_threads, 0, stream>>>(where, unit_bytes, units, out);
      break;
    case 4:
      LongUnitsKernel<4, kWide><<<blocks, block_threads, 0, stream>>>(where, unit_bytes, units, out);
      break;
    default:
      LongUnitsKernel<8, kWide><<<blocks, block_threads, 0, stream>>>(where, unit_bytes, units, out);
      break;
  }
}

// Whether the long kernel takes units of `unit_bytes` at `data`.
bool LongKernelTakes(const internal::HashLaunch& launch, size_t unit_bytes, const void* data) {
  return launch.threads_per_unit != 0 && unit_bytes > x::kMidSizeMax && unit_bytes % x::kStripeBytes == 0 &&
         reinterpret_cast<uintptr_t>(data) % 16 == 0;
}

// Enqueues the hashes of `length` bytes into device memory `out`.
Status Enqueue(const uint8_t* data, size_t length, size_t unit_bytes, bool wide, void* out,
               const internal::HashLaunch& launch, cudaStream_t stream) {
  const size_t whole = length / unit_bytes;
  const size_t tail = wide ? 0 : length % unit_bytes;
  const OneBuffer where{data, unit_bytes};
  if (whole > 0 && LongKernelTakes(launch, unit_bytes, data)) {
    if (wide) {
      EnqueueLong<true>(launch.threads_per_unit, launch.block_threads, where, unit_bytes, whole, out, stream);
    } else {
      EnqueueLong<false>(launch.threads_per_unit, launch.block_threads, where, unit_bytes, whole, out, stream);
    }
  } else if (whole > 0) {
    const size_t blocks = Blocks(whole, launch.block_threads);
    if (wide) {
      ReferenceKernel<true><<<blocks, launch.block_threads, 0, stream>>>(data, unit_bytes, whole, length, out);
    } else {
      ReferenceKernel<false><<<blocks, launch.block_threads, 0, stream>>>(data, unit_bytes, whole, length, out);
    }
  }
  if (tail > 0) {
    ReferenceKernel<false>
        <<<1, 1, 0, stream>>>(data + whole * unit_bytes, unit_bytes, 1, tail, static_cast<uint32_t*>(out) + whole);
  }
  return CudaStatus(cudaGetLastError(), "hash kernel launch");
}

// Device memory for hashes on their way to the host, freed on its stream.
struct StreamScratch {
  void* data = nullptr;
  cudaStream_t stream;
  ~StreamScratch() {
    if (data != nullptr) cudaFreeAsync(data, stream);
  }
};

}  // namespace

namespace internal {

// Not measured on a GPU yet: 4 threads a unit (whole lane pairs, no
// shuffles) for both, to be set from cuda/bench/hash_bench.cu's figures.
HashLaunch DefaultUnitLaunch() { return HashLaunch{4, 256}; }
HashLaunch DefaultBlockLaunch() { return HashLaunch{4, 256}; }

Status LaunchHashes(const void* device_ptr, size_t length, size_t unit_bytes, bool wide, void* out_host,
                    uintptr_t stream, const HashLaunch& launch) {
  if (unit_bytes == 0) return Status::Invalid("unit_bytes is 0");
  const int tpu = launch.threads_per_unit;
  if (tpu != 0 && tpu != 1 && tpu != 2 && tpu != 4 && tpu != 8)
    return Status::Invalid("threads_per_unit must be 0, 1, 2, 4 or 8");
  if (launch.block_threads < 32 || launch.block_threads > kMaxBlockThreads || launch.block_threads % 32 != 0)
    return Status::Invalid("block_threads must be a multiple of 32 up to 256");
  const size_t count = wide ? length / unit_bytes : (length + unit_bytes - 1) / unit_bytes;
  if (count == 0) return Status::OK();
  if (device_ptr == nullptr || out_host == nullptr) return Status::Invalid("null buffer");
  if (!Available()) return Status::Error(ENODEV, "no CUDA device");
  const int device = PointerDevice(device_ptr);
  if (device < 0) return Status::Invalid("the buffer to hash is not GPU memory");

  DeviceGuard guard(device);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const size_t out_bytes = count * (wide ? sizeof(Hash128) : sizeof(uint32_t));
  // The hashes land in device memory, then come over in one copy.
  StreamScratch out{nullptr, s};
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&out.data, out_bytes, s));
  SPILLFS_RETURN_IF_ERROR(
      Enqueue(static_cast<const uint8_t*>(device_ptr), length, unit_bytes, wide, out.data, launch, s));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out_host, out.data, out_bytes, cudaMemcpyDeviceToHost, s));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return Status::OK();
}

}  // namespace internal

Status UnitHashes(const void* device_ptr, size_t length, size_t unit_bytes, Hash128* out_host, uintptr_t stream) {
  return internal::LaunchHashes(device_ptr, length, unit_bytes, /*wide=*/true, out_host, stream,
                                internal::DefaultUnitLaunch());
}

Status UnitHashesOfSpans(const DeviceSpan* spans, size_t n, size_t unit_bytes, Hash128* out_host, uintptr_t stream) {
  if (unit_bytes == 0) return Status::Invalid("unit_bytes is 0");
  size_t count = 0;
  int device = -1;
  for (size_t i = 0; i < n; ++i) {
    const size_t units = spans[i].length / unit_bytes;
    if (units == 0) continue;
    if (spans[i].ptr == nullptr) return Status::Invalid("span " + std::to_string(i) + ": null buffer");
    count += units;
    if (device < 0 && !Available()) return Status::Error(ENODEV, "no CUDA device");
    const int on = PointerDevice(spans[i].ptr);
    if (on < 0) return Status::Invalid("span " + std::to_string(i) + ": the buffer to hash is not GPU memory");
    if (device >= 0 && on != device) {
      return Status::Invalid("span " + std::to_string(i) + " is on CUDA device " + std::to_string(on) +
                             ", an earlier span on device " + std::to_string(device));
    }
    device = on;
  }
  if (count == 0) return Status::OK();
  if (out_host == nullptr) return Status::Invalid("null buffer");
  DeviceGuard guard(device);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  // The spans the long kernel takes go in one launch over a table of them
  // (their hashes, in span order, in front); the others one launch each,
  // behind. The table rides in the scratch buffer, after the hashes.
  const internal::HashLaunch launch = internal::DefaultUnitLaunch();
  std::vector<const uint8_t*> ptrs;
  std::vector<uint64_t> first{0};
  std::vector<size_t> table_span, other_span;  // span index of each
  for (size_t i = 0; i < n; ++i) {
    const size_t units = spans[i].length / unit_bytes;
    if (units == 0) continue;
    if (LongKernelTakes(launch, unit_bytes, spans[i].ptr)) {
      ptrs.push_back(static_cast<const uint8_t*>(spans[i].ptr));
      first.push_back(first.back() + units);
      table_span.push_back(i);
    } else {
      other_span.push_back(i);
    }
  }
  const size_t hash_bytes = count * sizeof(Hash128);
  const size_t ptrs_at = hash_bytes, first_at = ptrs_at + ptrs.size() * sizeof(ptrs[0]);
  const size_t scratch_bytes = first_at + first.size() * sizeof(first[0]);
  StreamScratch out{nullptr, s};
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&out.data, scratch_bytes, s));
  auto* hashes = static_cast<Hash128*>(out.data);
  auto* base = static_cast<uint8_t*>(out.data);
  if (!ptrs.empty()) {
    SPILLFS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(base + ptrs_at, ptrs.data(), ptrs.size() * sizeof(ptrs[0]), cudaMemcpyHostToDevice, s));
    SPILLFS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(base + first_at, first.data(), first.size() * sizeof(first[0]), cudaMemcpyHostToDevice, s));
    const SpanTable table{reinterpret_cast<const uint8_t* const*>(base + ptrs_at),
                          reinterpret_cast<const uint64_t*>(base + first_at), static_cast<uint32_t>(ptrs.size()),
                          unit_bytes};
    EnqueueLong<true>(launch.threads_per_unit, launch.block_threads, table, unit_bytes, first.back(), hashes, s);
    SPILLFS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  size_t at = first.back();
  for (size_t i : other_span) {
    const size_t units = spans[i].length / unit_bytes;
    SPILLFS_RETURN_IF_ERROR(Enqueue(static_cast<const uint8_t*>(spans[i].ptr), units * unit_bytes, unit_bytes,
                                    /*wide=*/true, hashes + at, launch, s));
    at += units;
  }
  // Back in span order.
  std::vector<Hash128> staged(count);
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staged.data(), hashes, hash_bytes, cudaMemcpyDeviceToHost, s));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  std::vector<size_t> from(n, 0);  // span -> its first hash in `staged`
  for (size_t k = 0; k < table_span.size(); ++k) from[table_span[k]] = first[k];
  at = first.back();
  for (size_t i : other_span) {
    from[i] = at;
    at += spans[i].length / unit_bytes;
  }
  Hash128* to = out_host;
  for (size_t i = 0; i < n; ++i) {
    const size_t units = spans[i].length / unit_bytes;
    std::copy(staged.begin() + from[i], staged.begin() + from[i] + units, to);
    to += units;
  }
  return Status::OK();
}

Status BlockChecksums(const void* device_ptr, size_t length, size_t block_bytes, uint32_t* out_host, uintptr_t stream) {
  return internal::LaunchHashes(device_ptr, length, block_bytes, /*wide=*/false, out_host, stream,
                                internal::DefaultBlockLaunch());
}

}  // namespace spillfs::cuda
