// FeatureCache (cuda/include/spillfs/cuda/feature_cache.h) where it cannot
// run: a build without CUDA answers ENOTSUP, a machine without a device
// ENODEV; bad shapes are refused either way before any CUDA call. (On a GPU:
// tests/cuda/feature_cache_gpu_test.cu.)
#include "spillfs/cuda/feature_cache.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "spillfs/cuda/runtime.h"

namespace spillfs::cuda {
namespace {

TEST(FeatureCacheHostTest, RefusedWithoutCudaOrADevice) {
  if (DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present (tests/cuda/feature_cache_gpu_test.cu)";
  FeatureCacheShape shape;
  shape.row_bytes = 64;
  shape.rows = 100;
  shape.rows_per_line = 4;
  shape.cache_lines = 8;
  shape.staging_lines = 4;
  auto made = FeatureCache::Create(0, shape);
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(made.status().code() == ENOTSUP || made.status().code() == ENODEV) << made.status().ToString();
}

TEST(FeatureCacheHostTest, ShapeLines) {
  FeatureCacheShape shape;
  shape.row_bytes = 52;
  shape.rows = 1237;
  shape.rows_per_line = 78;
  EXPECT_EQ(shape.line_bytes(), 52u * 78u);
  EXPECT_EQ(shape.lines(), 16u);  // the last one partial
}

}  // namespace
}  // namespace spillfs::cuda
