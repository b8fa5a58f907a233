// Internal to spillfs_cuda (built with CUDA only): CUDA errors as Status, and
// a scoped switch of the calling thread's current device.
#pragma once

#include <cuda_runtime_api.h>

#include <cerrno>
#include <string>

#include "spillfs/common/status.h"

namespace spillfs::cuda {

// OK for cudaSuccess, else an error naming `what` and CUDA's message. Clears
// the thread's last (non-sticky) error so it does not leak into the caller's
// next cudaGetLastError.
inline Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  cudaGetLastError();
  int code = EIO;
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      code = ENODEV;
      break;
    case cudaErrorMemoryAllocation:
      code = ENOMEM;
      break;
    case cudaErrorInvalidValue:
      code = EINVAL;
      break;
    default:
      break;
  }
  return Status::Error(code, std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

#define SPILLFS_CUDA_RETURN_IF_ERROR(call) SPILLFS_RETURN_IF_ERROR(::spillfs::cuda::CudaStatus((call), #call))

// Whether `device`'s primary context exists (the process has used it).
// Defined in runtime.cc; true when the driver cannot say.
bool HasPrimaryContext(int device);

// Makes `device` the thread's current device for a scope and puts the
// previous one back: the caller's (torch's) current device is not ours to
// change. Not where the previous device's context was never created (a
// thread that never chose a device reads 0): setting it would create one, and
// take GPU memory on device 0 from every process of a multi-GPU job. Check
// status() after construction.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : status_(Switch(device)) {}
  ~DeviceGuard() {
    if (switched_ && HasPrimaryContext(previous_)) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  Status Switch(int device) {
    SPILLFS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    if (previous_ == device) return Status::OK();
    SPILLFS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    switched_ = true;
    return Status::OK();
  }

  int previous_ = 0;
  bool switched_ = false;
  const Status status_;  // after previous_ and switched_, which Switch sets
};

}  // namespace spillfs::cuda
