// The GPU feature cache through the C ABI (spill_gpu_cache_*): a table in
// host memory stands for the file. With every line in no tier, the gather
// kernel posts every row to the request ring; filled from staging (rows
// scattered, lines installed) the output equals the table; the next gather
// serves the same rows from HBM and hot rows from the pinned hot buffer,
// stamps mark the lines hit, and evicted lines land in the victim buffer.
// Rows of 12 bytes (1-byte copies... 4-byte words), 64 and 4400 bytes; then
// many rows through every shape of the gather kernel (3 to 4400 bytes). Every
// test skips, saying so, without a CUDA device; without CUDA in the build the
// library answers -ENOTSUP (checked where no device is present).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.cuh"
#include "spillfs/client.h"

namespace {

using spillfs::gpu_test::HaveGpu;

TEST(FeatureCacheTest, RefusedWithoutADevice) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present";
  spill_gpu_cache_shape shape{64, 100, 4, 8, 0, 0, 4};
  EXPECT_EQ(spill_gpu_cache_create(0, &shape), nullptr);
  EXPECT_TRUE(errno == ENODEV || errno == ENOTSUP) << spill_last_error();
}

class FeatureCacheGpuTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(FeatureCacheGpuTest, MissesFillHitsHotAndVictims) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const uint64_t row_bytes = GetParam();
  const uint64_t rows = 1001;
  const uint64_t rpl = std::max<uint64_t>(1, 4096 / row_bytes);
  const uint64_t n_lines = (rows + rpl - 1) / rpl;
  std::vector<uint8_t> table(rows * row_bytes);
  std::mt19937_64 rng(row_bytes);
  for (auto& b : table) b = static_cast<uint8_t>(rng());
  const uint64_t lb = rpl * row_bytes;
  spill_gpu_cache_shape shape{row_bytes, rows, rpl, /*cache*/ 6, /*hot*/ 2, /*victim*/ 4, /*staging*/ n_lines};
  spill_gpu_cache* cache = spill_gpu_cache_create(0, &shape);
  ASSERT_NE(cache, nullptr) << spill_last_error();
  // Hot lines 0 and the last.
  auto* hot = static_cast<uint8_t*>(spill_gpu_cache_host_buffer(cache, 0));
  const int64_t hot_lines[2] = {0, static_cast<int64_t>(n_lines - 1)};
  for (int i = 0; i < 2; ++i) {
    const uint64_t first = hot_lines[i] * rpl, count = std::min(rpl, rows - first);
    std::memcpy(hot + i * lb, table.data() + first * row_bytes, count * row_bytes);
  }
  ASSERT_EQ(spill_gpu_cache_set_hot(cache, hot_lines, 2), 0) << spill_last_error();

  std::vector<int64_t> index = {0,
                                5,
                                17 % static_cast<int64_t>(rows),
                                static_cast<int64_t>(rows - 1),
                                static_cast<int64_t>(rpl),
                                static_cast<int64_t>(2 * rpl + 1),
                                500,
                                500,
                                999};
  const size_t n = index.size();
  int64_t* d_index = nullptr;
  uint8_t* d_out = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_index, n * 8));
  ASSERT_CUDA(cudaMalloc(&d_out, n * row_bytes));
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto s = reinterpret_cast<uintptr_t>(stream);
  // Every write to device memory on `stream`: a non-blocking stream is not
  // ordered after the legacy default stream (cudaMemset, and cudaMemcpy from
  // pageable memory, can return before their write has landed).
  ASSERT_CUDA(cudaMemcpyAsync(d_index, index.data(), n * 8, cudaMemcpyHostToDevice, stream));
  ASSERT_CUDA(cudaStreamSynchronize(stream));

  auto check_out = [&] {
    std::vector<uint8_t> out(n * row_bytes);
    ASSERT_CUDA(cudaMemcpy(out.data(), d_out, out.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(out.data() + i * row_bytes, table.data() + index[i] * row_bytes, row_bytes), 0)
          << "row " << index[i] << " at " << i;
    }
  };
  auto is_hot = [&](int64_t row) { return row / static_cast<int64_t>(rpl) == 0 || row / rpl == n_lines - 1; };
  const size_t n_hot = std::count_if(index.begin(), index.end(), is_hot);

  spill_gpu_gather_counts counts{};
  ASSERT_CUDA(cudaMemsetAsync(d_out, 0, n * row_bytes, stream));
  ASSERT_EQ(spill_gpu_cache_gather(cache, d_index, n, d_out, 1, s, &counts), 0) << spill_last_error();
  EXPECT_EQ(counts.gpu_hits, 0u);
  EXPECT_EQ(counts.hot_hits, n_hot);
  ASSERT_EQ(counts.misses, n - n_hot);
  std::vector<int64_t> mrows(counts.misses), mpos(counts.misses);
  ASSERT_EQ(spill_gpu_cache_misses(cache, mrows.data(), mpos.data(), counts.misses), 0);
  // Stage each missing line once; install the first ones.
  std::vector<int64_t> staged_lines, install, entry_staged;
  for (int64_t r : mrows) {
    const int64_t line = r / static_cast<int64_t>(rpl);
    auto it = std::find(staged_lines.begin(), staged_lines.end(), line);
    if (it == staged_lines.end()) {
      staged_lines.push_back(line);
      it = staged_lines.end() - 1;
    }
    entry_staged.push_back(it - staged_lines.begin());
  }
  auto* staging = static_cast<uint8_t*>(spill_gpu_cache_host_buffer(cache, 2));
  for (size_t k = 0; k < staged_lines.size(); ++k) {
    const uint64_t first = staged_lines[k] * rpl, count = std::min(rpl, rows - first);
    std::memcpy(staging + k * lb, table.data() + first * row_bytes, count * row_bytes);
    install.push_back(k < shape.cache_lines ? static_cast<int64_t>(k) : -1);
  }
  spill_gpu_fill fill{0,
                      nullptr,
                      nullptr,
                      nullptr,
                      staged_lines.size(),
                      staged_lines.data(),
                      install.data(),
                      mrows.size(),
                      mrows.data(),
                      mpos.data(),
                      entry_staged.data()};
  ASSERT_EQ(spill_gpu_cache_fill(cache, &fill, d_out, 1, s), 0) << spill_last_error();
  check_out();

  // Again: every row from HBM or the hot buffer.
  ASSERT_CUDA(cudaMemsetAsync(d_out, 0, n * row_bytes, stream));
  ASSERT_EQ(spill_gpu_cache_gather(cache, d_index, n, d_out, 2, s, &counts), 0) << spill_last_error();
  EXPECT_EQ(counts.misses, 0u);
  EXPECT_EQ(counts.hot_hits, n_hot);
  EXPECT_EQ(counts.gpu_hits, n - n_hot);
  check_out();
  std::vector<uint32_t> stamps(shape.cache_lines);
  ASSERT_EQ(spill_gpu_cache_stamps(cache, stamps.data()), 0);
  for (size_t k = 0; k < std::min<size_t>(staged_lines.size(), shape.cache_lines); ++k) EXPECT_EQ(stamps[k], 2u);

  // Evict slot 0 into victim slot 3: its bytes arrive there and its rows miss.
  const int64_t ev_line = staged_lines[0], ev_slot = 0, vslot = 3;
  spill_gpu_fill evict{1, &ev_line, &ev_slot, &vslot, 0, nullptr, nullptr, 0, nullptr, nullptr, nullptr};
  ASSERT_EQ(spill_gpu_cache_fill(cache, &evict, d_out, 3, s), 0) << spill_last_error();
  auto* victim = static_cast<uint8_t*>(spill_gpu_cache_host_buffer(cache, 1));
  const uint64_t first = ev_line * rpl, count = std::min(rpl, rows - first);
  EXPECT_EQ(std::memcmp(victim + vslot * lb, table.data() + first * row_bytes, count * row_bytes), 0);
  ASSERT_EQ(spill_gpu_cache_gather(cache, d_index, n, d_out, 4, s, &counts), 0) << spill_last_error();
  size_t in_line = std::count_if(index.begin(), index.end(), [&](int64_t r) { return r / (int64_t)rpl == ev_line; });
  EXPECT_EQ(counts.misses, in_line);

  EXPECT_EQ(spill_gpu_cache_destroy(cache), 0);
  cudaFree(d_index);
  cudaFree(d_out);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(RowBytes, FeatureCacheGpuTest, ::testing::Values(12, 64, 4400));

