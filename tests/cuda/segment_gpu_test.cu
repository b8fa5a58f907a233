// Segment files (libspillfs_client's C ABI) with CUDA device segments, on a
// plain directory: device and host segments at odd offsets and lengths go
// GPU -> pinned pool -> disk and back, the copies wait for the work the
// caller queued on its stream before the call, and spill_hash_units over
// device memory equals the CPU's. Every test skips, saying so, where no CUDA
// device is present. (On a spillfs mount: tests/python/test_cuda_serialization.py.)
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.cuh"
#include "spillfs/client.h"

namespace {

using spillfs::gpu_test::Byte;
using spillfs::gpu_test::FillBytesKernel;
using spillfs::gpu_test::HaveGpu;
using spillfs::gpu_test::SleepKernel;

std::string HostBytes(uint64_t seed, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(Byte(seed, i));
  return out;
}

std::string ReadWhole(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return out;
  char buf[1 << 16];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

class SegmentGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    char tmpl[] = "/tmp/spillfs-segment-gpu-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  uintptr_t stream() const { return reinterpret_cast<uintptr_t>(stream_); }

  std::string dir_;
  cudaStream_t stream_ = nullptr;
};

// Device segments (at odd places inside one allocation) and host segments
// in one request; the fill kernel runs behind a sleeping kernel on the
// caller's stream, so a copy that did not wait for it would read garbage.
TEST_F(SegmentGpuTest, DeviceAndHostSegmentsRoundTrip) {
  const size_t kDevice = 40 << 20;
  uint8_t* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, kDevice));
  ASSERT_CUDA(cudaMemset(dev, 0xee, kDevice));
  SleepKernel<<<1, 1, 0, stream_>>>(300);
  FillBytesKernel<<<256, 256, 0, stream_>>>(dev, kDevice, 5);
  ASSERT_CUDA(cudaGetLastError());

  const std::string host = HostBytes(6, 3 << 20);
  struct Piece {
    size_t dev_at;  // in `dev`, or SIZE_MAX for host
    uint64_t length, file_offset;
  };
  const std::vector<Piece> pieces = {{0, 1, 0},
                                     {SIZE_MAX, 100, 1},
                                     {17, 9 << 20, 4096 + 3},
                                     {SIZE_MAX, 3 << 20, (9 << 20) + 5000},
                                     {(9 << 20) + 4096, 20 << 20, 16 << 20},
                                     {(30 << 20) + 1, 4095, (36 << 20) + 77}};
  std::vector<spill_segment> segs;
  std::string image;
  const std::string device_bytes = HostBytes(5, kDevice);
  for (const Piece& p : pieces) {
    const bool on_device = p.dev_at != SIZE_MAX;
    void* ptr = on_device ? static_cast<void*>(dev + p.dev_at) : const_cast<char*>(host.data());
    segs.push_back(spill_segment{ptr, p.length, p.file_offset, on_device ? 0 : -1});
    if (image.size() < p.file_offset + p.length) image.resize(p.file_offset + p.length, '\0');
    image.replace(p.file_offset, p.length,
                  on_device ? device_bytes.substr(p.dev_at, p.length) : host.substr(0, p.length));
  }
  const std::string path = dir_ + "/mixed";
  spill_file* f = spill_file_open(path.c_str(), SPILL_FILE_READ | SPILL_FILE_WRITE | SPILL_FILE_CREATE, 0);
  ASSERT_NE(f, nullptr) << spill_last_error();
  spill_request* r = nullptr;
  ASSERT_EQ(spill_file_write_segments(f, segs.data(), segs.size(), stream(), &r), 0) << spill_last_error();
  spill_io_stats stats{};
  ASSERT_EQ(spill_request_wait(r, &stats), 0) << spill_last_error();
  EXPECT_GT(stats.copy_seconds, 0.0);
  EXPECT_TRUE(ReadWhole(path) == image) << "the file differs from the segments written";

  // Back into fresh device memory (odd offsets), then to the host on the
  // caller's stream: ordered after the library's copies.
  uint8_t* back = nullptr;
  ASSERT_CUDA(cudaMalloc(&back, kDevice));
  ASSERT_CUDA(cudaMemset(back, 0, kDevice));
  std::vector<spill_segment> reads;
  size_t at = 3;
  for (const Piece& p : pieces) {
    reads.push_back(spill_segment{back + at, p.length, p.file_offset, 0});
    at += p.length + 1;
  }
  SleepKernel<<<1, 1, 0, stream_>>>(100);
  ASSERT_EQ(spill_file_read_segments(f, reads.data(), reads.size(), stream(), &r), 0) << spill_last_error();
  ASSERT_EQ(spill_request_wait(r, nullptr), 0) << spill_last_error();
  std::string got(kDevice, '\0');
  ASSERT_CUDA(cudaMemcpyAsync(got.data(), back, kDevice, cudaMemcpyDeviceToHost, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  at = 3;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_TRUE(got.substr(at, pieces[i].length) == image.substr(pieces[i].file_offset, pieces[i].length))
        << "segment " << i;
    at += pieces[i].length + 1;
  }
  EXPECT_EQ(spill_file_close(f), 0);
  cudaFree(dev);
  cudaFree(back);
}

