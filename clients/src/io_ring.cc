#include "io_ring.h"

#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "error.h"
#include "spillfs/common/uring_transfers.h"
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
// The default runs need 32 MiB (spill_read/spill_write: 32 x 1 MiB) and
// 16 MiB (spill_read_rows: 128 x 128 KiB) of bounce slots.
constexpr size_t kKeptSlotBytes = 64u << 20;

// The ring of one thread and its registered slot region. Set up at first
// use, and set up again after a failed setup (a passing EMFILE or ENOMEM must
// not fail the thread for good) and in a child after fork(): the child's copy
// would submit into the parent's queues (their memory is shared), and its
// reads into the registered slots would land in the parent's pages.
class ThreadRing {
 public:
  ThreadRing() = default;
  ~ThreadRing() { Reset(); }
  ThreadRing(const ThreadRing&) = delete;
  ThreadRing& operator=(const ThreadRing&) = delete;

  // The ring, (re)made when needed; null when it cannot be (status() says why).
  io_uring* Ring() {
    if (status_ == 0 && owner_ == getpid()) return &ring_;
    Reset();
    owner_ = getpid();
    status_ = io_uring_queue_init(kRingEntries, &ring_, 0);
    return status_ == 0 ? &ring_ : nullptr;
  }
  int status() const { return status_; }

