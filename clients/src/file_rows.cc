// spill_file_read_rows: batched random row reads from a segment file of any
// backend (feature tables: a .npy's data or a raw row-major file).
//
// Why here and not spill_read_rows: that one needs a spill_client (root on a
// spillfs mount) and rows from offset 0; a feature table is an ordinary file
// anywhere (its .npy header ahead of the rows). The plan is the same on
// every backend: rows sorted by position, the 4 KiB blocks they touch merged
// into runs (rows sharing a block read it once), runs cut into I/Os of at
// most 128 KiB ("rows_io_bytes" of the direct path's client), all in flight
// on the calling thread's io_uring (RunIo, queue depth 128). Then:
//  - direct path: each run is mapped through the file's layout (the
//    client's layout cache, refreshed once on a checksum mismatch), holes
//    read as zeros, every block verified;
//  - other backends: the I/Os go to the handle's descriptor (O_DIRECT or
//    buffered); the block holding the end of the file is read on its own
//    (pread), since RunIo treats a short read as the end of a store.
//
// Threading: any thread, concurrently on one handle (RunIo's ring is the
// calling thread's; the layout cache has its lock).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "client_impl.h"
#include "error.h"
#include "file_impl.h"

namespace spillfs::client {
namespace {

constexpr uint64_t kMaxRowsOp = 128 << 10;
constexpr unsigned kRowsQueueDepth = 128;

// The rows of one call in file order, and the block runs they need.
struct RowPlan {
  std::vector<uint32_t> order;                      // positions in the caller's arrays, by file offset
  std::vector<uint64_t> starts;                     // file offset of each row in `order`'s order
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // block-aligned file ranges
  uint64_t row_bytes = 0;
  char* out = nullptr;

  // Copies the part of [a, b) (bytes at src; zeros when src is null) that
  // each row overlapping it holds into the caller's output.
  void Copy(uint64_t a, uint64_t b, const char* src) const {
    const size_t n = starts.size();
    size_t i = a >= row_bytes
                   ? static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), a - row_bytes) - starts.begin())
                   : 0;
    for (; i < n && starts[i] < b; ++i) {
      const uint64_t s = std::max(a, starts[i]);
      const uint64_t e = std::min(b, starts[i] + row_bytes);
      if (e <= s) continue;
      char* dst = out + static_cast<uint64_t>(order[i]) * row_bytes + (s - starts[i]);
      if (src == nullptr) {
        std::memset(dst, 0, e - s);
      } else {
        std::memcpy(dst, src + (s - a), e - s);
      }
    }
  }
};

void MakeRowPlan(uint64_t data_offset, uint64_t row_bytes, const int64_t* rows, size_t n, char* out, RowPlan* p) {
  p->row_bytes = row_bytes;
  p->out = out;
  p->order.resize(n);
  std::iota(p->order.begin(), p->order.end(), 0u);
  std::sort(p->order.begin(), p->order.end(), [&](uint32_t a, uint32_t b) { return rows[a] < rows[b]; });
  p->starts.resize(n);
  for (size_t i = 0; i < n; ++i) p->starts[i] = data_offset + static_cast<uint64_t>(rows[p->order[i]]) * row_bytes;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t a = RoundDown(p->starts[i], kBlock);
    const uint64_t b = RoundUp(p->starts[i] + row_bytes, kBlock);
    if (!p->runs.empty() && a <= p->runs.back().second) {
      p->runs.back().second = std::max(p->runs.back().second, b);
    } else {
      p->runs.emplace_back(a, b);
    }
  }
}

// Every row within [data_offset, size); -ERANGE naming the first that is not.
int CheckRows(const spill_file* file, uint64_t size, uint64_t data_offset, uint64_t row_bytes, const int64_t* rows,
              size_t n) {
  const uint64_t count = size > data_offset ? (size - data_offset) / row_bytes : 0;
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || static_cast<uint64_t>(rows[i]) >= count) {
      return Fail(ERANGE, "row " + std::to_string(rows[i]) + " (index " + std::to_string(i) + ") of " +
                              std::to_string(row_bytes) + " bytes from offset " + std::to_string(data_offset) +
                              " lies outside " + file->path + " (" + std::to_string(size) + " bytes, " +
                              std::to_string(count) + " rows)");
    }
  }
  return 0;
}

// Direct path: the runs through the layout, verified. Returns 0, -errno or
// -kChecksumMismatch.
int ReadDirect(spill_client* client, const Layout& layout, const RowPlan& p, spill_io_stats* stats) {
  std::vector<ExtentRead> pieces;
  std::vector<IoOp> ops;
  const uint64_t bs = layout.block_size;
  const uint64_t max_op = std::max<uint64_t>(bs, RoundDown(client->rows_io_bytes.load(), bs));
  for (auto [ra, rb] : p.runs) {
    PlanExtentReads(
        layout, ra, rb, max_op, [&](uint64_t a, uint64_t b) { p.Copy(a, b, nullptr); }, &ops, &pieces);
  }
  IoDone done = [&](const IoOp& op, const char* data) -> int {
    const ExtentRead& piece = pieces[op.tag];
    int rc = client->Verify(layout, *piece.x, piece.file_at, data, op.length);
    if (rc != 0) return rc;
    p.Copy(piece.file_at, piece.file_at + op.length, data);
    return 0;
  };
  uint64_t completed = 0;
  const int rc = RunIo(ops, client->rows_queue_depth.load(), static_cast<uint32_t>(max_op), nullptr, done, &completed);
  uint64_t bytes = 0;
  for (const IoOp& op : ops) bytes += op.length;
  client->ios.fetch_add(completed, std::memory_order_relaxed);
  client->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  stats->ios += completed;
  stats->io_bytes += bytes;
  return rc;
}

