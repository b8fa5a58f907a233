#include "io_ring.h"

#include <liburing.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "error.h"
#include "task_pool.h"

namespace spillfs::client {

void* AllocAligned(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (bytes >= (2u << 20)) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void FreeAligned(void* p, size_t bytes) {
  if (p != nullptr) munmap(p, bytes);
}

namespace {

constexpr unsigned kRingEntries = kMaxQueueDepth;

// The ring of one thread and its registered slot region.
class ThreadRing {
 public:
  ThreadRing() { status_ = io_uring_queue_init(kRingEntries, &ring_, 0); }
  ~ThreadRing() {
    if (status_ == 0) io_uring_queue_exit(&ring_);  // unregisters the buffer
    FreeAligned(slots_, slots_bytes_);
  }
  io_uring* ring() { return status_ == 0 ? &ring_ : nullptr; }
  int status() const { return status_; }

  // A region of at least `bytes`, registered as fixed buffer 0 when the
  // kernel allows it (registered() says whether it is).
  char* Slots(size_t bytes) {
    if (bytes <= slots_bytes_) return static_cast<char*>(slots_);
    if (registered_) {
      io_uring_unregister_buffers(&ring_);
      registered_ = false;
    }
    FreeAligned(slots_, slots_bytes_);
    slots_bytes_ = 0;
    slots_ = AllocAligned(bytes);
    if (slots_ == nullptr) return nullptr;
    slots_bytes_ = bytes;
    iovec iov{slots_, bytes};
    registered_ = io_uring_register_buffers(&ring_, &iov, 1) == 0;
    return static_cast<char*>(slots_);
  }
  bool registered() const { return registered_; }

 private:
  io_uring ring_{};
  int status_ = -1;
  void* slots_ = nullptr;
  size_t slots_bytes_ = 0;
  bool registered_ = false;
};

ThreadRing& CurrentRing() {
  thread_local ThreadRing ring;
  return ring;
}

struct InFlight {
  IoOp* op = nullptr;
  char* data = nullptr;  // the op's buffer or its slot
  int slot = -1;
  uint32_t done = 0;
};

void Prepare(io_uring_sqe* sqe, InFlight* f, bool fixed) {
  const IoOp& op = *f->op;
  char* buf = f->data + f->done;
  unsigned len = op.length - f->done;
  uint64_t off = op.offset + f->done;
  if (fixed && f->slot >= 0) {
    if (op.write) {
      io_uring_prep_write_fixed(sqe, op.fd, buf, len, off, 0);
    } else {
      io_uring_prep_read_fixed(sqe, op.fd, buf, len, off, 0);
    }
  } else if (op.write) {
    io_uring_prep_write(sqe, op.fd, buf, len, off);
  } else {
    io_uring_prep_read(sqe, op.fd, buf, len, off);
  }
  io_uring_sqe_set_data(sqe, f);
}

std::string Describe(const IoOp& op, uint32_t done) {
  return std::string(op.write ? "write" : "read") + " of " + std::to_string(op.length - done) + " bytes at offset " +
         std::to_string(op.offset + done) + " of the backing store";
}

// The flights whose callbacks run on a pool. A flight with a buffer of its
// own is free again as soon as its callback is queued; a bounce flight comes
// back here once its callback has seen the slot.
class PoolCallbacks {
 public:
  PoolCallbacks(TaskPool* pool, const IoDone& done) : pool_(pool), done_(done) {}

  void Dispatch(InFlight* f) {
    latch_.Add();
    const IoOp* op = f->op;
    const char* data = f->data;
    const bool bounce = f->op->buffer == nullptr;
    pool_->Submit([this, f, op, data, bounce] {
      int rc = done_(*op, data);
      if (bounce) {
        std::lock_guard lock(mu_);
        back_.push_back(f);
        cv_.notify_one();
      }
      latch_.Done(rc);  // last: once the latch is down, RunIo may return
    });
  }

  // Moves the bounce flights whose callbacks ran to `idle`; with `wait`,
  // first waits for at least one.
  void Reclaim(std::vector<InFlight*>* idle, bool wait) {
    std::unique_lock lock(mu_);
    if (wait) cv_.wait(lock, [this] { return !back_.empty(); });
    idle->insert(idle->end(), back_.begin(), back_.end());
    back_.clear();
  }

  int error() { return latch_.error(); }
  int Wait() { return latch_.Wait(); }

 private:
  TaskPool* pool_;
  const IoDone& done_;
  Latch latch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<InFlight*> back_;
};

}  // namespace

int RunIo(std::span<IoOp> ops, unsigned queue_depth, uint32_t slot_bytes, const IoFill& fill, const IoDone& done,
          uint64_t* completed, TaskPool* pool) {
  if (ops.empty()) return 0;
  ThreadRing& thread_ring = CurrentRing();
  io_uring* ring = thread_ring.ring();
  if (ring == nullptr) {
    return Fail(-thread_ring.status(), WithErrno("io_uring setup failed", -thread_ring.status()));
  }
  queue_depth = std::clamp(queue_depth, 1u, kMaxQueueDepth);
  queue_depth = static_cast<unsigned>(std::min<size_t>(queue_depth, ops.size()));

  bool bounce = false;
  for (const IoOp& op : ops) {
    if (op.buffer == nullptr) {
      if (op.length > slot_bytes) return Fail(EINVAL, "I/O larger than a bounce slot");
      bounce = true;
    }
  }
  std::unique_ptr<PoolCallbacks> offload;
  if (pool != nullptr && pool->size() > 0 && done) offload = std::make_unique<PoolCallbacks>(pool, done);
  // Read callbacks that run here run after the next I/Os are submitted, so a
  // completed slot's copy never holds back the queue: twice the flights
  // (and slots) as may be in flight, so refills need not wait for them.
  const bool defer = !offload && done && !fill;
  const unsigned flight_count = defer ? 2 * queue_depth : queue_depth;
  char* slots = nullptr;
  if (bounce) {
    slots = thread_ring.Slots(static_cast<size_t>(flight_count) * slot_bytes);
    if (slots == nullptr) return Fail(ENOMEM, "cannot allocate bounce buffers");
  }
  const bool fixed = bounce && thread_ring.registered();

  std::vector<InFlight> flights(flight_count);
  std::vector<InFlight*> idle;
  idle.reserve(flight_count);
  for (unsigned i = 0; i < flight_count; ++i) {
    flights[i].slot = static_cast<int>(i);
    idle.push_back(&flights[i]);
  }
  std::vector<InFlight*> retry;
  std::vector<InFlight*> ready;  // completed, callback still to run here
  size_t next = 0;
  unsigned inflight = 0;
  int error = 0;
  uint64_t count = 0;

  // Prepares SQEs for retries and new operations, up to queue_depth in flight.
  auto submit_what_fits = [&] {
    while (error == 0 && inflight < queue_depth && (!retry.empty() || (next < ops.size() && !idle.empty()))) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      InFlight* f;
      if (!retry.empty()) {
        f = retry.back();
        retry.pop_back();
      } else {
        f = idle.back();
        idle.pop_back();
        f->op = &ops[next++];
        f->done = 0;
        if (f->op->buffer != nullptr) {
          f->data = f->op->buffer;
        } else {
          f->data = slots + static_cast<size_t>(f->slot) * slot_bytes;
          if (f->op->write && fill) {
            int rc = fill(*f->op, f->data);
            if (rc != 0) {
              error = rc;
              idle.push_back(f);
              io_uring_prep_nop(sqe);  // the sqe is taken; let it complete harmlessly
              io_uring_sqe_set_data(sqe, nullptr);
              ++inflight;
              break;
            }
          }
        }
      }
      Prepare(sqe, f, fixed);
      ++inflight;
    }
  };

  while (true) {
    if (offload) {
      offload->Reclaim(&idle, false);
      if (error == 0) error = offload->error();
    }
    submit_what_fits();
    if (inflight == 0) {
      // Every flight may be out with a callback that still reads its slot.
      if (offload && error == 0 && next < ops.size()) {
        offload->Reclaim(&idle, true);
        continue;
      }
      break;
    }
    int ret = io_uring_submit_and_wait(ring, 1);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      // Nothing more can be reaped reliably; the ring is reset by the kernel
      // only at exit, so report and leave (in-flight buffers are ours).
      // Callbacks already queued must finish: they use this frame.
      if (offload) offload->Wait();
      return Fail(-ret, WithErrno("io_uring submit failed", -ret));
    }
    io_uring_cqe* cqe;
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      --inflight;
      auto* f = static_cast<InFlight*>(io_uring_cqe_get_data(cqe));
      if (f == nullptr) continue;  // a nop
      int res = cqe->res;
      if (res == -EAGAIN || res == -EINTR) {
        retry.push_back(f);
        continue;
      }
      if (res < 0) {
        if (error == 0) error = Fail(-res, WithErrno(Describe(*f->op, f->done) + " failed", -res));
        idle.push_back(f);
        continue;
      }
      if (res == 0) {
        if (error == 0) error = Fail(EIO, Describe(*f->op, f->done) + " hit the end of the store");
        idle.push_back(f);
        continue;
      }
      f->done += static_cast<uint32_t>(res);
      if (f->done < f->op->length) {
        retry.push_back(f);
        continue;
      }
      ++count;
      if (error == 0 && offload) {
        offload->Dispatch(f);
        if (f->op->buffer == nullptr) continue;  // back once its callback ran
      } else if (error == 0 && defer) {
        ready.push_back(f);
        continue;
      } else if (error == 0 && done) {
        int rc = done(*f->op, f->data);
        if (rc != 0) error = rc;
      }
      idle.push_back(f);
    }
    io_uring_cq_advance(ring, seen);
    if (!ready.empty()) {
      // Refill first: the disk works while the callbacks copy.
      submit_what_fits();
      if (inflight > 0) io_uring_submit(ring);
      for (InFlight* f : ready) {
        if (error == 0) {
          int rc = done(*f->op, f->data);
          if (rc != 0) error = rc;
        }
        idle.push_back(f);
      }
      ready.clear();
    }
    if (error != 0) {
      for (InFlight* f : retry) idle.push_back(f);
      retry.clear();
    }
  }
  if (offload) {
    // An I/O error of this thread is reported before a callback's.
    std::string message = LastError();
    int rc = offload->Wait();
    if (error != 0 && error != rc) {
      Fail(-error, message);
    } else if (error == 0) {
      error = rc;
    }
  }
  if (completed != nullptr) *completed += count;
  return error;
}

}  // namespace spillfs::client
