#include "spillfs/cuda/runtime.h"

#if SPILLFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace spillfs::cuda {

int DeviceCount() {
#if SPILLFS_HAVE_CUDA
  // A function-local static: asked once, thread-safe. Without a driver
  // (libcuda.so.1 absent) the static runtime answers an error, not a crash.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

bool Available() { return DeviceCount() > 0; }

int PointerDevice(const void* ptr) {
#if SPILLFS_HAVE_CUDA
  if (ptr == nullptr || !Available()) return -1;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) return attributes.device;
  return -1;
#else
  (void)ptr;
  return -1;
#endif
}

}  // namespace spillfs::cuda
