// Internal to libspillfs_client (not installed): the state behind a
// spill_client handle and the helpers its parts share. The handle's work is
// split by concern:
//   client.cc         the C ABI, the handle's life (open, fork, teardown)
//   client_layout.cc  layouts: fetching, parsing, checksums, the layout cache
//   client_read.cc    spill_read and spill_read_rows
//   client_write.cc   spill_write (reserve, write at queue depth, commit)
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "control.h"
#include "fork_guard.h"
#include "io_ring.h"
#include "layout_reply.h"
#include "spillfs/client.h"
#include "spillfs/common/rounding.h"
#include "task_pool.h"

namespace spillfs::client {

using nlohmann::json;

// Returned (negated) by the verifying readers for a checksum mismatch, so the
// caller can refresh the layout and try once more; never leaves the library.
inline constexpr int kChecksumMismatch = 100000;

struct Extent {
  uint64_t file_offset = 0;
  uint64_t physical = 0;
  uint64_t length = 0;
  bool unwritten = false;
  std::vector<uint32_t> sums;  // one per block; empty when the volume keeps none
  uint64_t end() const { return file_offset + length; }
};

// A file's layout and the control handle that holds its lease.
struct Layout {
  std::unique_ptr<ControlChannel> lease;
  std::string path;  // in the mount ("/a/b")
  uint64_t ino = 0;
  uint64_t size = 0;
  uint64_t block_size = 4096;
  int data_fd = -1;
  std::vector<Extent> extents;  // sorted by file_offset, disjoint
  uint64_t generation = 0;
  struct stat st {};  // of the file through the mount when the layout was taken
  std::chrono::steady_clock::time_point taken;
};

// Walks [from, to) of a file by its extents (sorted, disjoint), in file
// order: data(x, a, b) for each part [a, b) that extent x holds, b rounded up
// to the block at the extent's end (its last block is read whole);
// zeros(a, b) for each part that reads as zeros (a hole, an unwritten
// extent). No part is empty.
template <typename Zeros, typename Data>
void WalkExtents(const std::vector<Extent>& xs, uint64_t from, uint64_t to, uint64_t block, Zeros zeros, Data data) {
  uint64_t cursor = from;  // walked up to here
  auto it = std::upper_bound(xs.begin(), xs.end(), from, [](uint64_t v, const Extent& x) { return v < x.end(); });
  for (; it != xs.end() && it->file_offset < to; ++it) {
    const Extent& x = *it;
    const uint64_t a = std::max(from, x.file_offset);
    const uint64_t b = std::min(to, RoundUp(x.end(), block));
    if (a > cursor) zeros(cursor, a);  // a hole
    cursor = b;
    if (x.unwritten) {
      zeros(a, b);
    } else {
      data(x, a, b);
    }
  }
  if (cursor < to) zeros(cursor, to);
}

// A planned read of an extent's blocks: the extent, and the file offset
// (block aligned) where the read starts.
struct ExtentRead {
  const Extent* x;
  uint64_t file_at;
};

// Plans the reads of [from, to) of a file by its layout: one op of at most
// max_op bytes (tag: its index in *reads) for each part an extent holds;
// zeros(a, b) for each part that reads as zeros.
template <typename Zeros>
void PlanExtentReads(const Layout& layout, uint64_t from, uint64_t to, uint64_t max_op, Zeros zeros,
                     std::vector<IoOp>* ops, std::vector<ExtentRead>* reads) {
  WalkExtents(layout.extents, from, to, layout.block_size, zeros, [&](const Extent& x, uint64_t a, uint64_t b) {
    for (uint64_t at = a; at < b; at += max_op) {
      IoOp op;
      op.fd = layout.data_fd;
      op.offset = x.physical + (at - x.file_offset);
      op.length = static_cast<uint32_t>(std::min(max_op, b - at));
      op.tag = reads->size();
      reads->push_back(ExtentRead{&x, at});
      ops->push_back(op);
    }
  });
}

inline bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
         a.st_mtim.tv_nsec == b.st_mtim.tv_nsec && a.st_ctim.tv_sec == b.st_ctim.tv_sec &&
         a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// SPILLFS_CLIENT_TRACE=1: one line per phase of each call on stderr.
inline bool Tracing() {
  static const bool on = [] {
    const char* v = std::getenv("SPILLFS_CLIENT_TRACE");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return on;
}

class Phase {
 public:
  Phase(const char* what, const std::string& path, uint64_t bytes)
      : what_(what), path_(path), bytes_(bytes), start_(std::chrono::steady_clock::now()) {}
  ~Phase() {
    if (!Tracing()) return;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "spillfs-client: %-8s %s %llu bytes %.6f s\n", what_, path_.c_str(),
                 static_cast<unsigned long long>(bytes_), s);
  }

 private:
  const char* what_;
  const std::string& path_;
  uint64_t bytes_;
  std::chrono::steady_clock::time_point start_;
};

// Hashing runs at several GB/s a core: a few workers keep up with any one
// NVMe device, and half the cores leave the rest to the application.
inline unsigned DefaultChecksumThreads() { return std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u); }

inline bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDirectAlignment == 0; }

template <typename T>
inline bool GetU64(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0) {
      *out = static_cast<T>(it->get<int64_t>());
      return true;
    }
    return false;
  }
  *out = it->get<T>();
  return true;
}

}  // namespace spillfs::client