  // A region of at least `bytes`, registered as fixed buffer 0 when the
  // kernel allows it (registered() says whether it is). Ring() first. Kept
  // from run to run (registering pins its pages, which costs), but a region
  // past kKeptSlotBytes is given back when a run needs a quarter of it or
  // less: one run of a deep queue of large I/Os must not keep its memory
  // pinned for the thread's lifetime.
  char* Slots(size_t bytes) {
    const bool oversized = slots_bytes_ > kKeptSlotBytes && bytes <= slots_bytes_ / 4;
    if (bytes <= slots_bytes_ && !oversized) return static_cast<char*>(slots_);
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
  // Gives the ring up after a failure; the next Ring() makes a new one.
  void Abandon() { Reset(); }

 private:
  // Lets go of this process's view of the ring and slots. In a child after
  // fork() that is its own mappings and descriptor only: the parent's ring
  // and registration stay as they are.
  void Reset() {
    if (status_ == 0) io_uring_queue_exit(&ring_);  // the last user unregisters the buffer
    status_ = -1;
    FreeAligned(slots_, slots_bytes_);
    slots_ = nullptr;
    slots_bytes_ = 0;
    registered_ = false;
  }

  io_uring ring_{};
  int status_ = -1;
  pid_t owner_ = 0;
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

// `fixed`: the run's slots are the registered buffer. Only a flight whose
// data is its slot may name it; the caller's own buffer lies outside it (the
// kernel would answer EFAULT).
void Prepare(io_uring_sqe* sqe, InFlight* f, bool fixed) {
  const IoOp& op = *f->op;
  uring::PrepareRest(sqe, op.fd, op.write, f->data, op.length, op.offset, f->done, fixed && op.buffer == nullptr, f);
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

// One RunIo call: its flights, queues and first error.
class IoRun {
 public:
  IoRun(std::span<IoOp> ops, unsigned queue_depth, uint32_t slot_bytes, const IoFill& fill, const IoDone& done)
      : ops_(ops), queue_depth_(queue_depth), slot_bytes_(slot_bytes), fill_(fill), done_(done) {}

  // Sets up the flights (and bounce slots); 0 or -errno.
  int Init(ThreadRing& thread_ring, TaskPool* pool) {
    ring_ = thread_ring.Ring();
    bool bounce = false;
    for (const IoOp& op : ops_) {
      if (op.buffer == nullptr) {
        if (op.length > slot_bytes_) return Fail(EINVAL, "I/O larger than a bounce slot");
        bounce = true;
      }
    }
    if (pool != nullptr && pool->size() > 0 && done_) offload_ = std::make_unique<PoolCallbacks>(pool, done_);
    // Read callbacks that run here run after the next I/Os are submitted, so
    // a completed slot's copy never holds back the queue: twice the flights
    // (and slots) as may be in flight, so refills need not wait for them.
    defer_ = !offload_ && done_ && !fill_;
    const unsigned flight_count =
        defer_ ? static_cast<unsigned>(std::min<size_t>(2 * queue_depth_, ops_.size())) : queue_depth_;
    if (bounce) {
      slots_ = thread_ring.Slots(static_cast<size_t>(flight_count) * slot_bytes_);
      if (slots_ == nullptr) return Fail(ENOMEM, "cannot allocate bounce buffers");
    }
    fixed_ = bounce && thread_ring.registered();
    flights_.resize(flight_count);
    idle_.reserve(flight_count);
    for (unsigned i = 0; i < flight_count; ++i) {
      flights_[i].slot = static_cast<int>(i);
      idle_.push_back(&flights_[i]);
    }
    return 0;
  }

  // True after a failed submit left the ring in an unknown state.
  bool ring_broken() const { return ring_broken_; }

  // Runs every operation (or stops at the first error); 0 or the error.
  int Run(uint64_t* completed) {
    while (true) {
      if (offload_) {
        offload_->Reclaim(&idle_, false);
        if (error_ == 0) error_ = offload_->error();
      }
      SubmitWhatFits();
      if (inflight_ == 0) {
        // Every flight may be out with a callback that still reads its slot.
        if (offload_ && error_ == 0 && next_ < ops_.size()) {
          offload_->Reclaim(&idle_, true);
          continue;
        }
        break;
      }
      int ret = io_uring_submit_and_wait(ring_, 1);
      if (ret < 0 && !uring::TransientEnterError(ret)) {
        // Nothing more can be reaped reliably. The ring still holds this
        // run's SQEs and completions, which point at its flights: the
        // thread's next run must not see them, so the ring is given up
        // (RunIo) and the next run makes a new one. Callbacks already queued
        // must finish: they use this frame.
        ring_broken_ = true;
        if (offload_) offload_->Wait();
        return Fail(-ret, WithErrno("io_uring submit failed", -ret));
      }
      Reap();
      RunDeferred();
      if (error_ != 0) {
        for (InFlight* f : retry_) idle_.push_back(f);
        retry_.clear();
      }
    }
    Settle();
    if (completed != nullptr) *completed += count_;
    return error_;
  }

 private:
  // Prepares SQEs for retries and new operations, up to queue_depth in flight.
  void SubmitWhatFits() {
    inflight_ += uring::FillSqes(
        ring_, queue_depth_ - inflight_, &retry_,
        [this] { return error_ == 0 && (!retry_.empty() || (next_ < ops_.size() && !idle_.empty())); },
        [this]() -> InFlight* {
          InFlight* f = idle_.back();
          idle_.pop_back();
          if (Start(f)) return f;
          idle_.push_back(f);
          return nullptr;
        },
        [this](io_uring_sqe* sqe, InFlight* f) { Prepare(sqe, f, fixed_); });
  }

  // Gives the next operation to `f`; false (error_ set) when its fill failed.
  bool Start(InFlight* f) {
    f->op = &ops_[next_++];
    f->done = 0;
    if (f->op->buffer != nullptr) {
      f->data = f->op->buffer;
      return true;
    }
    f->data = slots_ + static_cast<size_t>(f->slot) * slot_bytes_;
    if (f->op->write && fill_) {
      int rc = fill_(*f->op, f->data);
      if (rc != 0) error_ = rc;
    }
    return error_ == 0;
  }

  // Takes every completion the ring holds.
  void Reap() {
    inflight_ -= uring::ReapAll(ring_, [this](const io_uring_cqe* cqe) {
      auto* f = static_cast<InFlight*>(io_uring_cqe_get_data(cqe));
      if (f != nullptr) Complete(f, cqe->res);  // null: a nop
    });
  }

  void Complete(InFlight* f, int res) {
    switch (uring::Advance(res, f->op->length, &f->done)) {
      case uring::Outcome::kAgain:
        retry_.push_back(f);
        return;
      case uring::Outcome::kFailed:
        if (error_ == 0) error_ = Fail(-res, WithErrno(Describe(*f->op, f->done) + " failed", -res));
        idle_.push_back(f);
        return;
      case uring::Outcome::kEnd:
        if (error_ == 0) error_ = Fail(EIO, Describe(*f->op, f->done) + " hit the end of the store");
        idle_.push_back(f);
        return;
      case uring::Outcome::kDone:
        break;
    }
    ++count_;
    if (error_ == 0 && offload_) {
      offload_->Dispatch(f);
      if (f->op->buffer == nullptr) return;  // back once its callback ran
    } else if (error_ == 0 && defer_) {
      ready_.push_back(f);
      return;
    } else if (error_ == 0 && done_) {
      Callback(f);
    }
    idle_.push_back(f);
  }

  // Runs the done callback of `f` here; its error becomes the run's.
  void Callback(InFlight* f) {
    int rc = done_(*f->op, f->data);
    if (rc != 0) error_ = rc;
  }

  // Refills the queue first, so the disk works while the callbacks copy.
  void RunDeferred() {
    if (ready_.empty()) return;
    SubmitWhatFits();
    if (inflight_ > 0) io_uring_submit(ring_);
    for (InFlight* f : ready_) {
      if (error_ == 0) Callback(f);
      idle_.push_back(f);
    }
    ready_.clear();
  }

  // Waits for pool callbacks; an I/O error of this thread is reported before
  // a callback's.
  void Settle() {
    if (!offload_) return;
    std::string message = LastError();
    int rc = offload_->Wait();
    if (error_ != 0 && error_ != rc) {
      Fail(-error_, message);
    } else if (error_ == 0) {
      error_ = rc;
    }
  }

  const std::span<IoOp> ops_;
  const unsigned queue_depth_;
  const uint32_t slot_bytes_;
  const IoFill& fill_;
  const IoDone& done_;
  io_uring* ring_ = nullptr;
  std::unique_ptr<PoolCallbacks> offload_;
  bool defer_ = false;
  bool fixed_ = false;
  char* slots_ = nullptr;
  std::vector<InFlight> flights_;
  std::vector<InFlight*> idle_;
  std::vector<InFlight*> retry_;
  std::vector<InFlight*> ready_;  // completed, callback still to run here
  size_t next_ = 0;
  unsigned inflight_ = 0;
  int error_ = 0;
  bool ring_broken_ = false;
  uint64_t count_ = 0;
};

}  // namespace

int RunIo(std::span<IoOp> ops, unsigned queue_depth, uint32_t slot_bytes, const IoFill& fill, const IoDone& done,
          uint64_t* completed, TaskPool* pool) {
  if (ops.empty()) return 0;
  ThreadRing& thread_ring = CurrentRing();
  if (thread_ring.Ring() == nullptr) {
    return Fail(-thread_ring.status(), WithErrno("io_uring setup failed", -thread_ring.status()));
  }
  queue_depth = std::clamp(queue_depth, 1u, kMaxQueueDepth);
  queue_depth = static_cast<unsigned>(std::min<size_t>(queue_depth, ops.size()));
  IoRun run(ops, queue_depth, slot_bytes, fill, done);
  if (int rc = run.Init(thread_ring, pool); rc != 0) return rc;
  int rc = run.Run(completed);
  if (run.ring_broken()) thread_ring.Abandon();
  return rc;
}

}  // namespace spillfs::client
