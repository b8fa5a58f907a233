// The read pipeline of segment files: each piece is read with io_uring (on
// the direct path by the file's layout, holes as zeros, every block
// verified), then copied out to its segments (host: memcpy; device: a copy
// on the device's copy stream, whose buffer is given back once the copy
// has run), while the next pieces are read. With memory I/O the daemon
// reads each step of pieces into the shareable pool's memfd (mem_read)
// while the pieces of the step before are copied out.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>

#include "client_impl.h"
#include "error.h"
#include "file_job.h"
#include "file_settings.h"
#include "memory_io.h"
#include "spillfs/common/rounding.h"

namespace spillfs::client {
namespace {

class ReadJob : public SegmentJob {
 public:
  using SegmentJob::SegmentJob;

 protected:
  int Work() override;
  int PieceDone(size_t i) override;
  // Device copies queued, and memory I/O's steps sent (the daemon finishes
  // them without this job's thread), give their buffers back.
  int GiveBackIdle() override {
    while (steps_ && !steps_->empty()) {
      if (FinishOldest() != 0) return error();
    }
    return Settle();
  }

 private:
  int CheckSize(uint64_t size);
  int ReadFile();
  int ReadDirect();
  int ReadMemory();
  // Memory I/O: waits for the oldest step the daemon reads and copies its
  // pieces out.
  int FinishOldest();
  int TakeLayout();
  // Copies piece i to the segments; device copies leave the buffer in
  // draining_ until they have run.
  int CopyOut(size_t i);
  // Waits for the device copies queued so far and gives their buffers back.
  int Settle();

