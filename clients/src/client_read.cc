// spill_client: spill_read (one layout, reads at queue depth) and
// spill_read_rows (cached layouts, rows merged into block runs).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <string>

#include "client_impl.h"
#include "error.h"
#include "spillfs/common/block_checksum.h"

using namespace spillfs::client;
using spillfs::BlockChecksum;
using spillfs::RoundDown;
using spillfs::RoundUp;

// Reads [offset, offset + n) (within the file) into out.
int spill_client::ReadRange(const Layout& layout, char* out, uint64_t offset, uint64_t n) {
  const uint64_t bs = layout.block_size;
  const uint64_t end = offset + n;
  const uint64_t chunk = std::max<uint64_t>(bs, RoundDown(io_bytes.load(), bs));
  std::vector<ExtentRead> pieces;
  std::vector<IoOp> ops;
  auto zero = [&](uint64_t from, uint64_t to) { std::memset(out + (from - offset), 0, to - from); };
  WalkExtents(layout.extents, offset, end, bs, zero, [&](const Extent& x, uint64_t a, uint64_t b) {
    for (uint64_t at = RoundDown(a, bs); at < b; at += chunk) {
      const uint64_t stop = std::min(at + chunk, RoundUp(b, bs));
      IoOp op;
      op.fd = layout.data_fd;
      op.offset = x.physical + (at - x.file_offset);
      op.length = static_cast<uint32_t>(stop - at);
      op.tag = pieces.size();
      char* dst = out + (at - offset);
      if (at >= offset && stop <= end && Aligned(dst)) op.buffer = dst;
      pieces.push_back(ExtentRead{&x, at});
      ops.push_back(op);
    }
  });
  IoDone done = [&](const IoOp& op, const char* data) -> int {
    const ExtentRead& p = pieces[op.tag];
    bytes_read.fetch_add(op.length, std::memory_order_relaxed);
    int rc = Verify(layout, *p.x, p.file_at, data, op.length);
    if (rc != 0) return rc;
    if (op.buffer == nullptr) {
      uint64_t a = std::max(offset, p.file_at);
      uint64_t b = std::min(end, p.file_at + op.length);
      std::memcpy(out + (a - offset), data + (a - p.file_at), b - a);
    }
    return 0;
  };
  uint64_t completed = 0;
  std::shared_ptr<TaskPool> workers = Pool();
  int rc = RunIo(ops, queue_depth.load(), static_cast<uint32_t>(chunk), nullptr, done, &completed, workers.get());
  ios.fetch_add(completed, std::memory_order_relaxed);
  return rc;
}

int64_t spill_client::Read(const char* path, void* buf, size_t len, uint64_t offset) {
  std::string rel;
  int rc = Normalize(path, &rel);
  if (rc != 0) return rc;
  if (len > 0 && buf == nullptr) return Fail(EFAULT, "null buffer");
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<ControlChannel> lease;
    if ((rc = OpenChannel(&lease)) != 0) return rc;
    std::shared_ptr<Layout> layout;
    {
      Phase phase("layout", rel, 0);
      if ((rc = FetchLayout(std::move(lease), rel, &layout)) != 0) return rc;
    }
    if (offset >= layout->size || len == 0) return 0;
    uint64_t n = std::min<uint64_t>(len, layout->size - offset);
    {
      Phase phase("read", rel, n);
      rc = ReadRange(*layout, static_cast<char*>(buf), offset, n);
    }
    if (rc == -kChecksumMismatch) {
      if (attempt == 0) continue;  // a fresh layout, once
      return -EIO;                 // message already set
    }
    if (rc != 0) return rc;
    return static_cast<int64_t>(n);
  }
}