// Many rows through every shape of the gather kernel: batches that give a
// warp 32, 16 and 8 rows a step (and a partial step), 16-, 8-, 4- and 1-byte
// words (output addresses offset by 0, 8, 4, 1), negative indices, and a
// refused batch (an index out of range) that changes nothing, after which the
// next gather counts right (the counters went back to idle).
class FeatureCacheManyRowsTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(FeatureCacheManyRowsTest, StepsWordsNegativesAndRefusals) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const uint64_t row_bytes = GetParam();
  const uint64_t rows = row_bytes > 1024 ? 3001 : 20011;
  const uint64_t rpl = std::max<uint64_t>(1, 4096 / row_bytes);
  const uint64_t n_lines = (rows + rpl - 1) / rpl;
  const uint64_t lb = rpl * row_bytes;
  std::vector<uint8_t> table(n_lines * lb);
  std::mt19937_64 rng(row_bytes + 7);
  for (auto& b : table) b = static_cast<uint8_t>(rng());
  spill_gpu_cache_shape shape{row_bytes, rows, rpl, /*cache*/ n_lines, 0, 0, /*staging*/ n_lines};
  spill_gpu_cache* cache = spill_gpu_cache_create(0, &shape);
  ASSERT_NE(cache, nullptr) << spill_last_error();

  const size_t n = std::min<size_t>(200000, (size_t{64} << 20) / row_bytes);
  std::vector<int64_t> index(n), norm(n);
  for (size_t i = 0; i < n; ++i) {
    index[i] = static_cast<int64_t>(rng() % (2 * rows)) - static_cast<int64_t>(rows);  // [-rows, rows)
    norm[i] = index[i] < 0 ? index[i] + static_cast<int64_t>(rows) : index[i];
  }
  int64_t* d_index = nullptr;
  uint8_t* d_buf = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_index, n * 8));
  ASSERT_CUDA(cudaMalloc(&d_buf, n * row_bytes + 16));
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto s = reinterpret_cast<uintptr_t>(stream);
  // Device writes go on `stream` (see MissesFillHitsHotAndVictims): the
  // gathers run there, unordered with the legacy default stream.
  ASSERT_CUDA(cudaMemcpyAsync(d_index, index.data(), n * 8, cudaMemcpyHostToDevice, stream));
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  auto check_out = [&](const uint8_t* d_out, size_t count) {
    std::vector<uint8_t> out(count * row_bytes);
    ASSERT_CUDA(cudaMemcpy(out.data(), d_out, out.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(std::memcmp(out.data() + i * row_bytes, table.data() + norm[i] * row_bytes, row_bytes), 0)
          << "row " << norm[i] << " (index " << index[i] << ") at " << i << " of " << count;
    }
  };

  // Every row misses: the ring holds each position once, with its row in [0, rows).
  spill_gpu_gather_counts counts{};
  ASSERT_EQ(spill_gpu_cache_gather(cache, d_index, n, d_buf, 1, s, &counts), 0) << spill_last_error();
  EXPECT_EQ(counts.gpu_hits, 0u);
  EXPECT_EQ(counts.hot_hits, 0u);
  ASSERT_EQ(counts.misses, n);
  std::vector<int64_t> mrows(n), mpos(n);
  ASSERT_EQ(spill_gpu_cache_misses(cache, mrows.data(), mpos.data(), n), 0);
  std::vector<char> seen(n, 0);
  for (size_t k = 0; k < n; ++k) {
    ASSERT_TRUE(mpos[k] >= 0 && static_cast<size_t>(mpos[k]) < n && !seen[mpos[k]]) << mpos[k];
    seen[mpos[k]] = 1;
    ASSERT_EQ(mrows[k], norm[mpos[k]]) << "at " << mpos[k];
  }
  // Every line staged and installed into the slot of its number.
  std::memcpy(spill_gpu_cache_host_buffer(cache, 2), table.data(), table.size());
  std::vector<int64_t> lines(n_lines), entry_staged(n);
  std::iota(lines.begin(), lines.end(), 0);
  for (size_t k = 0; k < n; ++k) entry_staged[k] = mrows[k] / static_cast<int64_t>(rpl);
  spill_gpu_fill fill{0,
                      nullptr,
                      nullptr,
                      nullptr,
                      n_lines,
                      lines.data(),
                      lines.data(),
                      n,
                      mrows.data(),
                      mpos.data(),
                      entry_staged.data()};
  ASSERT_EQ(spill_gpu_cache_fill(cache, &fill, d_buf, 1, s), 0) << spill_last_error();
  check_out(d_buf, n);

  // All hits: every word size, every step size.
  uint32_t stamp = 1;
  for (size_t offset : {0, 8, 4, 1}) {
    for (size_t count : {n, std::min<size_t>(n, 50000), size_t{37}}) {
      ++stamp;
      ASSERT_CUDA(cudaMemsetAsync(d_buf, 0, n * row_bytes + 16, stream));
      ASSERT_EQ(spill_gpu_cache_gather(cache, d_index, count, d_buf + offset, stamp, s, &counts), 0)
          << spill_last_error();
      EXPECT_EQ(counts.gpu_hits, count) << "offset " << offset;
      EXPECT_EQ(counts.hot_hits, 0u);
      EXPECT_EQ(counts.misses, 0u);
      check_out(d_buf + offset, count);
    }
  }
  // The last three gathers (offset 1) stamped the lines of n, 50000 and 37
  // rows; lines no index names kept the install's stamp.
  std::vector<uint32_t> stamps(n_lines), expect(n_lines, 1);
  const size_t last_counts[3] = {n, std::min<size_t>(n, 50000), 37};
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < last_counts[k]; ++i) expect[norm[i] / rpl] = stamp - 2 + k;
  }
  ASSERT_EQ(spill_gpu_cache_stamps(cache, stamps.data()), 0);
  EXPECT_EQ(stamps, expect);

  // Refused: an index out of range (either side) changes nothing.
  for (int64_t bad : {static_cast<int64_t>(rows), -static_cast<int64_t>(rows) - 1}) {
    const size_t at = n / 2 + 3;
    // Landed before the check kernel reads it: else the check could pass and
    // the gather read `bad` (a row out of range: an illegal address).
    ASSERT_CUDA(cudaMemcpyAsync(d_index + at, &bad, 8, cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaMemsetAsync(d_buf, 0xab, n * row_bytes, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    counts = {1, 1, 1};
    EXPECT_EQ(spill_gpu_cache_gather(cache, d_index, n, d_buf, stamp + 1, s, &counts), -ERANGE);
    EXPECT_NE(std::string(spill_last_error()).find(std::to_string(at)), std::string::npos) << spill_last_error();
    EXPECT_EQ(counts.gpu_hits + counts.hot_hits + counts.misses, 0u);
    std::vector<uint8_t> out(n * row_bytes);
    ASSERT_CUDA(cudaMemcpy(out.data(), d_buf, out.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0xab; }));
    ASSERT_EQ(spill_gpu_cache_stamps(cache, stamps.data()), 0);
    EXPECT_EQ(stamps, expect);
    ASSERT_CUDA(cudaMemcpyAsync(d_index + at, &index[at], 8, cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    // The next gather counts from zero again; it stamps every line the index
    // names with the highest stamp so far.
    ASSERT_EQ(spill_gpu_cache_gather(cache, d_index, n, d_buf, stamp, s, &counts), 0) << spill_last_error();
    EXPECT_EQ(counts.gpu_hits, n);
    EXPECT_EQ(counts.misses, 0u);
    check_out(d_buf, n);
    for (size_t i = 0; i < n; ++i) expect[norm[i] / rpl] = stamp;
  }

  EXPECT_EQ(spill_gpu_cache_destroy(cache), 0);
  cudaFree(d_index);
  cudaFree(d_buf);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(RowBytes, FeatureCacheManyRowsTest, ::testing::Values(3, 12, 64, 512, 4400));

}  // namespace
