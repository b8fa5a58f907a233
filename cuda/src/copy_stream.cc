#include "spillfs/cuda/copy_stream.h"

#include <cerrno>
#include <utility>

#include "spillfs/cuda/runtime.h"

#if SPILLFS_HAVE_CUDA
#include "cuda_util.h"
#endif

namespace spillfs::cuda {

#if SPILLFS_HAVE_CUDA

namespace {

cudaStream_t AsStream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }
cudaEvent_t AsEvent(void* event) { return static_cast<cudaEvent_t>(event); }

Status Copy(int device, cudaStream_t stream, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return Status::OK();
  if (dst == nullptr || src == nullptr) return Status::Invalid("null copy address");
  DeviceGuard guard(device);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, kind, stream));
  return Status::OK();
}

}  // namespace

CopyEvent::~CopyEvent() {
  if (event_ != nullptr) cudaEventDestroy(AsEvent(event_));
}

CopyEvent& CopyEvent::operator=(CopyEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(AsEvent(event_));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Result<std::unique_ptr<CopyStream>> CopyStream::Create(int device) {
  if (device < 0 || device >= DeviceCount()) return Status::Error(ENODEV, "no CUDA device " + std::to_string(device));
  DeviceGuard guard(device);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  cudaStream_t stream = nullptr;
  cudaEvent_t wait_event = nullptr;
  cudaEvent_t signal_event = nullptr;
  Status status = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  if (status.ok())
    status = CudaStatus(cudaEventCreateWithFlags(&wait_event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  if (status.ok())
    status = CudaStatus(cudaEventCreateWithFlags(&signal_event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  if (!status.ok()) {
    if (signal_event != nullptr) cudaEventDestroy(signal_event);
    if (wait_event != nullptr) cudaEventDestroy(wait_event);
    if (stream != nullptr) cudaStreamDestroy(stream);
    return status.WithContext("CUDA device " + std::to_string(device));
  }
  return std::unique_ptr<CopyStream>(new CopyStream(device, stream, wait_event, signal_event));
}

CopyStream::~CopyStream() {
  DeviceGuard guard(device_);
  cudaStreamSynchronize(AsStream(stream()));
  cudaEventDestroy(AsEvent(signal_event_));
  cudaEventDestroy(AsEvent(wait_event_));
  cudaStreamDestroy(AsStream(stream()));
  cudaGetLastError();
}

Status CopyStream::WaitFor(uintptr_t caller_stream) {
  DeviceGuard guard(device_);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaEventRecord(AsEvent(wait_event_), AsStream(caller_stream)));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(stream()), AsEvent(wait_event_), 0));
  return Status::OK();
}

Status CopyStream::ToHost(void* host_dst, const void* device_src, size_t n) {
  return Copy(device_, AsStream(stream()), host_dst, device_src, n, cudaMemcpyDeviceToHost);
}

Status CopyStream::ToDevice(void* device_dst, const void* host_src, size_t n) {
  return Copy(device_, AsStream(stream()), device_dst, host_src, n, cudaMemcpyHostToDevice);
}

Result<CopyEvent> CopyStream::Record() {
  DeviceGuard guard(device_);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  cudaEvent_t event = nullptr;
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
  CopyEvent result(event);  // destroys the event on the error path
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, AsStream(stream())));
  return result;
}

Status CopyStream::Wait(const CopyEvent& event) {
  if (!event.valid()) return Status::Invalid("waiting for an empty CopyEvent");
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(AsEvent(event.event_)));
  return Status::OK();
}

Result<bool> CopyStream::Done(const CopyEvent& event) {
  if (!event.valid()) return Status::Invalid("querying an empty CopyEvent");
  const cudaError_t err = cudaEventQuery(AsEvent(event.event_));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  SPILLFS_RETURN_IF_ERROR(CudaStatus(err, "cudaEventQuery"));
  return true;
}

Status CopyStream::SignalTo(uintptr_t caller_stream) {
  DeviceGuard guard(device_);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaEventRecord(AsEvent(signal_event_), AsStream(stream())));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(caller_stream), AsEvent(signal_event_), 0));
  return Status::OK();
}

Status CopyStream::Synchronize() {
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream())));
  return Status::OK();
}

#else  // !SPILLFS_HAVE_CUDA

namespace {
Status NoCuda() { return Status::Error(ENOTSUP, "spillfs_cuda was built without CUDA"); }
}  // namespace

CopyEvent::~CopyEvent() = default;
CopyEvent& CopyEvent::operator=(CopyEvent&& other) noexcept {
  event_ = std::exchange(other.event_, nullptr);
  return *this;
}
Result<std::unique_ptr<CopyStream>> CopyStream::Create(int) { return NoCuda(); }
CopyStream::~CopyStream() = default;
Status CopyStream::WaitFor(uintptr_t) { return NoCuda(); }
Status CopyStream::ToHost(void*, const void*, size_t) { return NoCuda(); }
Status CopyStream::ToDevice(void*, const void*, size_t) { return NoCuda(); }
Result<CopyEvent> CopyStream::Record() { return NoCuda(); }
Status CopyStream::Wait(const CopyEvent&) { return NoCuda(); }
Result<bool> CopyStream::Done(const CopyEvent&) { return NoCuda(); }
Status CopyStream::SignalTo(uintptr_t) { return NoCuda(); }
Status CopyStream::Synchronize() { return NoCuda(); }

#endif

}  // namespace spillfs::cuda
