// cuda_hash_bench: what cuda/ costs on a GPU, one JSON line a measurement.
//  - unit_hashes / block_checksums: GB/s of the hash kernels over a device
//    buffer (1 GiB unless --bytes N), every thread shape and two block sizes,
//    best and mean of --iterations runs, each checked against the default
//    shape and, for the first units, against the host code;
//  - pinned_pool: Acquire+release latency of a reused 64 MiB buffer against
//    cudaHostAlloc+cudaFreeHost of the same size (why the pool exists);
//  - copy_stream: device -> pinned host and back through CopyStream in 8 MiB
//    chunks (the client's pipeline without the disk).
// Run by cuda/run_device_tests.sh on the GPU machine; prints one line saying
// so and exits 0 where there is no device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hash_launch.h"
#include "spillfs/cuda/copy_stream.h"
#include "spillfs/cuda/hash_kernels.h"
#include "spillfs/cuda/pinned_pool.h"
#include "spillfs/cuda/runtime.h"

namespace spillfs::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

__global__ void FillKernel(uint64_t* p, size_t words) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    p[i] = z ^ (z >> 31);
  }
}

void Die(const char* what, const Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}
void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

std::string device_name;

// One kernel (wide: unit hashes) in every shape, timed on the host around
// the whole call (launch, the copy of the hashes, the synchronisation).
void BenchHashes(const uint8_t* data, size_t bytes, size_t unit, bool wide, int iterations) {
  const size_t count = wide ? UnitCount(bytes, unit) : BlockCount(bytes, unit);
  const size_t out_bytes = count * (wide ? sizeof(Hash128) : sizeof(uint32_t));
  std::vector<uint8_t> reference(out_bytes), got(out_bytes);
  const internal::HashLaunch def = wide ? internal::DefaultUnitLaunch() : internal::DefaultBlockLaunch();
  const Status first = internal::LaunchHashes(data, bytes, unit, wide, reference.data(), 0, def);
  if (!first.ok()) Die("default launch", first);

  // The first units against the host code.
  const size_t checked = std::min<size_t>(count, 16);
  std::vector<uint8_t> host(std::min(checked * unit, bytes));
  Check(cudaMemcpy(host.data(), data, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<uint8_t> host_out(out_bytes);
  const Status on_host =
      wide ? UnitHashesHost(host.data(), host.size(), unit, reinterpret_cast<Hash128*>(host_out.data()))
           : BlockChecksumsHost(host.data(), host.size(), unit, reinterpret_cast<uint32_t*>(host_out.data()));
  if (!on_host.ok()) Die("host hashes", on_host);
  const size_t checked_bytes = checked * (wide ? sizeof(Hash128) : sizeof(uint32_t));
  const bool host_match = std::memcmp(host_out.data(), reference.data(), checked_bytes) == 0;

  for (int shape : {8, 4, 2, 1, 0})
    for (int block_threads : {128, 256}) {
      const internal::HashLaunch launch{shape, block_threads};
      // The reference kernel (one thread a unit) is slow: fewer rounds.
      const int rounds = shape == 0 ? std::min(iterations, 2) : iterations;
      const Status warm = internal::LaunchHashes(data, bytes, unit, wide, got.data(), 0, launch);
      if (!warm.ok()) Die("launch", warm);
      const bool match = got == reference;
      double best = 1e30, total = 0;
      for (int i = 0; i < rounds; ++i) {
        const auto start = Clock::now();
        const Status status = internal::LaunchHashes(data, bytes, unit, wide, got.data(), 0, launch);
        const double s = Seconds(start);
        if (!status.ok()) Die("launch", status);
        best = std::min(best, s);
        total += s;
      }
      std::printf(
          "{\"bench\":\"%s\",\"device\":\"%s\",\"bytes\":%zu,\"unit_bytes\":%zu,\"threads_per_unit\":%d,"
          "\"block_threads\":%d,\"default\":%s,\"iterations\":%d,\"best_s\":%.6f,\"best_gbps\":%.1f,"
          "\"mean_gbps\":%.1f,\"match_default\":%s,\"default_match_host\":%s}\n",
          wide ? "unit_hashes" : "block_checksums", device_name.c_str(), bytes, unit, shape, block_threads,
          shape == def.threads_per_unit && block_threads == def.block_threads ? "true" : "false", rounds, best,
          bytes / best / 1e9, bytes * rounds / total / 1e9, match ? "true" : "false", host_match ? "true" : "false");
      std::fflush(stdout);
    }
}

void BenchPinnedPool() {
  const size_t bytes = 64 << 20;
  PinnedPool pool(512 << 20, 256 << 20);
  auto start = Clock::now();
  { PinnedBuffer first = pool.Acquire(bytes); }  // allocates and pins a 256 MiB slab
  const double first_s = Seconds(start);
  const int rounds = 10000;
  std::vector<double> samples(rounds);
  for (int i = 0; i < rounds; ++i) {
    start = Clock::now();
    PinnedBuffer buffer = pool.Acquire(bytes);
    buffer.Reset();
    samples[i] = Seconds(start);
  }
  std::sort(samples.begin(), samples.end());
  double alloc_total = 0;
  const int alloc_rounds = 10;
  for (int i = 0; i < alloc_rounds; ++i) {
    void* p = nullptr;
    start = Clock::now();
    Check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    Check(cudaFreeHost(p), "cudaFreeHost");
    alloc_total += Seconds(start);
  }
  std::printf(
      "{\"bench\":\"pinned_pool\",\"device\":\"%s\",\"buffer_bytes\":%zu,\"pinned\":%s,\"first_acquire_ms\":%.3f,"
      "\"acquire_release_p50_us\":%.3f,\"acquire_release_p99_us\":%.3f,\"cuda_host_alloc_free_mean_ms\":%.3f}\n",
      device_name.c_str(), bytes, pool.pinned() ? "true" : "false", first_s * 1e3, samples[rounds / 2] * 1e6,
      samples[rounds * 99 / 100] * 1e6, alloc_total / alloc_rounds * 1e3);
  std::fflush(stdout);
}

void BenchCopyStream(void* device, size_t bytes) {
  const size_t chunk = 8 << 20;
  const int depth = 4;
  PinnedPool pool(depth * chunk, depth * chunk);
  std::vector<PinnedBuffer> buffers;
  for (int i = 0; i < depth; ++i) buffers.push_back(pool.Acquire(chunk));
  Result<std::unique_ptr<CopyStream>> created = CopyStream::Create(0);
  if (!created.ok()) Die("CopyStream::Create", created.status());
  CopyStream& copy = **created;
  for (bool to_host : {true, false}) {
    double best = 1e30;
    for (int round = 0; round < 3; ++round) {
      const auto start = Clock::now();
      for (size_t offset = 0; offset < bytes; offset += chunk) {
        const size_t n = std::min(chunk, bytes - offset);
        void* host = buffers[(offset / chunk) % depth].data();
        char* dev = static_cast<char*>(device) + offset;
        const Status status = to_host ? copy.ToHost(host, dev, n) : copy.ToDevice(dev, host, n);
        if (!status.ok()) Die("copy", status);
      }
      const Status status = copy.Synchronize();
      if (!status.ok()) Die("Synchronize", status);
      best = std::min(best, Seconds(start));
    }
    std::printf(
        "{\"bench\":\"copy_stream\",\"device\":\"%s\",\"direction\":\"%s\",\"bytes\":%zu,"
        "\"chunk_bytes\":%zu,\"best_gbps\":%.1f}\n",
        device_name.c_str(), to_host ? "device_to_host" : "host_to_device", bytes, chunk, bytes / best / 1e9);
    std::fflush(stdout);
  }
}

int Main(int argc, char** argv) {
  size_t bytes = size_t{1} << 30;
  int iterations = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--bytes") == 0) bytes = std::strtoull(argv[i + 1], nullptr, 0);
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[i + 1]);
  }
  if (!Available()) {
    std::printf("{\"bench\":\"skipped\",\"reason\":\"no CUDA device\"}\n");
    return 0;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  device_name = prop.name;
  void* data = nullptr;
  Check(cudaMalloc(&data, bytes), "cudaMalloc");
  FillKernel<<<1024, 256>>>(static_cast<uint64_t*>(data), bytes / 8);
  Check(cudaDeviceSynchronize(), "fill");
  BenchHashes(static_cast<const uint8_t*>(data), bytes, kDedupUnitBytes, /*wide=*/true, iterations);
  BenchHashes(static_cast<const uint8_t*>(data), bytes, kChecksumBlockBytes, /*wide=*/false, iterations);
  BenchPinnedPool();
  BenchCopyStream(data, bytes);
  cudaFree(data);
  return 0;
}

}  // namespace
}  // namespace spillfs::cuda

int main(int argc, char** argv) { return spillfs::cuda::Main(argc, argv); }