// Other backends: the runs from the handle's descriptor; the block holding
// the end of a file whose size is not a block multiple by pread.
int ReadFd(spill_file* file, uint64_t size, const RowPlan& p, spill_io_stats* stats) {
  const uint64_t whole_end = RoundDown(size, kBlock);  // RunIo reads below this
  std::vector<IoOp> ops;
  bool tail = false;
  for (auto [ra, rb] : p.runs) {
    if (rb > whole_end) tail = true;
    const uint64_t stop = std::min(rb, whole_end);
    for (uint64_t at = ra; at < stop; at += kMaxRowsOp) {
      IoOp op;
      op.fd = file->fd;
      op.offset = at;
      op.length = static_cast<uint32_t>(std::min(kMaxRowsOp, stop - at));
      ops.push_back(op);
    }
  }
  IoDone done = [&](const IoOp& op, const char* data) -> int {
    p.Copy(op.offset, op.offset + op.length, data);
    return 0;
  };
  uint64_t completed = 0;
  int rc = RunIo(ops, kRowsQueueDepth, static_cast<uint32_t>(kMaxRowsOp), nullptr, done, &completed);
  stats->ios += completed;
  for (const IoOp& op : ops) stats->io_bytes += op.length;
  if (rc != 0) {
    if (rc == -EIO && LastError().find("end of the store") != std::string::npos) {
      return Fail(EIO, file->path + " shrank while its rows were read");
    }
    return rc;
  }
  if (!tail) return 0;
  char* block = static_cast<char*>(AllocAligned(kBlock));
  if (block == nullptr) return Fail(ENOMEM, "cannot allocate a block buffer");
  ssize_t got = pread(file->fd, block, kBlock, static_cast<off_t>(whole_end));
  const int e = errno;
  if (got >= 0) {
    std::memset(block + got, 0, kBlock - static_cast<size_t>(got));
    p.Copy(whole_end, whole_end + kBlock, block);
    stats->ios += 1;
    stats->io_bytes += kBlock;
  }
  FreeAligned(block, kBlock);
  if (got < 0) return Fail(e, WithErrno("cannot read the last block of " + file->path, e));
  if (static_cast<uint64_t>(got) < size - whole_end) {
    return Fail(EIO, file->path + " shrank while its rows were read");
  }
  return 0;
}

int ReadRows(spill_file* file, uint64_t data_offset, uint64_t row_bytes, const int64_t* rows, size_t n, void* out,
             spill_io_stats* stats) {
  const auto begin = std::chrono::steady_clock::now();
  spill_io_stats local{};
  spill_io_stats* st = stats != nullptr ? stats : &local;
  *st = spill_io_stats{};
  if (file == nullptr) return Fail(EINVAL, "null file");
  if ((file->flags & SPILL_FILE_READ) == 0) return Fail(EBADF, file->path + " was not opened for reading");
  if (n == 0) return 0;
  if (row_bytes == 0) return Fail(EINVAL, "row_bytes must be positive");
  if (rows == nullptr || out == nullptr) return Fail(EFAULT, "null rows or output buffer");
  if (n > UINT32_MAX) return Fail(EINVAL, "too many rows in one call (at most 2^32 - 1)");
  st->bytes = n * row_bytes;
  int rc = 0;
  RowPlan plan;
  if (file->backend == Backend::kDirectPath) {
    spill_client* client = file->client.get();
    client->AdoptAfterFork();
    for (int attempt = 0;; ++attempt) {
      std::shared_ptr<Layout> layout;
      {
        const auto t0 = std::chrono::steady_clock::now();
        rc = client->CachedLayout(file->rel, attempt > 0, &layout);
        st->daemon_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      if (rc != 0) break;
      if ((rc = CheckRows(file, layout->size, data_offset, row_bytes, rows, n)) != 0) break;
      if (plan.starts.empty()) MakeRowPlan(data_offset, row_bytes, rows, n, static_cast<char*>(out), &plan);
      rc = ReadDirect(client, *layout, plan, st);
      if (rc == -kChecksumMismatch) {
        if (attempt == 0) continue;  // a fresh layout, once
        rc = -EIO;                   // the message is set
      }
      break;
    }
  } else {
    struct stat s;
    if (fstat(file->fd, &s) != 0) {
      const int e = errno;
      rc = Fail(e, WithErrno("cannot stat " + file->path, e));
    } else if ((rc = CheckRows(file, static_cast<uint64_t>(s.st_size), data_offset, row_bytes, rows, n)) == 0) {
      MakeRowPlan(data_offset, row_bytes, rows, n, static_cast<char*>(out), &plan);
      rc = ReadFd(file, static_cast<uint64_t>(s.st_size), plan, st);
    }
  }
  st->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  st->io_seconds = st->seconds;
  return rc;
}

}  // namespace
}  // namespace spillfs::client

extern "C" int spill_file_read_rows(spill_file* file, uint64_t data_offset, uint64_t row_bytes, const int64_t* rows,
                                    size_t n, void* out, spill_io_stats* stats) {
  spillfs::client::ClearError();
  return spillfs::client::ReadRows(file, data_offset, row_bytes, rows, n, out, stats);
}
