// The loop the io_uring users run (the store's UringEngine, fs/store; the
// client library's RunIo and AsyncIo, clients/src): a set of reads and writes kept
// up to a queue depth in flight, each resubmitted from where it stopped
// until all of it has moved (a short transfer, EAGAIN and EINTR are not
// errors). What differs stays with each caller: where its transfers and
// buffers come from, its errors' text, and what it does when
// io_uring_enter itself fails (the store waits for the transfers in flight,
// since they still use the caller's buffers; the client gives its ring up).
//
// Header-only over liburing: include it only where liburing is linked.
#pragma once

#include <liburing.h>

#include <cerrno>
#include <cstdint>
#include <vector>

namespace spillfs::uring {

// io_uring_submit_and_wait failed for a passing reason (a signal, a full
// completion queue, no memory for now): call it again.
inline bool TransientEnterError(int ret) { return ret == -EINTR || ret == -EAGAIN || ret == -EBUSY; }

// Prepares `sqe` for what is left of one transfer of `length` bytes at
// `offset` through `buffer` once `done` of them have moved; `data` comes back
// with its completion. `fixed`: `buffer` lies in registered buffer 0.
inline void PrepareRest(io_uring_sqe* sqe, int fd, bool write, char* buffer, uint32_t length, uint64_t offset,
                        uint32_t done, bool fixed, void* data) {
  char* buf = buffer + done;
  const unsigned len = length - done;
  const uint64_t off = offset + done;
  if (fixed && write) {
    io_uring_prep_write_fixed(sqe, fd, buf, len, off, 0);
  } else if (fixed) {
    io_uring_prep_read_fixed(sqe, fd, buf, len, off, 0);
  } else if (write) {
    io_uring_prep_write(sqe, fd, buf, len, off);
  } else {
    io_uring_prep_read(sqe, fd, buf, len, off);
  }
  io_uring_sqe_set_data(sqe, data);
}

// Fills free SQEs while `more()` says there is work and fewer than `room`
// went in: a transfer to resubmit first (the last pushed to `retry`), else
// `take_new()`'s (null: it could not be started; its SQE becomes a nop whose
// completion has null data, and filling stops). `prepare(sqe, transfer)`
// prepares each. Returns the SQEs filled, nops included.
template <typename T, typename More, typename TakeNew, typename Prepare>
unsigned FillSqes(io_uring* ring, unsigned room, std::vector<T*>* retry, More&& more, TakeNew&& take_new,
                  Prepare&& prepare) {
  unsigned filled = 0;
  while (filled < room && more()) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) break;
    T* transfer;
    if (!retry->empty()) {
      transfer = retry->back();
      retry->pop_back();
    } else if ((transfer = take_new()) == nullptr) {
      io_uring_prep_nop(sqe);  // the SQE is taken; let it complete harmlessly
      io_uring_sqe_set_data(sqe, nullptr);
      ++filled;
      break;
    }
    prepare(sqe, transfer);
    ++filled;
  }
  return filled;
}

// What one completion means for its transfer.
enum class Outcome {
  kAgain,   // not all of it moved yet (interrupted, or short): resubmit the rest
  kFailed,  // the completion's result is -errno
  kEnd,     // nothing moved: the end of the file or device
  kDone,    // all of it moved
};

// Counts completion result `res` into `*done` (bytes moved of `length`).
inline Outcome Advance(int res, uint32_t length, uint32_t* done) {
  if (res == -EAGAIN || res == -EINTR) return Outcome::kAgain;
  if (res < 0) return Outcome::kFailed;
  if (res == 0) return Outcome::kEnd;
  *done += static_cast<uint32_t>(res);
  return *done < length ? Outcome::kAgain : Outcome::kDone;
}

// Calls `complete(cqe)` for each completion the ring holds, then marks them
// seen. Returns how many there were.
template <typename Complete>
unsigned ReapAll(io_uring* ring, Complete&& complete) {
  io_uring_cqe* cqe;
  unsigned head;
  unsigned seen = 0;
  io_uring_for_each_cqe(ring, head, cqe) {
    ++seen;
    complete(static_cast<const io_uring_cqe*>(cqe));
  }
  io_uring_cq_advance(ring, seen);
  return seen;
}

}  // namespace spillfs::uring
