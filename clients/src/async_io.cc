#include "async_io.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "error.h"
#include "spillfs/common/uring_transfers.h"

namespace spillfs::client {

AsyncIo::~AsyncIo() {
  if (ready_) io_uring_queue_exit(&ring_);
}

int AsyncIo::Init(unsigned depth) {
  depth_ = depth == 0 ? 1 : depth;
  unsigned entries = 1;
  while (entries < depth_) entries <<= 1;
  int rc = io_uring_queue_init(entries, &ring_, 0);
  if (rc < 0) return Fail(-rc, WithErrno("io_uring setup failed", -rc));
  ready_ = true;
  flights_.resize(depth_);
  for (Flight& f : flights_) idle_.push_back(&f);
  return 0;
}

void AsyncIo::Prepare(Flight* f) {
  // Room is certain: at most depth_ operations are in flight, and the ring
  // has at least that many entries; a resubmission reuses its own slot.
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    io_uring_submit(&ring_);
    queued_ = 0;
    sqe = io_uring_get_sqe(&ring_);
  }
  const Op& op = f->op;
  uring::PrepareRest(sqe, op.fd, op.write, op.buffer, op.length, op.offset, f->done, /*fixed=*/false, f);
  ++queued_;
}

int AsyncIo::Submit(const Op& op) {
  if (idle_.empty()) return Fail(EINVAL, "AsyncIo: more operations than its depth");
  Flight* f = idle_.back();
  idle_.pop_back();
  f->op = op;
  f->done = 0;
  if (in_flight_++ == 0) busy_since_ = std::chrono::steady_clock::now();
  Prepare(f);
  return 0;
}

void AsyncIo::Finish(Flight* f, int rc, std::vector<Done>* done) {
  done->push_back(Done{f->op.tag, rc});
  idle_.push_back(f);
  ++completed_;
  if (--in_flight_ == 0) busy_ += std::chrono::steady_clock::now() - busy_since_;
}

int AsyncIo::Reap(unsigned min, std::vector<Done>* done) {
  const size_t before = done->size();
  for (;;) {
    const unsigned finished = static_cast<unsigned>(done->size() - before);
    const bool want_more = finished < min && in_flight_ > 0;
    if (queued_ == 0 && !want_more) {
      // Take what is there without waiting.
      if (io_uring_cq_ready(&ring_) == 0) return 0;
    } else {
      int ret = want_more ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
      if (ret < 0 && !uring::TransientEnterError(ret)) {
        return Fail(-ret, WithErrno("io_uring submit failed", -ret));
      }
      if (ret >= 0) queued_ = 0;
    }
    const unsigned seen = uring::ReapAll(&ring_, [&](const io_uring_cqe* cqe) {
      auto* f = static_cast<Flight*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      const Op& op = f->op;
      switch (uring::Advance(res, op.length, &f->done)) {
        case uring::Outcome::kAgain:
          Prepare(f);  // the rest
          break;
        case uring::Outcome::kFailed:
          Finish(f,
                 Fail(-res, WithErrno(std::string(op.write ? "write" : "read") + " of " +
                                          std::to_string(op.length - f->done) + " bytes at offset " +
                                          std::to_string(op.offset + f->done) + " failed",
                                      -res)),
                 done);
          break;
        case uring::Outcome::kEnd:
          if (!op.write && op.eof_ok) {
            std::memset(op.buffer + f->done, 0, op.length - f->done);
            Finish(f, 0, done);
          } else {
            Finish(f,
                   Fail(EIO, std::string(op.write ? "write" : "read") + " at offset " +
                                 std::to_string(op.offset + f->done) + (op.write ? " wrote nothing" : " met the end")),
                   done);
          }
          break;
        case uring::Outcome::kDone:
          Finish(f, 0, done);
          break;
      }
    });
    if (seen == 0 && !want_more && queued_ == 0) return 0;
    if (static_cast<unsigned>(done->size() - before) >= min && queued_ == 0) return 0;
  }
}

double AsyncIo::busy_seconds() const {
  auto busy = busy_;
  if (in_flight_ > 0) busy += std::chrono::steady_clock::now() - busy_since_;
  return std::chrono::duration<double>(busy).count();
}

}  // namespace spillfs::client
