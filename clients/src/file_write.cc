// The write pipeline of segment files: each piece is staged (the partial
// blocks at its edges completed from the file, host segments copied in,
// device segments copied to the host on the device's copy stream), hashed
// where the direct path wants block checksums, and written with io_uring
// while the next piece is staged. On the direct path the pieces go in
// steps of commit_bytes: reserved ahead, committed behind (on two control
// channels, as spill_write does). With memory I/O (callers who may not open
// the data area) the pieces are staged in the shareable pool's memfd and
// each step is one mem_write: the daemon hashes, shares, writes and commits
// it while the next steps are staged.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <optional>
#include <string>

#include "client_impl.h"
#include "error.h"
#include "file_job.h"
#include "file_settings.h"
#include "memory_io.h"
#include "spillfs/common/block_checksum.h"
#include "spillfs/common/rounding.h"
#include "spillfs/cuda/hash_kernels.h"

namespace spillfs::client {
namespace {

class WriteJob : public SegmentJob {
 public:
  using SegmentJob::SegmentJob;

 protected:
  int Work() override;

 private:
  // Fills the staging buffer of piece i (nothing for a piece written from
  // memory as is).
  int Stage(size_t i);
  // The bytes of the file's block at `block` (in the file before this
  // request) into `out`, or zeros past its end.
  int OldBlock(uint64_t block, char* out);
  int WriteFile();
  int WriteDirect();
  // The segment holding piece i whole, where it is CUDA memory; else null.
  const Seg* WholeDeviceSegment(size_t i) const;
  // Piece i's block checksums (into sums, where not null) and the XXH3-128
  // of its whole units (appended to units as file offset, low, high, where
  // not null), computed on the GPU from `s`, where its bytes are: the CPU
  // does nothing per byte of a CUDA tensor. 0 or -errno.
  int HashOnDevice(const Seg& s, size_t i, uint32_t* sums, std::vector<uint64_t>* units);
  int WriteMemory();
  // Memory I/O: waits for the oldest step in flight and gives its buffers back.
  int SettleOldest();
  // Memory I/O: every step sent gives its buffers back once the daemon is
  // done with it (this job's own thread is not needed for that).
  int GiveBackIdle() override {
    while (steps_ && !steps_->empty()) {
      if (SettleOldest() != 0) return error();
    }
    return 0;
  }

