#include "spillfs/cuda/runtime.h"

#include <utility>

#if SPILLFS_HAVE_CUDA
#include <cuda.h>  // driver types only: the driver is reached through the runtime
#include <cuda_runtime_api.h>

#include "cuda_util.h"
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

#if SPILLFS_HAVE_CUDA
bool HasPrimaryContext(int device) {
  // cuDevicePrimaryCtxGetState through the runtime's driver entry points:
  // nothing links libcuda itself (cudart_static loads it when present).
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  using GetDevice = CUresult (*)(CUdevice*, int);
  static const auto functions = [] {
    void* get_state = nullptr;
    void* get_device = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &get_state, 7000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      get_state = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get_device, 2000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      get_device = nullptr;
    cudaGetLastError();
    return std::pair{reinterpret_cast<GetState>(get_state), reinterpret_cast<GetDevice>(get_device)};
  }();
  const auto [get_state, get_device] = functions;
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (get_state == nullptr || get_device == nullptr || get_device(&handle, device) != CUDA_SUCCESS ||
      get_state(handle, &flags, &active) != CUDA_SUCCESS)
    return true;
  return active != 0;
}
#endif

}  // namespace spillfs::cuda
