#include "file_job.h"

#include <algorithm>
#include <cerrno>
#include <string>

#include "error.h"
#include "file_settings.h"
#include "spillfs/cuda/runtime.h"

namespace spillfs::client {

int CheckDevices(const Plan& plan) {
  const bool cuda = spillfs::cuda::Available();
  for (const Seg& s : plan.segs) {
    const std::string where = "the segment at file offset " + std::to_string(s.offset);
    if (s.device >= 0 && !cuda) {
      return Fail(ENODEV, where + " is on CUDA device " + std::to_string(s.device) +
                              ", but no CUDA device is usable here (or the library was built without CUDA)");
    }
    if (s.device >= spillfs::cuda::DeviceCount()) {
      return Fail(ENODEV, where + " names CUDA device " + std::to_string(s.device) + " of " +
                              std::to_string(spillfs::cuda::DeviceCount()));
    }
    if (!cuda) continue;
    const int d = spillfs::cuda::PointerDevice(s.ptr);
    if (s.device < 0 && d >= 0) {
      return Fail(EINVAL, where + " is memory of CUDA device " + std::to_string(d) + " but was given as host memory");
    }
    if (s.device >= 0 && d < 0) {
      return Fail(EINVAL, where + " was given as memory of CUDA device " + std::to_string(s.device) +
                              " but is host memory (or not CUDA's)");
    }
    if (s.device >= 0 && d != s.device) {
      return Fail(EINVAL, where + " is memory of CUDA device " + std::to_string(d) + " but was given as device " +
                              std::to_string(s.device));
    }
  }
  return 0;
}

SegmentJob::SegmentJob(spill_file* file, Plan plan, std::shared_ptr<spillfs::cuda::PinnedPool> pool,
                       uint64_t chunk_bytes, uintptr_t stream)
    : file_(file), plan_(std::move(plan)), pool_(std::move(pool)), chunk_bytes_(chunk_bytes), caller_stream_(stream) {}

int SegmentJob::Run(spill_io_stats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const FileSettings& settings = Settings();
  io_bytes_ = std::min<uint64_t>(settings.io_bytes.load(), chunk_bytes_);
  buffers_.resize(plan_.pieces.size());
  pending_.assign(plan_.pieces.size(), 0);
  int rc = 0;
  if (!plan_.pieces.empty()) {
    rc = ring_.Init(settings.queue_depth.load());
    if (rc == 0) rc = Work();
    Note(rc);
    // Whatever went wrong, nothing may be in flight (the I/O uses buffers
    // this job owns) and no copy may still run into or out of them.
    if (ring_.in_flight() > 0) Drain();
    if (!streams_.empty()) WaitStreams();
    rc = error_ != 0 ? Failed() : 0;
  }
  stats_.bytes = plan_.bytes;
  stats_.ios = ring_.completed();
  stats_.io_seconds = ring_.busy_seconds();
  stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *stats = stats_;
  return rc;
}

int SegmentJob::OpenStreams() {
  for (int device : plan_.devices) {
    auto made = spillfs::cuda::CopyStream::Create(device);
    if (!made.ok()) {
      return Fail(made.status().code(), "cannot make a copy stream on CUDA device " + std::to_string(device) + ": " +
                                            made.status().message());
    }
    if (Status s = (*made)->WaitFor(caller_stream_); !s.ok()) {
      return Fail(s.code(), "cannot order the copies after the caller's stream: " + s.message());
    }
    streams_.emplace(device, std::move(*made));
  }
  return 0;
}

int SegmentJob::WaitStreams() {
  Timed t(&stats_.copy_seconds);
  for (auto& [device, stream] : streams_) {
    auto event = stream->Record();
    Status s = event.ok() ? stream->Wait(*event) : event.status();
    if (!s.ok()) {
      Note(Fail(s.code(), "copies on CUDA device " + std::to_string(device) + " failed: " + s.message()));
      return error_;
    }
  }
  return 0;
}

char* SegmentJob::TryAcquire(size_t piece) {
  std::optional<spillfs::cuda::PinnedBuffer> got = pool_->TryAcquire(chunk_bytes_);
  if (!got || !*got) return nullptr;
  buffers_[piece] = std::move(*got);
  return static_cast<char*>(buffers_[piece]->data());
}

size_t SegmentJob::TakeBuffers(size_t first, size_t last) {
  size_t got = first;
  while (got < last && TryAcquire(got) != nullptr) ++got;
  if (got > first) return got;
  if (GiveBackIdle() != 0) return first;
  while (got < last && TryAcquire(got) != nullptr) ++got;
  if (got > first) return got;
  return Acquire(first) != nullptr ? first + 1 : first;
}

char* SegmentJob::Acquire(size_t piece) {
  std::optional<spillfs::cuda::PinnedBuffer> got;
  for (;;) {
    if ((got = pool_->TryAcquire(chunk_bytes_))) break;
    if (ring_.in_flight() == 0) {
      // Other requests hold the pool; they give buffers back as they go,
      // as this one does first.
      if (GiveBackIdle() != 0) return nullptr;
      if ((got = pool_->TryAcquire(chunk_bytes_))) break;
      got = pool_->Acquire(chunk_bytes_);
      break;
    }
    if (Reap(1) != 0) return nullptr;
  }
  if (!*got) {
    Note(Fail(ENOMEM, "no staging buffer of " + std::to_string(chunk_bytes_) + " bytes (pinned_bytes " +
                          std::to_string(pool_->capacity()) + ")"));
    return nullptr;
  }
  buffers_[piece] = std::move(*got);
  return static_cast<char*>(buffers_[piece]->data());
}

int SegmentJob::Submit(const AsyncIo::Op& op) {
  while (ring_.full()) {
    if (int rc = Reap(1); rc != 0) return rc;
  }
  if (int rc = ring_.Submit(op); rc != 0) {
    Note(rc);
    return rc;
  }
  ++pending_[op.tag];
  stats_.io_bytes += op.length;
  return 0;
}

int SegmentJob::Reap(unsigned min) {
  std::vector<AsyncIo::Done> done;
  if (int rc = ring_.Reap(min, &done); rc != 0) {
    Note(rc);
    return rc;
  }
  Finished(done);
  return error_;
}

void SegmentJob::Finished(const std::vector<AsyncIo::Done>& done) {
  for (const AsyncIo::Done& d : done) {
    if (d.rc != 0) Note(d.rc);
    EndPiece(d.tag);
  }
}

void SegmentJob::EndPiece(size_t i) {
  if (--pending_[i] > 0) return;
  if (error_ == 0) {
    Note(PieceDone(i));
  } else {
    Release(i);
  }
}

int SegmentJob::Drain() {
  while (ring_.in_flight() > 0) {
    std::vector<AsyncIo::Done> done;
    if (int rc = ring_.Reap(1, &done); rc != 0) {
      Note(rc);
      return error_;  // the ring failed: nothing more comes back (its teardown waits for the kernel)
    }
    Finished(done);
  }
  return error_;
}

void SegmentJob::Note(int rc) {
  if (rc != 0 && error_ == 0) {
    error_ = rc;
    message_ = LastError();
  }
}

int SegmentJob::Failed() { return Fail(-error_, message_); }

}  // namespace spillfs::client