int spill_client::ReadRowsWith(const Layout& layout, uint64_t row_bytes, const uint64_t* rows, size_t n, char* out) {
  const uint64_t bs = layout.block_size;
  const uint64_t max_op = std::max<uint64_t>(bs, RoundDown(rows_io_bytes.load(), bs));
  // Rows by position in the file.
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return rows[a] < rows[b]; });
  std::vector<uint64_t> starts(n);
  for (size_t i = 0; i < n; ++i) starts[i] = rows[order[i]] * row_bytes;

  // Blocks needed, merged into runs of neighbouring blocks.
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // file byte ranges, block aligned
  for (size_t i = 0; i < n; ++i) {
    uint64_t a = RoundDown(starts[i], bs);
    uint64_t b = RoundUp(starts[i] + row_bytes, bs);
    if (!runs.empty() && a <= runs.back().second) {
      runs.back().second = std::max(runs.back().second, b);
    } else {
      runs.emplace_back(a, b);
    }
  }

  // Calls f(sorted index) for each row that overlaps [a, b).
  auto for_rows = [&](uint64_t a, uint64_t b, auto&& f) {
    // First row whose end lies past a: start > a - row_bytes.
    size_t i = a >= row_bytes
                   ? static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), a - row_bytes) - starts.begin())
                   : 0;
    for (; i < n && starts[i] < b; ++i) f(i);
  };
  // Copies the part of [a, b) (whose bytes are at src) that row i holds.
  auto copy_rows = [&](uint64_t a, uint64_t b, const char* src) {
    for_rows(a, b, [&](size_t i) {
      uint64_t s = std::max(a, starts[i]);
      uint64_t e = std::min(b, starts[i] + row_bytes);
      char* dst = out + static_cast<uint64_t>(order[i]) * row_bytes + (s - starts[i]);
      if (src == nullptr) {
        std::memset(dst, 0, e - s);
      } else {
        std::memcpy(dst, src + (s - a), e - s);
      }
    });
  };

  std::vector<ExtentRead> pieces;
  std::vector<IoOp> ops;
  for (auto [ra, rb] : runs) {
    PlanExtentReads(
        layout, ra, rb, max_op, [&](uint64_t a, uint64_t b) { copy_rows(a, b, nullptr); }, &ops, &pieces);
  }
  IoDone done = [&](const IoOp& op, const char* data) -> int {
    const ExtentRead& p = pieces[op.tag];
    bytes_read.fetch_add(op.length, std::memory_order_relaxed);
    int rc = Verify(layout, *p.x, p.file_at, data, op.length);
    if (rc != 0) return rc;
    copy_rows(p.file_at, p.file_at + op.length, data);
    return 0;
  };
  uint64_t completed = 0;
  int rc = RunIo(ops, rows_queue_depth.load(), static_cast<uint32_t>(max_op), nullptr, done, &completed);
  ios.fetch_add(completed, std::memory_order_relaxed);
  return rc;
}

int spill_client::ReadRows(const char* path, uint64_t row_bytes, const uint64_t* rows, size_t n, void* out) {
  std::string rel;
  int rc = Normalize(path, &rel);
  if (rc != 0) return rc;
  if (n == 0) return 0;
  if (row_bytes == 0) return Fail(EINVAL, "row_bytes must be positive");
  if (rows == nullptr || out == nullptr) return Fail(EFAULT, "null rows or output buffer");
  if (n > UINT32_MAX) return Fail(EINVAL, "too many rows in one call");
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<Layout> layout;
    if ((rc = CachedLayout(rel, attempt > 0, &layout)) != 0) return rc;
    const uint64_t count = layout->size / row_bytes;  // whole rows in the file
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] >= count) {
        return Fail(ERANGE, "row " + std::to_string(rows[i]) + " of " + std::to_string(row_bytes) +
                                " bytes lies past the end of " + rel + " (" + std::to_string(layout->size) +
                                " bytes, " + std::to_string(count) + " rows)");
      }
    }
    rc = ReadRowsWith(*layout, row_bytes, rows, n, static_cast<char*>(out));
    if (rc == -kChecksumMismatch) {
      if (attempt == 0) continue;  // refresh the layout (a new generation), once
      return -EIO;
    }
    return rc;
  }
}
