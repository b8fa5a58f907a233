// A shared library that links spillfs_cuda loads anywhere: with no GPU, no
// driver and no CUDA library installed it answers "no device".
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "spillfs/cuda/runtime.h"

namespace spillfs::cuda {
namespace {

TEST(CudaLibraryLoad, SharedLibraryLoadsAndCountsDevices) {
  // The build's path, unless the binaries travelled (cuda/run_device_tests.sh
  // names the copy).
  const char* path = std::getenv("CUDA_PROBE_LIBRARY");
  void* handle = dlopen(path != nullptr ? path : CUDA_PROBE_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto count = reinterpret_cast<int (*)()>(dlsym(handle, "cuda_probe_device_count"));
  ASSERT_NE(count, nullptr) << dlerror();
  EXPECT_EQ(count(), DeviceCount());
  dlclose(handle);
}

TEST(CudaLibraryLoad, AvailableAgreesWithDeviceCount) {
  EXPECT_GE(DeviceCount(), 0);
  EXPECT_EQ(Available(), DeviceCount() > 0);
#if !SPILLFS_HAVE_CUDA
  EXPECT_FALSE(Available());
#endif
  // Host memory is never a device's.
  int local = 0;
  EXPECT_EQ(PointerDevice(&local), -1);
  EXPECT_EQ(PointerDevice(nullptr), -1);
}

}  // namespace
}  // namespace spillfs::cuda
