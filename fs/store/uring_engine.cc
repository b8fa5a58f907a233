#include "spillfs/store/uring_engine.h"

#include <fmt/format.h>
#include <liburing.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "spillfs/common/uring_transfers.h"

namespace spillfs {
namespace {

constexpr unsigned kRingEntries = 128;

// One ring per thread, torn down when the thread exits.
class ThreadRing {
 public:
  ThreadRing() { status_ = io_uring_queue_init(kRingEntries, &ring_, 0); }
  ~ThreadRing() {
    if (status_ == 0) io_uring_queue_exit(&ring_);
  }
  io_uring* ring() { return status_ == 0 ? &ring_ : nullptr; }
  int status() const { return status_; }

 private:
  io_uring ring_{};
  int status_ = -1;
};

ThreadRing& CurrentRing() {
  thread_local ThreadRing ring;
  return ring;
}

// Progress of one request: how much of it is done.
struct Progress {
  IoRequest* request;
  uint32_t done = 0;
};

void Prepare(io_uring_sqe* sqe, Progress* p) {
  const IoRequest& r = *p->request;
  uring::PrepareRest(sqe, r.fd, r.write, r.buffer, r.length, r.offset, p->done, /*fixed=*/false, p);
}

}  // namespace

bool UringEngine::Available() { return CurrentRing().ring() != nullptr; }

Status UringEngine::Submit(std::span<IoRequest> requests, unsigned queue_depth) {
  ThreadRing& thread_ring = CurrentRing();
  io_uring* ring = thread_ring.ring();
  if (ring == nullptr) {
    return Status::IOError(fmt::format("io_uring setup failed: {}", std::strerror(-thread_ring.status())));
  }
  queue_depth = std::max(1u, std::min(queue_depth, kRingEntries));
  std::vector<Progress> progress;
  progress.reserve(requests.size());
  for (IoRequest& r : requests) progress.push_back(Progress{&r});

  size_t next = 0;  // next request not yet submitted
  unsigned inflight = 0;
  std::vector<Progress*> retry;  // short transfers to resubmit
  Status first_error;
  // io_uring_enter failing in a row with requests in flight (at 1 ms apart).
  constexpr int kMaxFailedEnters = 10'000;
  int failed_enters = 0;
  while (next < progress.size() || inflight > 0 || !retry.empty()) {
    inflight += uring::FillSqes(
        ring, queue_depth - inflight, &retry,
        [&] { return first_error.ok() && (!retry.empty() || next < progress.size()); },
        [&] { return &progress[next++]; }, Prepare);
    if (inflight == 0) break;  // only reached after an error stopped submission
    int ret = io_uring_submit_and_wait(ring, 1);
    if (ret < 0 && !uring::TransientEnterError(ret)) {
      // Requests already submitted may still read into or write from their
      // buffers, which the caller frees or reuses once this returns: fail,
      // but only after every request in flight has completed.
      if (first_error.ok()) {
        first_error = Status::IOError(fmt::format("io_uring submit failed: {}", std::strerror(-ret)));
      }
      if (++failed_enters > kMaxFailedEnters) {
        fmt::print(stderr, "spillfs: io_uring_enter keeps failing ({}) with {} requests in flight; stopping\n",
                   std::strerror(-ret), inflight);
        std::abort();  // returning would hand the kernel's buffers back to the caller
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      failed_enters = 0;
    }
    inflight -= uring::ReapAll(ring, [&](const io_uring_cqe* cqe) {
      auto* p = static_cast<Progress*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      switch (uring::Advance(res, p->request->length, &p->done)) {
        case uring::Outcome::kAgain:
          retry.push_back(p);
          break;
        case uring::Outcome::kFailed:
          if (first_error.ok()) {
            first_error = Status::Error(
                -res == ENOSPC ? ENOSPC : EIO,
                fmt::format("{} of {} bytes at offset {} failed: {}", p->request->write ? "write" : "read",
                            p->request->length, p->request->offset, std::strerror(-res)));
          }
          break;
        case uring::Outcome::kEnd:
          if (first_error.ok()) {
            first_error =
                Status::IOError(fmt::format("{} at offset {} hit the end of the store",
                                            p->request->write ? "write" : "read", p->request->offset + p->done));
          }
          break;
        case uring::Outcome::kDone:
          break;
      }
    });
    if (!first_error.ok()) retry.clear();
  }
  return first_error;
}

}  // namespace spillfs
