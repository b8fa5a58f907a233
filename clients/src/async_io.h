// AsyncIo: one io_uring of a segment-file request. Unlike RunIo (io_ring.h),
// which runs a list of operations to its end, the caller submits as it goes
// and reaps when it likes, so the disk works on chunk i while the caller
// copies chunk i+1 in. Short transfers and EAGAIN/EINTR are resubmitted
// here; the caller sees each operation once, complete or failed.
#pragma once

#include <liburing.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace spillfs::client {

class AsyncIo {
 public:
  struct Op {
    int fd = -1;
    bool write = false;
    uint64_t offset = 0;
    char* buffer = nullptr;
    uint32_t length = 0;
    uint64_t tag = 0;
    // A read that meets the end of the file completes with the bytes it
    // got (the rest of the buffer zeroed) instead of failing.
    bool eof_ok = false;
  };
  struct Done {
    uint64_t tag = 0;
    int rc = 0;  // 0 or -errno (message set on this thread)
  };

  AsyncIo() = default;
  ~AsyncIo();
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;

  // Sets up a ring for up to `depth` operations in flight; 0 or -errno.
  int Init(unsigned depth);
  unsigned depth() const { return depth_; }
  unsigned in_flight() const { return in_flight_; }
  bool full() const { return in_flight_ >= depth_; }

  // Queues `op` (the caller keeps in_flight() < depth()); it is sent to the
  // kernel by the next Reap. 0 or -errno.
  int Submit(const Op& op);
  // Sends what is queued and waits until at least `min` operations have
  // finished (0: only what has); appends them to *done. 0 or -errno when the
  // ring itself failed (every operation is then lost: give the ring up).
  int Reap(unsigned min, std::vector<Done>* done);

  // Seconds with at least one operation in flight, and operations finished.
  double busy_seconds() const;
  uint64_t completed() const { return completed_; }

 private:
  struct Flight {
    Op op;
    uint32_t done = 0;
  };
  void Prepare(Flight* f);
  void Finish(Flight* f, int rc, std::vector<Done>* done);

  io_uring ring_{};
  bool ready_ = false;
  unsigned depth_ = 0;
  unsigned in_flight_ = 0;
  unsigned queued_ = 0;  // prepared, not yet sent
  std::vector<Flight> flights_;
  std::vector<Flight*> idle_;
  uint64_t completed_ = 0;
  std::chrono::steady_clock::time_point busy_since_;
  std::chrono::steady_clock::duration busy_{};
};

}  // namespace spillfs::client