// Many read requests into device memory at once, from a staging pool of
// four buffers: a request keeps the buffers of pieces whose device copies
// are queued, so requests that each held some while waiting for the pool
// would wait for ever (a load of a state_dict's storages does this); each
// gives back what it can first. A watchdog aborts a run that stalls.
TEST_F(SegmentGpuTest, ManyDeviceReadsShareASmallStagingPool) {
  const uint64_t kChunk = 1 << 20, kEach = 6 << 20;
  const int kRequests = 8;
  ASSERT_EQ(spill_config_set("chunk_bytes", kChunk), 0) << spill_last_error();
  ASSERT_EQ(spill_config_set("io_bytes", kChunk), 0) << spill_last_error();
  ASSERT_EQ(spill_config_set("pinned_bytes", 4 * kChunk), 0) << spill_last_error();
  const std::string path = dir_ + "/many";
  const std::string image = HostBytes(9, kRequests * kEach);
  spill_file* f = spill_file_open(path.c_str(), SPILL_FILE_READ | SPILL_FILE_WRITE | SPILL_FILE_CREATE, 0);
  ASSERT_NE(f, nullptr) << spill_last_error();
  spill_request* r = nullptr;
  spill_segment whole{const_cast<char*>(image.data()), image.size(), 0, -1};
  ASSERT_EQ(spill_file_write_segments(f, &whole, 1, 0, &r), 0) << spill_last_error();
  ASSERT_EQ(spill_request_wait(r, nullptr), 0) << spill_last_error();

  uint8_t* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, image.size()));
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done.load()) {
      std::fprintf(stderr, "reads sharing a staging pool of 4 buffers stalled for 60 s\n");
      std::abort();
    }
  });
  for (int round = 0; round < 5; ++round) {
    std::vector<spill_request*> requests(kRequests, nullptr);
    for (int i = 0; i < kRequests; ++i) {
      spill_segment seg{dev + i * kEach, kEach, i * kEach, 0};
      ASSERT_EQ(spill_file_read_segments(f, &seg, 1, stream(), &requests[i]), 0) << spill_last_error();
    }
    for (spill_request* request : requests) EXPECT_EQ(spill_request_wait(request, nullptr), 0) << spill_last_error();
  }
  done = true;
  watchdog.join();
  std::string got(image.size(), '\0');
  ASSERT_CUDA(cudaMemcpy(got.data(), dev, image.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(got == image) << "device memory differs from the file";
  EXPECT_EQ(spill_file_close(f), 0);
  cudaFree(dev);
  ASSERT_EQ(spill_config_set("chunk_bytes", 8 << 20), 0);
  ASSERT_EQ(spill_config_set("io_bytes", 1 << 20), 0);
  ASSERT_EQ(spill_config_set("pinned_bytes", 256 << 20), 0);
}

TEST_F(SegmentGpuTest, DeviceUnitHashesEqualTheHosts) {
  const size_t n = (5 << 20) + 100;  // 20 whole units and a partial one
  uint8_t* dev = nullptr;
  ASSERT_CUDA(cudaMalloc(&dev, n));
  SleepKernel<<<1, 1, 0, stream_>>>(100);
  FillBytesKernel<<<256, 256, 0, stream_>>>(dev, n, 9);
  const std::string host = HostBytes(9, n);
  std::vector<uint64_t> on_gpu(40, 1), on_cpu(40, 2);
  ASSERT_EQ(spill_hash_units(dev, n, 0, stream(), on_gpu.data()), 0) << spill_last_error();
  ASSERT_EQ(spill_hash_units(host.data(), n, -1, 0, on_cpu.data()), 0) << spill_last_error();
  EXPECT_EQ(on_gpu, on_cpu);
  // Memory of the other kind is refused, not read.
  EXPECT_EQ(spill_hash_units(dev, n, -1, 0, on_cpu.data()), -EINVAL);
  cudaFree(dev);
}

}  // namespace
