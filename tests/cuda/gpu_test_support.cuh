// What the GPU tests share: the skip when no CUDA device is present, a
// checked CUDA call, the test data (the same words on host and device) and a
// kernel that holds a stream, to show that work is ordered after it. Each
// test binary is one translation unit, so the kernels are defined here.
#ifndef SPILLFS_TESTS_CUDA_GPU_TEST_SUPPORT_CUH_
#define SPILLFS_TESTS_CUDA_GPU_TEST_SUPPORT_CUH_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

namespace spillfs::gpu_test {

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!::spillfs::gpu_test::HaveGpu()) GTEST_SKIP() << "no CUDA device"

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// The test data: word i of seed s (SplitMix64), the same on both sides.
__host__ __device__ inline uint64_t Word(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + i * 0xBF58476D1CE4E5B9ULL + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Byte i of the same data (little-endian words).
__host__ __device__ inline uint8_t Byte(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>(Word(seed, i / 8) >> (8 * (i % 8)));
}

__global__ void FillWordsKernel(uint64_t* p, size_t words, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = Word(seed, i);
}

__global__ void FillBytesKernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = Byte(seed, i);
}

// Holds its stream for `ms` milliseconds of GPU time.
__global__ void SleepKernel(int ms) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(100000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<uint64_t>(ms) * 1000000);
}

}  // namespace spillfs::gpu_test

#endif  // SPILLFS_TESTS_CUDA_GPU_TEST_SUPPORT_CUH_
