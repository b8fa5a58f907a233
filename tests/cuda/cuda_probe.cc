// A shared library over spillfs_cuda, loaded by library_load_test.cc: the
// client library's situation (CUDA runtime linked in, loaded with dlopen on a
// machine that may have no driver).
#include "spillfs/cuda/runtime.h"

extern "C" __attribute__((visibility("default"))) int cuda_probe_device_count() { return spillfs::cuda::DeviceCount(); }
