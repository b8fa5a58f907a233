// cuda/ on a GPU: the hash kernels (every thread shape, odd sizes and
// alignments) equal the host code and libxxhash, work is ordered on the
// caller's stream, the pool's memory is pinned, and CopyStream's copies are
// ordered against a caller's stream both ways. Every test skips, saying so,
// where no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpu_test_support.cuh"
#include "hash_launch.h"
#include "spillfs/common/block_checksum.h"
#include "spillfs/cuda/copy_stream.h"
#include "spillfs/cuda/hash_kernels.h"
#include "spillfs/cuda/pinned_pool.h"
#include "spillfs/cuda/runtime.h"

namespace spillfs::cuda {
namespace {

using gpu_test::FillWordsKernel;
using gpu_test::SleepKernel;
using gpu_test::Word;

// One thread a length: both hashes of data[offset(len), + len).
__global__ void ScalarHashKernel(const uint8_t* data, size_t lengths, uint64_t* out64, Hash128* out128) {
  const size_t len = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (len >= lengths) return;
  const uint8_t* p = data + len % 16;
  out64[len] = Xxh3Hash64(p, len);
  out128[len] = Xxh3Hash128(p, len);
}

// A device buffer of `bytes` random bytes (and its host copy).
class DeviceBytes {
 public:
  DeviceBytes(size_t bytes, uint64_t seed, cudaStream_t stream = 0) : bytes_(bytes) {
    const size_t words = (bytes + 7) / 8 + 1;
    if (cudaMalloc(&data_, words * 8) != cudaSuccess) return;
    FillWordsKernel<<<256, 256, 0, stream>>>(static_cast<uint64_t*>(data_), words, seed);
    host_.resize(words * 8);
    for (size_t i = 0; i < words; ++i) {
      const uint64_t w = Word(seed, i);
      std::memcpy(host_.data() + 8 * i, &w, 8);
    }
  }
  ~DeviceBytes() { cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  bool ok() const { return data_ != nullptr; }
  const uint8_t* device(size_t offset = 0) const { return static_cast<const uint8_t*>(data_) + offset; }
  const uint8_t* host(size_t offset = 0) const { return host_.data() + offset; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_;
  void* data_ = nullptr;
  std::vector<uint8_t> host_;
};

constexpr int kShapes[] = {0, 1, 2, 4, 8};

// Hash128 per whole unit or uint32_t per unit (partial included), from the
// GPU with `launch`, against the host code over the same bytes.
template <typename Out>
void ExpectKernelEqualsHost(const DeviceBytes& bytes, size_t offset, size_t length, size_t unit,
                            internal::HashLaunch launch) {
  constexpr bool kWide = std::is_same_v<Out, Hash128>;
  SCOPED_TRACE(testing::Message() << (kWide ? "units" : "blocks") << " of " << unit << " over " << length
                                  << " bytes at offset " << offset << ", " << launch.threads_per_unit
                                  << " threads a unit, " << launch.block_threads << " a block");
  const Out canary = [] {
    if constexpr (kWide) {
      return Hash128{7, 7};
    } else {
      return uint32_t{7};
    }
  }();
  std::vector<Out> want(kWide ? UnitCount(length, unit) : BlockCount(length, unit));
  std::vector<Out> got(want.size() + 1, canary);
  if constexpr (kWide) {
    ASSERT_TRUE(UnitHashesHost(bytes.host(offset), length, unit, want.data()).ok());
  } else {
    ASSERT_TRUE(BlockChecksumsHost(bytes.host(offset), length, unit, want.data()).ok());
  }
  const Status status = internal::LaunchHashes(bytes.device(offset), length, unit, kWide, got.data(), 0, launch);
  ASSERT_TRUE(status.ok()) << status.ToString();
  for (size_t u = 0; u < want.size(); ++u) ASSERT_EQ(got[u], want[u]) << "hash " << u;
  EXPECT_EQ(got.back(), canary) << "wrote past the last hash";
}

TEST(GpuXxh3, ScalarCodeOnTheDeviceEqualsLibxxhash) {
  SKIP_WITHOUT_GPU();
  const size_t lengths = 4097;  // 0..4096, at offsets 0..15
  DeviceBytes bytes(lengths + 16, 1);
  ASSERT_TRUE(bytes.ok());
  uint64_t* out64 = nullptr;
  Hash128* out128 = nullptr;
  ASSERT_CUDA(cudaMalloc(&out64, lengths * sizeof(uint64_t)));
  ASSERT_CUDA(cudaMalloc(&out128, lengths * sizeof(Hash128)));
  ScalarHashKernel<<<(lengths + 127) / 128, 128>>>(bytes.device(), lengths, out64, out128);
  std::vector<uint64_t> got64(lengths);
  std::vector<Hash128> got128(lengths);
  ASSERT_CUDA(cudaMemcpy(got64.data(), out64, lengths * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(got128.data(), out128, lengths * sizeof(Hash128), cudaMemcpyDeviceToHost));
  cudaFree(out64);
  cudaFree(out128);
  for (size_t len = 0; len < lengths; ++len) {
    const uint8_t* p = bytes.host(len % 16);
    ASSERT_EQ(got64[len], XXH3_64bits(p, len)) << "len " << len;
    const XXH128_hash_t want = XXH3_128bits(p, len);
    ASSERT_EQ(got128[len], (Hash128{want.low64, want.high64})) << "len " << len;
  }
}

TEST(GpuHashKernels, UnitHashesEqualTheDedupKeys) {
  SKIP_WITHOUT_GPU();
  const size_t length = 64 * kDedupUnitBytes + 12345;
  DeviceBytes bytes(length, 2);
  ASSERT_TRUE(bytes.ok());
  for (int shape : kShapes)
    for (int block_threads : {256, 64}) {
      ExpectKernelEqualsHost<Hash128>(bytes, 0, length, kDedupUnitBytes, {shape, block_threads});
      if (HasFailure()) return;
    }
  // The public entry point, against the daemon's own function.
  std::vector<Hash128> got(64);
  ASSERT_TRUE(UnitHashes(bytes.device(), length, kDedupUnitBytes, got.data(), 0).ok());
  for (size_t u = 0; u < got.size(); ++u) {
    const XXH128_hash_t want = ContentHash128(bytes.host(u * kDedupUnitBytes), kDedupUnitBytes);
    ASSERT_EQ(got[u], (Hash128{want.low64, want.high64})) << "unit " << u;
  }
}

TEST(GpuHashKernels, BlockChecksumsEqualTheVolumes) {
  SKIP_WITHOUT_GPU();
  const size_t length = 4096 * kChecksumBlockBytes + 777;
  DeviceBytes bytes(length, 3);
  ASSERT_TRUE(bytes.ok());
  for (int shape : kShapes)
    for (int block_threads : {256, 96}) {
      ExpectKernelEqualsHost<uint32_t>(bytes, 0, length, kChecksumBlockBytes, {shape, block_threads});
      if (HasFailure()) return;
    }
  std::vector<uint32_t> got(BlockCount(length, kChecksumBlockBytes));
  ASSERT_TRUE(BlockChecksums(bytes.device(), length, kChecksumBlockBytes, got.data(), 0).ok());
  for (size_t b = 0; b < got.size(); ++b) {
    const size_t n = std::min(kChecksumBlockBytes, length - b * kChecksumBlockBytes);
    ASSERT_EQ(got[b], BlockChecksum(bytes.host(b * kChecksumBlockBytes), n)) << "block " << b;
  }
}

TEST(GpuHashKernels, OddUnitSizesAlignmentsAndCounts) {
  SKIP_WITHOUT_GPU();
  DeviceBytes bytes((1 << 20) + 4096, 4);
  ASSERT_TRUE(bytes.ok());
  // Long units of every last-block shape, short and odd units (the reference
  // kernel), 8- and 1-byte-aligned starts (the reference kernel too), and
  // unit counts that leave most of a warp idle.
  for (size_t unit : {256, 320, 1024, 1088, 2048 + 960, 4096 + 64, 65536, 200, 241, 1000})
    for (size_t offset : {0, 16, 8, 1})
      for (size_t length : {static_cast<size_t>(1 << 20), 3 * unit + 5, unit, unit - 1})
        for (int shape : kShapes) {
          ExpectKernelEqualsHost<Hash128>(bytes, offset, length, unit, {shape, 128});
          ExpectKernelEqualsHost<uint32_t>(bytes, offset, length, unit, {shape, 128});
          if (HasFailure()) return;
        }
}

TEST(GpuHashKernels, RunAfterTheCallersWork) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The data is written on the stream after 50 ms; hashed right away on it.
  SleepKernel<<<1, 1, 0, stream>>>(50);
  DeviceBytes bytes(8 * kDedupUnitBytes, 5, stream);
  ASSERT_TRUE(bytes.ok());
  std::vector<Hash128> got(8), want(8);
  ASSERT_TRUE(
      UnitHashes(bytes.device(), bytes.size(), kDedupUnitBytes, got.data(), reinterpret_cast<uintptr_t>(stream)).ok());
  ASSERT_TRUE(UnitHashesHost(bytes.host(), bytes.size(), kDedupUnitBytes, want.data()).ok());
  for (size_t u = 0; u < 8; ++u) EXPECT_EQ(got[u], want[u]) << "unit " << u;
  cudaStreamDestroy(stream);
}

TEST(GpuHashKernels, FromAThreadThatNeverUsedCuda) {
  SKIP_WITHOUT_GPU();
  DeviceBytes bytes(4 * kDedupUnitBytes, 10);
  ASSERT_TRUE(bytes.ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<Hash128> got(4), want(4);
  std::string error = "not run";
  std::thread([&] {
    const Status status = UnitHashes(bytes.device(), bytes.size(), kDedupUnitBytes, got.data(), 0);
    error = status.ok() ? "" : status.ToString();
  }).join();
  ASSERT_EQ(error, "");
  ASSERT_TRUE(UnitHashesHost(bytes.host(), bytes.size(), kDedupUnitBytes, want.data()).ok());
  EXPECT_EQ(got, want);
}

TEST(GpuHashKernels, RejectBadArguments) {
  SKIP_WITHOUT_GPU();
  std::vector<uint8_t> host(kDedupUnitBytes);
  Hash128 h{};
  uint32_t c = 0;
  EXPECT_EQ(UnitHashes(host.data(), host.size(), kDedupUnitBytes, &h, 0).code(), EINVAL) << "host memory";
  EXPECT_EQ(BlockChecksums(host.data(), 4096, 4096, &c, 0).code(), EINVAL) << "host memory";
  DeviceBytes bytes(kDedupUnitBytes, 6);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(UnitHashes(bytes.device(), bytes.size(), 0, &h, 0).code(), EINVAL);
  EXPECT_EQ(internal::LaunchHashes(bytes.device(), bytes.size(), 4096, true, &h, 0, {3, 256}).code(), EINVAL);
  EXPECT_EQ(internal::LaunchHashes(bytes.device(), bytes.size(), 4096, true, &h, 0, {4, 512}).code(), EINVAL);
  // Nothing to hash: no output touched.
  EXPECT_TRUE(UnitHashes(bytes.device(), kDedupUnitBytes - 1, kDedupUnitBytes, nullptr, 0).ok());
  EXPECT_TRUE(BlockChecksums(bytes.device(), 0, 4096, nullptr, 0).ok());
}

TEST(GpuRuntime, PointerDevice) {
  SKIP_WITHOUT_GPU();
  int device = -1;
  ASSERT_CUDA(cudaGetDevice(&device));
  void* dev = nullptr;
  void* managed = nullptr;
  void* pinned = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, 4096));
  ASSERT_CUDA(cudaMallocManaged(&managed, 4096));
  ASSERT_CUDA(cudaHostAlloc(&pinned, 4096, cudaHostAllocDefault));
  int local = 0;
  EXPECT_EQ(PointerDevice(dev), device);
  EXPECT_EQ(PointerDevice(static_cast<char*>(dev) + 100), device);
  EXPECT_EQ(PointerDevice(managed), device);
  EXPECT_EQ(PointerDevice(pinned), -1);
  EXPECT_EQ(PointerDevice(&local), -1);
  cudaFree(dev);
  cudaFree(managed);
  cudaFreeHost(pinned);
}

TEST(GpuPinnedPool, SlabsArePinned) {
  SKIP_WITHOUT_GPU();
  PinnedPool pool(64 << 20, 16 << 20);
  ASSERT_TRUE(pool.pinned());
  PinnedBuffer buffer = pool.Acquire(8 << 20);
  ASSERT_TRUE(buffer);
  cudaPointerAttributes attributes{};
  ASSERT_CUDA(cudaPointerGetAttributes(&attributes, buffer.data()));
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  // An asynchronous copy into it returns before the copy is done only for
  // pinned memory; here, check that it is right.
  DeviceBytes bytes(buffer.size(), 7);
  ASSERT_TRUE(bytes.ok());
  ASSERT_CUDA(cudaMemcpyAsync(buffer.data(), bytes.device(), buffer.size(), cudaMemcpyDeviceToHost, 0));
  ASSERT_CUDA(cudaStreamSynchronize(0));
  EXPECT_EQ(std::memcmp(buffer.data(), bytes.host(), buffer.size()), 0);
}

TEST(GpuCopyStream, CreateRefusesMissingDevices) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(CopyStream::Create(-1).status().code(), ENODEV);
  EXPECT_EQ(CopyStream::Create(DeviceCount()).status().code(), ENODEV);
  Result<std::unique_ptr<CopyStream>> copy = CopyStream::Create(0);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ((*copy)->device(), 0);
  EXPECT_NE((*copy)->stream(), 0u);
}

TEST(GpuCopyStream, RoundTripOrderedAgainstTheCallersStream) {
  SKIP_WITHOUT_GPU();
  int device = 0;
  ASSERT_CUDA(cudaGetDevice(&device));
  Result<std::unique_ptr<CopyStream>> created = CopyStream::Create(device);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyStream& copy = **created;
  cudaStream_t caller;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  const size_t n = 16 << 20;
  PinnedPool pool(64 << 20, 32 << 20);
  PinnedBuffer out = pool.Acquire(n);
  PinnedBuffer back = pool.Acquire(n);
  ASSERT_TRUE(out && back);
  void* dst = nullptr;
  ASSERT_CUDA(cudaMalloc(&dst, n));
  ASSERT_CUDA(cudaMemset(dst, 0, n));

  // Save: the caller writes the data 50 ms late; the copy waits for it.
  SleepKernel<<<1, 1, 0, caller>>>(50);
  DeviceBytes src(n, 8, caller);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(copy.WaitFor(reinterpret_cast<uintptr_t>(caller)).ok());
  ASSERT_TRUE(copy.ToHost(out.data(), src.device(), n).ok());
  Result<CopyEvent> saved = copy.Record();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_TRUE(copy.Wait(*saved).ok());
  Result<bool> done = copy.Done(*saved);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  ASSERT_EQ(std::memcmp(out.data(), src.host(), n), 0) << "the copy ran before the caller's write";

  // Load: the copy stream is held 50 ms; the caller's read of the
  // destination must wait for the copy, not see the zeros.
  SleepKernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(copy.stream())>>>(50);
  ASSERT_TRUE(copy.ToDevice(dst, out.data(), n).ok());
  Result<CopyEvent> loaded = copy.Record();
  ASSERT_TRUE(loaded.ok());
  Result<bool> early = copy.Done(*loaded);
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(*early) << "the copy stream's sleep should still be running";
  ASSERT_TRUE(copy.SignalTo(reinterpret_cast<uintptr_t>(caller)).ok());
  ASSERT_CUDA(cudaMemcpyAsync(back.data(), dst, n, cudaMemcpyDeviceToHost, caller));
  ASSERT_CUDA(cudaStreamSynchronize(caller));
  EXPECT_EQ(std::memcmp(back.data(), src.host(), n), 0) << "the caller read before the copy landed";

  ASSERT_TRUE(copy.Synchronize().ok());
  cudaFree(dst);
  cudaStreamDestroy(caller);
}

TEST(GpuCopyStream, LegacyDefaultStreamAsTheCaller) {
  SKIP_WITHOUT_GPU();
  Result<std::unique_ptr<CopyStream>> created = CopyStream::Create(0);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CopyStream& copy = **created;
  const size_t n = 4 << 20;
  PinnedPool pool(n, n);
  PinnedBuffer out = pool.Acquire(n);
  ASSERT_TRUE(out);
  SleepKernel<<<1, 1, 0, 0>>>(30);
  DeviceBytes src(n, 9, 0);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(copy.WaitFor(0).ok());
  ASSERT_TRUE(copy.ToHost(out.data(), src.device(), n).ok());
  ASSERT_TRUE(copy.Synchronize().ok());
  EXPECT_EQ(std::memcmp(out.data(), src.host(), n), 0);
}

}  // namespace
}  // namespace spillfs::cuda