// The handle of the C ABI (spillfs/client.h). Every entry point calls
// AdoptAfterFork first; the rest runs on the calling thread, with the
// checksum pool and io_uring (one ring per thread) for parallel work.
struct spill_client {
  using ControlChannel = spillfs::client::ControlChannel;
  using Layout = spillfs::client::Layout;
  using Extent = spillfs::client::Extent;
  using TaskPool = spillfs::client::TaskPool;
  using LayoutReply = spillfs::client::LayoutReply;
  using Latch = spillfs::client::Latch;
  using json = nlohmann::json;

  std::string mountpoint;  // canonical
  std::string volume;      // the mount's source (volume directory)
  std::string control_path;
  std::unique_ptr<ControlChannel> control;
  uint64_t block_size = 4096;
  bool checksums = true;
  bool dedup = false;  // the volume was made with dedup (the mount may still turn it off)

  // Tunables.
  std::atomic<unsigned> queue_depth{32};
  std::atomic<unsigned> rows_queue_depth{128};
  std::atomic<uint32_t> io_bytes{1u << 20};
  std::atomic<uint32_t> rows_io_bytes{128u << 10};
  std::atomic<uint64_t> commit_bytes{256ull << 20};
  std::atomic<bool> verify{true};
  std::atomic<size_t> layout_cache_capacity{16};
  // A cached layout's lease pins every block freed in the volume after it was
  // taken (the daemon's reclaim gate), so it is renewed after this long.
  std::atomic<uint64_t> lease_ms{10000};
  std::atomic<unsigned> checksum_threads{spillfs::client::DefaultChecksumThreads()};

  // Workers for the checksums of spill_write and spill_read, made at first
  // use and anew when checksum_threads changes (a call under way keeps its own).
  std::mutex pool_mu;
  std::shared_ptr<TaskPool> pool;

  // Backing store descriptors by path (O_DIRECT).
  std::mutex data_mu;
  std::map<std::string, int> data_fds;

  // spill_read_rows' layouts, most recently used first.
  std::mutex cache_mu;
  std::list<std::shared_ptr<Layout>> cache;
  uint64_t next_generation = 1;

  // The three mutexes above are held across fork(): a child's copies of the
  // pool, the descriptor map and the layout list are whole.
  spillfs::client::ForkGuard fork_guard{&pool_mu, &data_mu, &cache_mu};

  // Counters.
  std::atomic<uint64_t> bytes_written{0}, bytes_read{0}, ios{0}, layouts{0}, cache_hits{0}, checksum_errors{0};

  // The process the state below belongs to (see AdoptAfterFork).
  std::atomic<pid_t> owner{getpid()};

  ~spill_client();

  // The life of the handle (client.cc).
  void AdoptAfterFork();
  int Normalize(const char* path, std::string* out) const;
  std::string MountPath(const std::string& rel) const { return mountpoint + rel; }
  int DataFd(const std::string& path, int* fd);
  std::shared_ptr<TaskPool> Pool();
  int OpenChannel(std::unique_ptr<ControlChannel>* out) const { return ControlChannel::Open(control_path, out); }

  // Layouts (client_layout.cc).
  int FetchLayout(std::unique_ptr<ControlChannel> lease, const std::string& rel, std::shared_ptr<Layout>* out);
  static int FromDom(const json& result, const std::string& rel, LayoutReply* reply);
  int Verify(const Layout& layout, const Extent& x, uint64_t file_at, const char* data, uint64_t length);
  int CachedLayout(const std::string& rel, bool force, std::shared_ptr<Layout>* out);
  int Forget(const char* path);

  // Reads (client_read.cc).
  int ReadRange(const Layout& layout, char* out, uint64_t offset, uint64_t n);
  int64_t Read(const char* path, void* buf, size_t len, uint64_t offset);
  int ReadRowsWith(const Layout& layout, uint64_t row_bytes, const uint64_t* rows, size_t n, char* out);
  int ReadRows(const char* path, uint64_t row_bytes, const uint64_t* rows, size_t n, void* out);

  // Writes (client_write.cc).
  // Space reserved for one step of a write, or why there is none.
  struct Reservation {
    int rc = 0;
    std::string message;
    std::vector<std::pair<uint64_t, uint64_t>> space;  // physical offset, length
    int fd = -1;
  };
  int Write(const char* path, const void* buf, size_t len);
  // `units`: file offset, low and high hash of whole dedup units written
  // (spill_file writes; they may become blobs), flat, by increasing offset;
  // null for none. Sent in the compact form (AppendUnitList).
  // `ranges`: file offset and length of each file range the reserved space
  // goes to, back to back, flat (then `file_offset` is not sent); null or
  // empty: all of it at `file_offset`.
  static std::string CommitText(const std::string& rel, uint64_t file_offset, uint64_t length, uint64_t size,
                                const std::vector<uint32_t>& sums, const std::vector<uint64_t>* units = nullptr,
                                const std::vector<uint64_t>* ranges = nullptr);
  int Reserve(ControlChannel* txn, const std::string& rel, uint64_t reserve_len,
              std::vector<std::pair<uint64_t, uint64_t>>* space, int* fd);
  Reservation ReserveStep(ControlChannel* txn, const std::string& rel, uint64_t reserve_len);
  Reservation CommitStep(ControlChannel* txn, const std::string& rel, uint64_t pos, uint64_t length, uint64_t size,
                         const std::vector<uint32_t>& sums, uint64_t next_len,
                         const std::vector<uint64_t>* units = nullptr, const std::vector<uint64_t>* ranges = nullptr);
  void HashStep(TaskPool* pool, const char* base, uint64_t data_len, std::vector<uint32_t>* sums, Latch* latch);
  int WriteOpen(const std::string& rel, const char* src, size_t len);
  int WriteStep(const std::string& rel, const Reservation& r, const char* base, uint64_t data_len, uint64_t reserve_len,
                uint64_t chunk);
};
