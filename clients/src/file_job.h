// One segment-file request at work (on its own thread): the state the write
// and read pipelines share. See file_impl.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "async_io.h"
#include "file_impl.h"
#include "spillfs/cuda/copy_stream.h"
#include "spillfs/cuda/pinned_pool.h"

namespace spillfs::client {

class SegmentJob {
 public:
  SegmentJob(spill_file* file, Plan plan, std::shared_ptr<spillfs::cuda::PinnedPool> pool, uint64_t chunk_bytes,
             uintptr_t stream);
  virtual ~SegmentJob() = default;

  // On the caller's thread, before Run: makes the device streams, each
  // ordered after the work enqueued on the caller's stream so far (not
  // after what the caller enqueues once the request is under way).
  int Prepare() { return OpenStreams(); }
  // Runs the request; 0 or -errno (message set on this thread).
  int Run(spill_io_stats* stats);

 protected:
  virtual int Work() = 0;

  // Device streams: one CopyStream per device the segments name, each
  // ordered after the caller's stream.
  int OpenStreams();
  spillfs::cuda::CopyStream* Stream(int device) { return streams_.at(device).get(); }
  // Waits (host) for every copy queued on the streams so far.
  int WaitStreams();

  // A staging buffer for a piece. Reaps this job's I/O while the pool is
  // exhausted (its buffers come back as pieces finish); blocks only when
  // nothing of this job is in flight, after GiveBackIdle. Null on error.
  char* Acquire(size_t piece);
  // A staging buffer for a piece if the pool has one free now; else null
  // (no error).
  char* TryAcquire(size_t piece);
  // Buffers for the pieces [first, last), as many as the pool has free, at
  // least one: where none is, what this job can give back first
  // (GiveBackIdle), then a wait for one while the job holds none. Memory
  // I/O's steps take their buffers so: requests that each waited holding
  // part of a step would wait for ever. The end of the pieces given one
  // (`first` on error).
  size_t TakeBuffers(size_t first, size_t last);
  // Before Acquire blocks on the pool: gives back the buffers this job
  // holds but could free by waiting (a read's pieces whose device copies
  // are queued). Requests that each held such buffers while waiting for the
  // others' would wait for ever. 0 or -errno.
  virtual int GiveBackIdle() { return 0; }
  void Release(size_t piece) { buffers_[piece].reset(); }

  // Queues one I/O (op.tag = piece index), reaping while the ring is full.
  int Submit(const AsyncIo::Op& op);
  // Reaps at least `min` completions; each one counts down its piece and
  // calls PieceDone(piece) for a piece whose I/O is all done.
  int Reap(unsigned min);
  int Drain();
  void Finished(const std::vector<AsyncIo::Done>& done);
  // Brackets the submission of a piece's I/O: a piece whose first I/Os
  // complete while later ones are still being queued is not done yet.
  void BeginPiece(size_t i) { ++pending_[i]; }
  void EndPiece(size_t i);
  virtual int PieceDone(size_t piece) {
    Release(piece);
    return 0;
  }
  // The first error, kept with its message (restored by Failed()).
  void Note(int rc);
  int Failed();
  int error() const { return error_; }

  const Piece& piece(size_t i) const { return plan_.pieces[i]; }
  char* Data(size_t i) {
    return plan_.pieces[i].direct ? plan_.pieces[i].direct : static_cast<char*>(buffers_[i]->data());
  }

  // Time of a stage, added to a stats field.
  class Timed {
   public:
    explicit Timed(double* into) : into_(into), start_(std::chrono::steady_clock::now()) {}
    ~Timed() { *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

   private:
    double* into_;
    std::chrono::steady_clock::time_point start_;
  };

  spill_file* file_;
  Plan plan_;
  std::shared_ptr<spillfs::cuda::PinnedPool> pool_;
  const uint64_t chunk_bytes_;
  const uintptr_t caller_stream_;
  uint64_t io_bytes_ = 1 << 20;  // one I/O (settings)
  spill_io_stats stats_{};
  std::vector<std::optional<spillfs::cuda::PinnedBuffer>> buffers_;
  std::vector<uint32_t> pending_;  // I/Os in flight per piece
  // After the buffers: destroyed first (a ring given up with I/O in flight
  // waits for it at its teardown, before the buffers go).
  AsyncIo ring_;

 private:
  std::map<int, std::unique_ptr<spillfs::cuda::CopyStream>> streams_;
  int error_ = 0;
  std::string message_;
};

// The pipelines (file_write.cc, file_read.cc).
std::unique_ptr<SegmentJob> MakeWriteJob(spill_file* file, Plan plan, std::shared_ptr<spillfs::cuda::PinnedPool> pool,
                                         uint64_t chunk_bytes, uintptr_t stream);
std::unique_ptr<SegmentJob> MakeReadJob(spill_file* file, Plan plan, std::shared_ptr<spillfs::cuda::PinnedPool> pool,
                                        uint64_t chunk_bytes, uintptr_t stream);

// Checks the segments' devices against what CUDA says of their pointers;
// 0 or -errno (message set).
int CheckDevices(const Plan& plan);

}  // namespace spillfs::client