  // Direct path: the layout and, per piece, the parts of extents it reads.
  std::shared_ptr<Layout> layout_;
  struct Part {
    const Extent* x;
    uint64_t file_at, length;
  };
  std::vector<std::vector<Part>> parts_;
  std::deque<size_t> draining_;       // pieces whose device copies may still run
  std::optional<MemorySteps> steps_;  // memory I/O: the steps sent to the daemon
};

int ReadJob::CheckSize(uint64_t size) {
  if (plan_.exact_end > size) {
    for (const Seg& s : plan_.segs) {
      if (s.end() > size) {
        return Fail(ERANGE, "the segment [" + std::to_string(s.offset) + ", " + std::to_string(s.end()) + ") of " +
                                file_->path + " lies past its end (" + std::to_string(size) + " bytes)");
      }
    }
  }
  return 0;
}

int ReadJob::Settle() {
  if (draining_.empty()) return 0;
  if (int rc = WaitStreams(); rc != 0) return rc;  // every copy queued so far has run
  while (!draining_.empty()) {
    Release(draining_.front());
    draining_.pop_front();
  }
  return 0;
}

int ReadJob::CopyOut(size_t i) {
  const Piece& p = piece(i);
  const char* data = Data(i);
  bool on_device = false;
  {
    Timed t(&stats_.copy_seconds);
    for (size_t k = p.first_seg; k < p.last_seg; ++k) {
      const Seg& s = plan_.segs[k];
      const uint64_t a = std::max(s.offset, p.start), b = std::min(s.end(), p.end);
      if (b <= a) continue;
      char* dst = s.ptr + (a - s.offset);
      const char* src = data + (a - p.start);
      if (dst == src) continue;  // the piece was read into this segment
      if (s.device < 0) {
        std::memcpy(dst, src, b - a);
      } else {
        Status copied = Stream(s.device)->ToDevice(dst, src, b - a);
        if (!copied.ok()) return Fail(copied.code(), "host-to-device copy failed: " + copied.message());
        on_device = true;
      }
    }
  }
  if (!on_device) {
    Release(i);
    return 0;
  }
  draining_.push_back(i);
  // A few pieces' copies may run behind; more would hold the pool.
  return draining_.size() > 2 ? Settle() : 0;
}

int ReadJob::PieceDone(size_t i) {
  if (layout_) {
    const Piece& p = piece(i);
    const char* data = Data(i);
    for (const Part& part : parts_[i]) {
      int rc = file_->client->Verify(*layout_, *part.x, part.file_at, data + (part.file_at - p.start), part.length);
      if (rc == -kChecksumMismatch) return -EIO;  // the message is set
      if (rc != 0) return rc;
    }
  }
  return CopyOut(i);
}

int ReadJob::ReadFile() {
  struct stat st;
  if (fstat(file_->fd, &st) != 0) {
    int e = errno;
    return Fail(e, WithErrno("cannot stat " + file_->path, e));
  }
  if (int rc = CheckSize(static_cast<uint64_t>(st.st_size)); rc != 0) return rc;
  for (size_t i = 0; i < plan_.pieces.size() && error() == 0; ++i) {
    const Piece& p = piece(i);
    char* data = p.direct ? p.direct : Acquire(i);
    if (data == nullptr) break;
    BeginPiece(i);
    for (uint64_t at = p.start; at < p.end && error() == 0; at += io_bytes_) {
      AsyncIo::Op op;
      op.fd = file_->fd;
      op.offset = at;
      op.buffer = data + (at - p.start);
      op.length = static_cast<uint32_t>(std::min(io_bytes_, p.end - at));
      op.tag = i;
      op.eof_ok = true;  // the last block ends at the end of the file
      Note(Submit(op));
    }
    EndPiece(i);
    if (error() == 0) Reap(0);
  }
  Drain();
  Note(Settle());
  return error();
}

// The file's layout: the one the handle keeps while the file is unchanged,
// else a fresh one (kept for the next read).
int ReadJob::TakeLayout() {
  spill_client* client = file_->client.get();
  struct stat st;
  if (fstat(file_->fd, &st) != 0) {
    int e = errno;
    return Fail(e, WithErrno("cannot stat " + file_->path, e));
  }
  const auto max_age = std::chrono::milliseconds(std::min<uint64_t>(client->lease_ms.load(), uint64_t{1} << 40));
  uint64_t changes = 0;
  {
    std::lock_guard lock(file_->layout_mu);
    changes = file_->changes;
    const auto& kept = file_->layout;
    if (kept && kept->generation == changes && SameFile(kept->st, st) &&
        (max_age.count() == 0 || std::chrono::steady_clock::now() - kept->taken < max_age)) {
      layout_ = kept;
      return 0;
    }
  }
  Timed t(&stats_.daemon_seconds);
  std::unique_ptr<ControlChannel> lease;  // held by the layout while it is used
  int rc = client->OpenChannel(&lease);
  if (rc == 0) rc = client->FetchLayout(std::move(lease), file_->rel, &layout_);
  if (rc != 0) return rc;
  layout_->st = st;  // taken before the layout: a change in between shows next time
  layout_->taken = std::chrono::steady_clock::now();
  layout_->generation = changes;
  std::shared_ptr<Layout> replaced;  // destroyed after the lock
  std::lock_guard lock(file_->layout_mu);
  if (file_->changes == changes) {
    replaced = std::move(file_->layout);
    file_->layout = layout_;
  }
  return 0;
}

int ReadJob::ReadDirect() {
  spill_client* client = file_->client.get();
  if (int rc = TakeLayout(); rc != 0) return rc;
  if (int rc = CheckSize(layout_->size); rc != 0) return rc;
  const bool verify = Settings().verify.load();
  parts_.resize(plan_.pieces.size());
  for (size_t i = 0; i < plan_.pieces.size() && error() == 0; ++i) {
    const Piece& p = piece(i);
    char* data = p.direct ? p.direct : Acquire(i);
    if (data == nullptr) break;
    auto zero = [&](uint64_t from, uint64_t to) { std::memset(data + (from - p.start), 0, to - from); };
    std::vector<AsyncIo::Op> ops;
    WalkExtents(layout_->extents, p.start, p.end, kBlock, zero, [&](const Extent& x, uint64_t a, uint64_t b) {
      if (verify) parts_[i].push_back(Part{&x, a, b - a});
      for (uint64_t at = a; at < b; at += io_bytes_) {
        AsyncIo::Op op;
        op.fd = layout_->data_fd;
        op.offset = x.physical + (at - x.file_offset);
        op.buffer = data + (at - p.start);
        op.length = static_cast<uint32_t>(std::min(io_bytes_, b - at));
        op.tag = i;
        ops.push_back(op);
      }
    });
    BeginPiece(i);  // a piece of holes only is done here
    for (const AsyncIo::Op& op : ops) {
      if (error() != 0) break;
      Note(Submit(op));
    }
    EndPiece(i);
    if (error() == 0) Reap(0);
  }
  Drain();
  Note(Settle());
  client->bytes_read.fetch_add(stats_.io_bytes, std::memory_order_relaxed);
  return error();
}

int ReadJob::FinishOldest() {
  size_t first = 0, last = 0;
  MemoryReply reply;
  {
    Timed t(&stats_.daemon_seconds);
    reply = steps_->WaitOldest(&first, &last);
  }
  if (reply.rc != 0) Note(Fail(-reply.rc, reply.message));
  // The file may have shrunk since the request began.
  if (error() == 0 && plan_.exact_end > reply.size) Note(CheckSize(reply.size));
  for (size_t i = first; i < last; ++i) {
    if (error() == 0) {
      stats_.io_bytes += piece(i).end - piece(i).start;
      Note(CopyOut(i));  // gives the buffer back, or once its device copies have run
    }
    if (error() != 0) Release(i);
  }
  return error();
}

int ReadJob::ReadMemory() {
  struct stat st;
  if (fstat(file_->fd, &st) != 0) {
    int e = errno;
    return Fail(e, WithErrno("cannot stat " + file_->path, e));
  }
  if (int rc = CheckSize(static_cast<uint64_t>(st.st_size)); rc != 0) return rc;
  steps_.emplace(file_->mountpoint, pool_->capacity(), chunk_bytes_);
  for (size_t first = 0; first < plan_.pieces.size() && error() == 0;) {
    if (steps_->full() && FinishOldest() != 0) break;
    const size_t last = TakeBuffers(first, steps_->StepEnd(plan_, first));
    if (last == first) break;  // the error is noted
    std::vector<uint64_t> pieces;
    pieces.reserve(3 * (last - first));
    for (size_t i = first; i < last; ++i) {
      pieces.insert(pieces.end(), {pool_->shared_offset(Data(i)), piece(i).start, piece(i).end - piece(i).start});
    }
    Note(steps_->Send(MemoryRequest("mem_read", file_->fd, pool_->shared_fd(), pieces), "mem_read", first, last));
    first = last;
  }
  while (!steps_->empty()) FinishOldest();
  Note(Settle());
  return error();
}

int ReadJob::Work() {
  int rc = file_->backend == Backend::kDirectPath ? ReadDirect()
           : file_->backend == Backend::kMemoryIo ? ReadMemory()
                                                  : ReadFile();
  if (rc != 0) return rc;
  // The caller's stream waits for the copies into its memory.
  for (int device : plan_.devices) {
    Status s = Stream(device)->SignalTo(caller_stream_);
    if (!s.ok()) return Fail(s.code(), "cannot order the caller's stream after the copies: " + s.message());
  }
  return 0;
}

}  // namespace

std::unique_ptr<SegmentJob> MakeReadJob(spill_file* file, Plan plan, std::shared_ptr<spillfs::cuda::PinnedPool> pool,
                                        uint64_t chunk_bytes, uintptr_t stream) {
  return std::make_unique<ReadJob>(file, std::move(plan), std::move(pool), chunk_bytes, stream);
}

}  // namespace spillfs::client