  uint64_t size_before_ = 0;          // of the file, when the request began
  std::optional<MemorySteps> steps_;  // memory I/O: the steps sent to the daemon
};

int WriteJob::OldBlock(uint64_t block, char* out) {
  uint64_t have = 0;
  if (block < size_before_) {
    while (have < kBlock) {
      ssize_t n = pread(file_->fd, out + have, kBlock - have, static_cast<off_t>(block + have));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int e = errno;
        return Fail(e, WithErrno("cannot read the block at " + std::to_string(block) + " of " + file_->path +
                                     " (to complete a partly written block)",
                                 e));
      }
      if (n == 0) break;
      have += static_cast<uint64_t>(n);
    }
  }
  std::memset(out + have, 0, kBlock - have);
  return 0;
}

int WriteJob::Stage(size_t i) {
  const Piece& p = piece(i);
  if (p.direct != nullptr) return 0;
  char* buf = buffers_[i] ? Data(i) : Acquire(i);  // memory I/O takes a step's buffers first
  if (buf == nullptr) return error();
  Timed t(&stats_.copy_seconds);
  // First the gaps the segments leave (inside the partial blocks at their
  // edges): the file's bytes there, or zeros past its end; then the
  // segments over them.
  uint64_t last_old = UINT64_MAX;  // block already read
  auto gap = [&](uint64_t from, uint64_t to) -> int {
    for (uint64_t b = RoundDown(from, kBlock); b < to; b += kBlock) {
      if (b < size_before_) {
        if (b == last_old) continue;
        if (int rc = OldBlock(b, buf + (b - p.start)); rc != 0) return rc;
        last_old = b;
      } else {
        const uint64_t a = std::max(from, b), e = std::min(to, b + kBlock);
        std::memset(buf + (a - p.start), 0, e - a);
      }
    }
    return 0;
  };
  uint64_t cursor = p.start;
  for (size_t k = p.first_seg; k < p.last_seg; ++k) {
    const Seg& s = plan_.segs[k];
    const uint64_t a = std::max(s.offset, p.start), b = std::min(s.end(), p.end);
    if (b <= a) continue;
    if (a > cursor) {
      if (int rc = gap(cursor, a); rc != 0) return rc;
    }
    cursor = std::max(cursor, b);
  }
  if (cursor < p.end) {
    if (int rc = gap(cursor, p.end); rc != 0) return rc;
  }
  bool on_device = false;
  for (size_t k = p.first_seg; k < p.last_seg; ++k) {
    const Seg& s = plan_.segs[k];
    const uint64_t a = std::max(s.offset, p.start), b = std::min(s.end(), p.end);
    if (b <= a) continue;
    if (s.device < 0) {
      std::memcpy(buf + (a - p.start), s.ptr + (a - s.offset), b - a);
    } else {
      Status copied = Stream(s.device)->ToHost(buf + (a - p.start), s.ptr + (a - s.offset), b - a);
      if (!copied.ok()) return Fail(copied.code(), "device-to-host copy failed: " + copied.message());
      on_device = true;
    }
  }
  return on_device ? WaitStreams() : 0;
}

const Seg* WriteJob::WholeDeviceSegment(size_t i) const {
  const Piece& p = piece(i);
  for (size_t k = p.first_seg; k < p.last_seg; ++k) {
    const Seg& s = plan_.segs[k];
    if (s.offset <= p.start && s.end() >= p.end) return s.device >= 0 ? &s : nullptr;
  }
  return nullptr;
}

int WriteJob::HashOnDevice(const Seg& s, size_t i, uint32_t* sums, std::vector<uint64_t>* units) {
  const Piece& p = piece(i);
  const uintptr_t stream = Stream(s.device)->stream();
  if (sums != nullptr) {
    Status hashed = spillfs::cuda::BlockChecksums(s.ptr + (p.start - s.offset), p.end - p.start, kBlock, sums, stream);
    if (!hashed.ok()) return Fail(hashed.code(), "block checksums on CUDA device: " + hashed.message());
  }
  const uint64_t first = RoundUp(p.start, kHashUnit), end = std::min(p.end, plan_.exact_end);
  if (units == nullptr || first + kHashUnit > end) return 0;
  std::vector<spillfs::cuda::Hash128> hashes((end - first) / kHashUnit);
  Status hashed = spillfs::cuda::UnitHashes(s.ptr + (first - s.offset), hashes.size() * kHashUnit, kHashUnit,
                                            hashes.data(), stream);
  if (!hashed.ok()) return Fail(hashed.code(), "unit hashes on CUDA device: " + hashed.message());
  for (size_t k = 0; k < hashes.size(); ++k) {
    units->insert(units->end(), {first + k * kHashUnit, hashes[k].low64, hashes[k].high64});
  }
  return 0;
}

// Through a file system (a spillfs mount or another): the pieces at their
// file offsets; then the size, exact once the last write of the handle ends.
int WriteJob::WriteFile() {
  size_before_ = file_->BeginWrite();
  int rc = 0;
  for (size_t i = 0; i < plan_.pieces.size() && rc == 0; ++i) {
    if ((rc = Stage(i)) != 0) break;
    const Piece& p = piece(i);
    char* data = Data(i);
    BeginPiece(i);
    for (uint64_t at = p.start; at < p.end && rc == 0; at += io_bytes_) {
      AsyncIo::Op op;
      op.fd = file_->fd;
      op.write = true;
      op.offset = at;
      op.buffer = data + (at - p.start);
      op.length = static_cast<uint32_t>(std::min(io_bytes_, p.end - at));
      op.tag = i;
      rc = Submit(op);
    }
    EndPiece(i);
    if (rc == 0) rc = Reap(0);
  }
  Note(rc);
  Drain();
  rc = error();
  const int sized = file_->EndWrite(rc == 0, plan_.exact_end, plan_.pieces.back().end);
  return rc != 0 ? rc : sized;
}

// The direct path: steps of whole pieces, each reserved, written and
// committed with its block checksums (and the hashes of its whole units).
int WriteJob::WriteDirect() {
  spill_client* client = file_->client.get();
  const std::string& rel = file_->rel;
  const bool sums_wanted = client->checksums;
  const bool units_wanted = client->dedup && Settings().unit_hashes.load();
  const bool device_hashes = Settings().device_hashes.load();
  {
    struct stat st;
    if (fstat(file_->fd, &st) != 0) {
      int e = errno;
      return Fail(e, WithErrno("cannot stat " + file_->path, e));
    }
    size_before_ = static_cast<uint64_t>(st.st_size);
  }
  // Steps: runs of pieces (consecutive in the plan, not necessarily in the
  // file: a dedup'd checkpoint's changed units and headers lie scattered),
  // at most commit_bytes (whole chunks) of pieces each. A step's pieces go
  // back to back into its reserved space, and one commit maps them all
  // (over several file ranges where they are not contiguous): one reserve
  // and one commit for a request of scattered small pieces, not one each.
  struct Step {
    size_t first, last;            // pieces
    uint64_t bytes;                // reserved
    uint64_t end;                  // of the last piece, in the file
    std::vector<uint64_t> ranges;  // file offset, length of each contiguous run of pieces, flat
  };
  std::vector<Step> steps;
  std::vector<uint64_t> at_in_step(plan_.pieces.size());  // where each piece lies in its step's space
  const uint64_t step_bytes = std::max(chunk_bytes_, RoundDown(Settings().commit_bytes.load(), chunk_bytes_));
  for (size_t i = 0; i < plan_.pieces.size(); ++i) {
    const Piece& p = piece(i);
    const uint64_t n = p.end - p.start;
    if (steps.empty() || steps.back().bytes + n > step_bytes) steps.push_back(Step{i, i, 0, 0, {}});
    Step& step = steps.back();
    at_in_step[i] = step.bytes;
    if (!step.ranges.empty() && step.end == p.start) {
      step.ranges.back() += n;
    } else {
      step.ranges.insert(step.ranges.end(), {p.start, n});
    }
    step.last = i + 1;
    step.bytes += n;
    step.end = p.end;
  }
  auto step_len = [&](size_t k) -> uint64_t { return k < steps.size() ? steps[k].bytes : 0; };

  // Channels round-robin: step k reserves and commits on channel k % depth,
  // so a step's commit (a sync of the data area and an index batch) may take
  // as long as the next depth-1 steps take to write before the writes wait.
  const size_t depth = std::min<size_t>(Settings().commit_depth.load(), steps.size());
  std::vector<std::unique_ptr<ControlChannel>> txn(depth);  // hold the reservations; closing drops them
  for (auto& channel : txn) {
    if (int rc = client->OpenChannel(&channel); rc != 0) return rc;
  }
  using Reservation = spill_client::Reservation;
  std::vector<std::future<Reservation>> pending(depth);
  auto settle = [&](size_t slot, Reservation* out) -> int {
    Timed t(&stats_.daemon_seconds);
    Reservation r = pending[slot].valid() ? pending[slot].get() : Reservation();
    if (r.rc != 0) {
      Note(Fail(-r.rc, r.message));
      return error();
    }
    if (out != nullptr) *out = std::move(r);
    return 0;
  };
  auto settle_all = [&] {
    for (size_t slot = 0; slot < depth; ++slot) settle(slot, nullptr);
    return error();
  };
  Reservation current;
  {
    Timed t(&stats_.daemon_seconds);
    current = client->ReserveStep(txn[0].get(), rel, step_len(0));
  }
  if (current.rc != 0) return Fail(-current.rc, current.message);
  for (size_t k = 1; k < depth; ++k) {
    ControlChannel* other = txn[k].get();
    const uint64_t n = step_len(k);
    pending[k] = std::async(std::launch::async, [=] { return client->ReserveStep(other, rel, n); });
  }
  for (size_t k = 0; k < steps.size(); ++k) {
    const size_t slot = k % depth;
    if (k > 0 && settle(slot, &current) != 0) break;
    const Step& step = steps[k];
    auto sums = std::make_shared<std::vector<uint32_t>>(sums_wanted ? step.bytes / kBlock : 0);
    auto units = std::make_shared<std::vector<uint64_t>>();
    for (size_t i = step.first; i < step.last && error() == 0; ++i) {
      if (int r = Stage(i); r != 0) {
        Note(r);
        break;
      }
      const Piece& p = piece(i);
      char* data = Data(i);
      if (const Seg* on_device = device_hashes ? WholeDeviceSegment(i) : nullptr; on_device != nullptr) {
        Timed t(&stats_.hash_seconds);
        if (int r = HashOnDevice(*on_device, i, sums_wanted ? sums->data() + at_in_step[i] / kBlock : nullptr,
                                 units_wanted ? units.get() : nullptr);
            r != 0) {
          Note(r);
          break;
        }
      } else {
        Timed t(&stats_.hash_seconds);
        for (uint64_t b = p.start; sums_wanted && b < p.end; b += kBlock) {
          (*sums)[(at_in_step[i] + b - p.start) / kBlock] = BlockChecksum(data + (b - p.start), kBlock);
        }
        for (uint64_t u = RoundUp(p.start, kHashUnit);
             units_wanted && u + kHashUnit <= std::min(p.end, plan_.exact_end); u += kHashUnit) {
          XXH128_hash_t h = ContentHash128(data + (u - p.start), kHashUnit);
          units->insert(units->end(), {u, h.low64, h.high64});
        }
      }
      // [p.start, p.end) lies at at_in_step[i] of the step's reserved
      // space, which may come in several pieces.
      uint64_t skip = at_in_step[i];
      uint64_t at = p.start;
      BeginPiece(i);
      for (auto [phys, len] : current.space) {
        if (at >= p.end) break;
        if (skip >= len) {
          skip -= len;
          continue;
        }
        const uint64_t n = std::min(len - skip, p.end - at);
        for (uint64_t done = 0; done < n && error() == 0; done += io_bytes_) {
          AsyncIo::Op op;
          op.fd = current.fd;
          op.write = true;
          op.offset = phys + skip + done;
          op.buffer = data + (at + done - p.start);
          op.length = static_cast<uint32_t>(std::min(io_bytes_, n - done));
          op.tag = i;
          Note(Submit(op));
        }
        at += n;
        skip = 0;
      }
      EndPiece(i);
      if (error() == 0) Reap(0);
    }
    // The step's bytes are on the device before it is committed.
    Drain();
    if (error() != 0) break;
    client->bytes_written.fetch_add(step.bytes, std::memory_order_relaxed);
    ControlChannel* channel = txn[slot].get();
    const uint64_t pos = step.ranges[0], length = step.bytes;
    const uint64_t size = std::min(step.end, plan_.exact_end);
    const uint64_t next_len = step_len(k + depth);
    // One run: the plain form; several: "ranges".
    auto ranges =
        std::make_shared<std::vector<uint64_t>>(step.ranges.size() > 2 ? step.ranges : std::vector<uint64_t>());
    pending[slot] = std::async(std::launch::async, [=] {
      return client->CommitStep(channel, rel, pos, length, size, *sums, next_len, units.get(), ranges.get());
    });
  }
  return settle_all();
}

int WriteJob::SettleOldest() {
  size_t first = 0, last = 0;
  MemoryReply reply;
  {
    Timed t(&stats_.daemon_seconds);
    reply = steps_->WaitOldest(&first, &last);
  }
  for (size_t i = first; i < last; ++i) Release(i);
  if (reply.rc != 0) {
    Note(Fail(-reply.rc, reply.message));
    return error();
  }
  stats_.io_bytes += reply.written_bytes;
  stats_.shared_bytes += reply.mapped_bytes;
  return 0;
}

int WriteJob::WriteMemory() {
  {
    struct stat st;
    if (fstat(file_->fd, &st) != 0) {
      int e = errno;
      return Fail(e, WithErrno("cannot stat " + file_->path, e));
    }
    size_before_ = static_cast<uint64_t>(st.st_size);
  }
  const bool dedup = file_->memory_dedup && Settings().unit_hashes.load();
  steps_.emplace(file_->mountpoint, pool_->capacity(), chunk_bytes_);
  for (size_t first = 0; first < plan_.pieces.size() && error() == 0;) {
    if (steps_->full() && SettleOldest() != 0) break;
    const size_t last = TakeBuffers(first, steps_->StepEnd(plan_, first));
    if (last == first) break;  // the error is noted
    for (size_t i = first; i < last && error() == 0; ++i) Note(Stage(i));
    if (error() != 0) break;
    std::vector<uint64_t> pieces;
    pieces.reserve(3 * (last - first));
    for (size_t i = first; i < last; ++i) {
      pieces.insert(pieces.end(), {pool_->shared_offset(Data(i)), piece(i).start, piece(i).end - piece(i).start});
    }
    const uint64_t size = std::min(piece(last - 1).end, plan_.exact_end);
    Note(steps_->Send(MemoryRequest("mem_write", file_->fd, pool_->shared_fd(), pieces,
                                    R"(,"size":)" + std::to_string(size) + R"(,"dedup":)" + (dedup ? "true" : "false")),
                      "mem_write", first, last));
    first = last;
  }
  while (!steps_->empty()) SettleOldest();
  if (error() == 0) {
    std::lock_guard lock(file_->size_mu);
    file_->size = std::max(file_->size, plan_.exact_end);
  }
  return error();
}

int WriteJob::Work() {
  if (file_->backend == Backend::kDirectPath) return WriteDirect();
  if (file_->backend == Backend::kMemoryIo) return WriteMemory();
  return WriteFile();
}

}  // namespace

std::unique_ptr<SegmentJob> MakeWriteJob(spill_file* file, Plan plan, std::shared_ptr<spillfs::cuda::PinnedPool> pool,
                                         uint64_t chunk_bytes, uintptr_t stream) {
  return std::make_unique<WriteJob>(file, std::move(plan), std::move(pool), chunk_bytes, stream);
}

}  // namespace spillfs::client
