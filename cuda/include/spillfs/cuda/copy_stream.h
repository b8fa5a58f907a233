// CopyStream: a CUDA stream of its own on one device, for the copies between
// GPU memory and pinned host buffers, ordered against the caller's stream by
// events instead of by sharing it.
//
// Why its own stream: the trainer's stream (torch.cuda.current_stream(), taken
// here as the raw cudaStream_t value) keeps computing while a checkpoint's
// bytes cross PCIe, and the client pipelines chunks: the copy of chunk i+1
// runs while chunk i is written to the disk. The ordering is explicit:
//  - save:  WaitFor(caller)   the copies start after the caller's work so far
//           ToHost(...)       into pinned buffers (PinnedPool)
//           Record() / Wait() the host waits for a chunk before writing it
//  - load:  ToDevice(...)     from pinned buffers
//           SignalTo(caller)  the caller's later work waits for the copies
// The stream is non-blocking: it never synchronises implicitly with the
// legacy default stream, so a caller on stream 0 must use WaitFor/SignalTo
// like any other.
//
// Threading: thread-compatible (one thread at a time, or a lock of the
// caller's); different CopyStreams are independent.
// Error convention: Status; Create fails with ENOTSUP "built without CUDA" or
// ENODEV "no CUDA device"; CUDA failures are EIO naming the call, EINVAL for
// bad arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "spillfs/common/status.h"

namespace spillfs::cuda {

// A point in a CopyStream's work (a CUDA event); move-only, the event is
// destroyed with it. Host waits on it block (cudaEventBlockingSync) rather
// than spin.
class CopyEvent {
 public:
  CopyEvent() = default;
  ~CopyEvent();
  CopyEvent(CopyEvent&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  CopyEvent& operator=(CopyEvent&& other) noexcept;
  CopyEvent(const CopyEvent&) = delete;
  CopyEvent& operator=(const CopyEvent&) = delete;

  bool valid() const { return event_ != nullptr; }

 private:
  friend class CopyStream;
  explicit CopyEvent(void* event) : event_(event) {}
  void* event_ = nullptr;  // cudaEvent_t
};

class CopyStream {
 public:
  // A stream on CUDA device `device`.
  static Result<std::unique_ptr<CopyStream>> Create(int device);
  // Waits for the work enqueued, then destroys the stream.
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  int device() const { return device_; }
  uintptr_t stream() const { return reinterpret_cast<uintptr_t>(stream_); }  // the cudaStream_t

  // Work enqueued here from now on starts after the work enqueued on
  // `caller_stream` so far (an event recorded there, waited for here).
  // REQUIRES: caller_stream belongs to device() (0: its legacy default stream).
  Status WaitFor(uintptr_t caller_stream);
  // Enqueue a copy of `n` bytes from device memory to host memory (pinned for
  // an asynchronous copy; pageable memory makes it synchronous), or back.
  Status ToHost(void* host_dst, const void* device_src, size_t n);
  Status ToDevice(void* device_dst, const void* host_src, size_t n);
  // An event after everything enqueued so far.
  Result<CopyEvent> Record();
  // The host waits until `event` has passed.
  Status Wait(const CopyEvent& event);
  // Whether `event` has passed, without waiting.
  Result<bool> Done(const CopyEvent& event);
  // Work enqueued on `caller_stream` from now on starts after everything
  // enqueued here so far. REQUIRES: as WaitFor.
  Status SignalTo(uintptr_t caller_stream);
  // The host waits for everything enqueued so far.
  Status Synchronize();

 private:
  CopyStream(int device, void* stream, void* wait_event, void* signal_event)
      : device_(device), stream_(stream), wait_event_(wait_event), signal_event_(signal_event) {}

  const int device_;
  void* const stream_;        // cudaStream_t
  void* const wait_event_;    // reused by WaitFor
  void* const signal_event_;  // reused by SignalTo
};

}  // namespace spillfs::cuda
