// The spillfs client library: C ABI over the direct data path.
#include "spillfs/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "control.h"
#include "error.h"
#include "fork_guard.h"
#include "io_ring.h"
#include "layout_reply.h"
#include "spillfs/kvindex/block_checksum.h"
#include "task_pool.h"

using nlohmann::json;
using namespace spillfs::client;
using spillfs::BlockChecksum;

namespace {

constexpr const char* kFsType = "fuse.spillfs";

// Returned (negated) by the verifying readers for a checksum mismatch, so the
// caller can refresh the layout and try once more; never leaves the library.
constexpr int kChecksumMismatch = 100000;

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

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
         a.st_mtim.tv_nsec == b.st_mtim.tv_nsec && a.st_ctim.tv_sec == b.st_ctim.tv_sec &&
         a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// SPILLFS_CLIENT_TRACE=1: one line per phase of each call on stderr.
bool Tracing() {
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
unsigned DefaultChecksumThreads() { return std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u); }

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }
bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDirectAlignment == 0; }

template <typename T>
bool GetU64(const json& j, const char* key, T* out) {
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

}  // namespace

struct spill_client {
  std::string mountpoint;  // canonical
  std::string volume;      // the mount's source (volume directory)
  std::string control_path;
  std::unique_ptr<ControlChannel> control;
  uint64_t block_size = 4096;
  bool checksums = true;

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
  std::atomic<unsigned> checksum_threads{DefaultChecksumThreads()};

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
  ForkGuard fork_guard{&pool_mu, &data_mu, &cache_mu};

  // Counters.
  std::atomic<uint64_t> bytes_written{0}, bytes_read{0}, ios{0}, layouts{0}, cache_hits{0}, checksum_errors{0};

  // The process the state below belongs to (see AdoptAfterFork).
  std::atomic<pid_t> owner{getpid()};

  ~spill_client() {
    AdoptAfterFork();
    std::list<std::shared_ptr<Layout>> layouts;
    std::map<std::string, int> fds;
    {
      // Emptied under the locks (a fork by another thread now copies whole
      // containers), closed after them.
      std::scoped_lock lock(pool_mu, data_mu, cache_mu);
      layouts.splice(layouts.begin(), cache);
      fds.swap(data_fds);
    }
    for (auto& [path, fd] : fds) close(fd);
  }

  // Called first by every entry point. In a child after fork() (a PyTorch
  // DataLoader worker, say) only the forking thread exists: the pool's
  // workers are gone (a task queued there would never run, and joining them
  // never returns), and the control channels share their open files with the
  // parent, whose requests and replies would interleave with the child's.
  // So the child leaves all of that to the parent and starts afresh: no pool
  // yet (made at first use), no cached layouts (their leases stay the
  // parent's; the child opens its own channels as it goes). The backing store
  // descriptors are kept: positioned I/O shares nothing but the file. The
  // mutexes and what they guard came across whole (fork_guard), and the
  // adoption runs under them, so a fork by another thread of the child never
  // sees it half done. (The io_uring ring is per thread: io_ring.cc renews it.)
  void AdoptAfterFork() {
    const pid_t self = getpid();
    if (owner.load(std::memory_order_acquire) == self) return;
    std::shared_ptr<TaskPool> parents_pool;
    std::list<std::shared_ptr<Layout>> parents_layouts;
    std::unique_ptr<ControlChannel> parents_control;
    {
      std::scoped_lock lock(pool_mu, data_mu, cache_mu);
      if (owner.load(std::memory_order_acquire) == self) return;  // another thread adopted it
      parents_pool = std::move(pool);
      parents_layouts.splice(parents_layouts.begin(), cache);
      parents_control = std::move(control);  // used only by spill_client_open
      owner.store(self, std::memory_order_release);
    }
    // Left alone, never destroyed: ~TaskPool would join threads of the parent.
    if (parents_pool) new std::shared_ptr<TaskPool>(std::move(parents_pool));
    // parents_layouts and parents_control close this process's copies of the
    // lease descriptors only, outside the locks (a close is a FUSE round trip).
  }

  // "/a/b" for "a/b", "/a/b" or MOUNTPOINT "/a/b".
  int Normalize(const char* path, std::string* out) const {
    if (path == nullptr || *path == '\0') return Fail(EINVAL, "empty path");
    std::string p = path;
    if (p.size() > mountpoint.size() && p.compare(0, mountpoint.size(), mountpoint) == 0 &&
        p[mountpoint.size()] == '/') {
      p = p.substr(mountpoint.size());
    }
    if (p[0] != '/') p.insert(p.begin(), '/');
    *out = std::move(p);
    return 0;
  }
  std::string MountPath(const std::string& rel) const { return mountpoint + rel; }

  int DataFd(const std::string& path, int* fd) {
    std::lock_guard lock(data_mu);
    auto it = data_fds.find(path);
    if (it != data_fds.end()) {
      *fd = it->second;
      return 0;
    }
    int f = open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (f < 0) {
      int e = errno;
      return Fail(e, WithErrno("cannot open the backing store " + path + " with O_DIRECT", e));
    }
    data_fds.emplace(path, f);
    *fd = f;
    return 0;
  }

  // Threads are started and an old pool joined outside pool_mu: it is held
  // across fork() (fork_guard), so it is only ever held briefly.
  std::shared_ptr<TaskPool> Pool() {
    const unsigned threads = checksum_threads.load();
    {
      std::lock_guard lock(pool_mu);
      if (pool && pool->size() == threads) return pool;
    }
    auto fresh = std::make_shared<TaskPool>(threads);
    std::shared_ptr<TaskPool> old;  // joined when the last call using it is done, after the lock
    std::lock_guard lock(pool_mu);
    if (pool && pool->size() == threads) return pool;  // another thread made one meanwhile
    old = std::move(pool);
    pool = fresh;
    return pool;
  }

  int OpenChannel(std::unique_ptr<ControlChannel>* out) const { return ControlChannel::Open(control_path, out); }

  // Asks for the layout of `rel` on `lease` (which then holds it).
  int FetchLayout(std::unique_ptr<ControlChannel> lease, const std::string& rel, std::shared_ptr<Layout>* out) {
    const json request = {{"op", "layout"}, {"path", rel}};
    std::string text;
    int rc = lease->RequestText(request, &text);
    layouts.fetch_add(1, std::memory_order_relaxed);
    if (rc != 0) return rc;
    LayoutReply reply;
    if (!ParseLayoutReply(text, &reply)) {
      // An error reply (or a shape the fast reader does not know).
      json result;
      if ((rc = lease->ParseReply("layout", text, &result)) != 0) return rc;
      reply = LayoutReply();
      if ((rc = FromDom(result, rel, &reply)) != 0) return rc;
    }
    if (!reply.has_size || !reply.has_block_size || !reply.has_data_path || !reply.has_extents) {
      return Fail(EPROTO, "malformed layout reply for " + rel + ": " + text.substr(0, 200));
    }
    auto layout = std::make_shared<Layout>();
    layout->path = rel;
    layout->ino = reply.ino;
    layout->size = reply.size;
    layout->block_size = reply.block_size;
    const uint64_t bs = layout->block_size;
    if (bs == 0 || bs % kDirectAlignment != 0) {
      return Fail(EPROTO, "layout of " + rel + " has block size " + std::to_string(bs) +
                              " (the direct path needs a multiple of 4096)");
    }
    layout->extents.reserve(reply.extents.size());
    for (LayoutExtent& e : reply.extents) {
      Extent x;
      x.file_offset = e.file_offset;
      x.physical = e.physical_offset;
      x.length = e.length;
      x.unwritten = e.unwritten;
      const std::string where = "layout of " + rel + ": extent at file offset " + std::to_string(e.file_offset);
      if (!e.has_file_offset || !e.has_physical_offset || !e.has_length) {
        return Fail(EPROTO, "malformed extent in the " + where);
      }
      if (x.file_offset % bs != 0 || x.physical % bs != 0 || x.length == 0) {
        return Fail(EPROTO, "unaligned or empty extent in the " + where);
      }
      if (!e.block_checksums.empty()) {
        x.sums = std::move(e.block_checksums);
        if (x.sums.size() != RoundUp(x.length, bs) / bs) {
          return Fail(EPROTO, where + " has " + std::to_string(x.sums.size()) + " checksums for " +
                                  std::to_string(x.length) + " bytes");
        }
      }
      layout->extents.push_back(std::move(x));
    }
    std::sort(layout->extents.begin(), layout->extents.end(),
              [](const Extent& a, const Extent& b) { return a.file_offset < b.file_offset; });
    for (size_t i = 1; i < layout->extents.size(); ++i) {
      if (layout->extents[i].file_offset < layout->extents[i - 1].end()) {
        return Fail(EPROTO, "overlapping extents in the layout of " + rel);
      }
    }
    if ((rc = DataFd(reply.data_path, &layout->data_fd)) != 0) return rc;
    layout->lease = std::move(lease);
    *out = std::move(layout);
    return 0;
  }

  // The general parser's result as a LayoutReply.
  static int FromDom(const json& result, const std::string& rel, LayoutReply* reply) {
    if (!result.is_object()) return Fail(EPROTO, "malformed layout reply for " + rel);
    reply->has_size = GetU64(result, "size", &reply->size);
    reply->has_block_size = GetU64(result, "block_size", &reply->block_size);
    GetU64(result, "ino", &reply->ino);
    if (auto d = result.find("data_path"); d != result.end() && d->is_string()) {
      reply->data_path = d->get<std::string>();
      reply->has_data_path = true;
    }
    auto xs = result.find("extents");
    if (xs == result.end() || !xs->is_array()) return 0;
    reply->has_extents = true;
    for (const json& e : *xs) {
      LayoutExtent x;
      if (!e.is_object()) return Fail(EPROTO, "malformed extent in the layout of " + rel);
      x.has_file_offset = GetU64(e, "file_offset", &x.file_offset);
      x.has_physical_offset = GetU64(e, "physical_offset", &x.physical_offset);
      x.has_length = GetU64(e, "length", &x.length);
      if (auto u = e.find("unwritten"); u != e.end() && u->is_boolean()) x.unwritten = u->get<bool>();
      if (auto s = e.find("block_checksums"); s != e.end() && s->is_array()) {
        for (const json& v : *s) {
          if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX) {
            return Fail(EPROTO, "malformed checksum in the layout of " + rel);
          }
          x.block_checksums.push_back(v.get<uint32_t>());
        }
      }
      reply->extents.push_back(std::move(x));
    }
    return 0;
  }

  // Verifies the blocks of `data`, which holds the blocks of extent `x`
  // starting at file offset `file_at` (block aligned), `length` bytes.
  int Verify(const Layout& layout, const Extent& x, uint64_t file_at, const char* data, uint64_t length) {
    if (x.sums.empty() || !verify.load(std::memory_order_relaxed)) return 0;
    const uint64_t bs = layout.block_size;
    const uint64_t first = (file_at - x.file_offset) / bs;
    for (uint64_t b = 0; b * bs < length; ++b) {
      uint32_t got = BlockChecksum(data + b * bs, bs);
      uint32_t want = x.sums[first + b];
      if (got != want) {
        checksum_errors.fetch_add(1, std::memory_order_relaxed);
        Fail(EIO, "checksum mismatch in " + layout.path + " at file offset " + std::to_string(file_at + b * bs) +
                      " (backing store offset " + std::to_string(x.physical + file_at - x.file_offset + b * bs) +
                      "): expected " + std::to_string(want) + ", read " + std::to_string(got));
        return -kChecksumMismatch;
      }
    }
    return 0;
  }

  // ---- spill_read ----

  // Reads [offset, offset + n) (within the file) into out.
  int ReadRange(const Layout& layout, char* out, uint64_t offset, uint64_t n) {
    const uint64_t bs = layout.block_size;
    const uint64_t end = offset + n;
    const uint64_t chunk = std::max<uint64_t>(bs, RoundDown(io_bytes.load(), bs));
    struct Piece {
      const Extent* x;
      uint64_t file_at;  // block aligned
    };
    std::vector<Piece> pieces;
    std::vector<IoOp> ops;
    uint64_t cursor = offset;  // zero-filled or planned up to here
    auto zero = [&](uint64_t from, uint64_t to) {
      if (to > from) std::memset(out + (from - offset), 0, to - from);
    };
    auto it = std::upper_bound(layout.extents.begin(), layout.extents.end(), offset,
                               [](uint64_t v, const Extent& x) { return v < x.end(); });
    for (; it != layout.extents.end() && it->file_offset < end; ++it) {
      const Extent& x = *it;
      uint64_t a = std::max(offset, x.file_offset);
      uint64_t b = std::min(end, x.end());
      zero(cursor, a);
      cursor = b;
      if (x.unwritten) {
        zero(a, b);
        continue;
      }
      for (uint64_t at = RoundDown(a, bs); at < b; at += chunk) {
        uint64_t stop = std::min(at + chunk, RoundUp(b, bs));
        IoOp op;
        op.fd = layout.data_fd;
        op.offset = x.physical + (at - x.file_offset);
        op.length = static_cast<uint32_t>(stop - at);
        op.tag = pieces.size();
        char* dst = out + (at - offset);
        if (at >= offset && stop <= end && Aligned(dst)) op.buffer = dst;
        pieces.push_back(Piece{&x, at});
        ops.push_back(op);
      }
    }
    zero(cursor, end);
    IoDone done = [&](const IoOp& op, const char* data) -> int {
      const Piece& p = pieces[op.tag];
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

  int64_t Read(const char* path, void* buf, size_t len, uint64_t offset) {
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

  // ---- spill_write ----

  int Write(const char* path, const void* buf, size_t len) {
    std::string rel;
    int rc = Normalize(path, &rel);
    if (rc != 0) return rc;
    if (len > 0 && buf == nullptr) return Fail(EFAULT, "null buffer");
    const std::string file_path = MountPath(rel);
    int file = open(file_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (file < 0) {
      int e = errno;
      return Fail(e, WithErrno("cannot create " + file_path, e));
    }
    rc = WriteOpen(rel, static_cast<const char*>(buf), len);
    if (close(file) != 0 && rc == 0) {
      int e = errno;
      rc = Fail(e, WithErrno("close of " + file_path, e));
    }
    return rc;
  }

  // The commit request, serialized by hand: a 1 GiB step carries 262144
  // checksums, which a JSON DOM takes tens of milliseconds to build.
  static std::string CommitText(const std::string& rel, uint64_t file_offset, uint64_t length, uint64_t size,
                                const std::vector<uint32_t>& sums) {
    std::string text = R"({"op":"commit","path":)" + json(rel).dump() + R"(,"file_offset":)" +
                       std::to_string(file_offset) + R"(,"length":)" + std::to_string(length) + R"(,"size":)" +
                       std::to_string(size) + R"(,"block_checksums":[)";
    text.reserve(text.size() + sums.size() * 11 + 2);
    char num[16];
    for (size_t i = 0; i < sums.size(); ++i) {
      if (i > 0) text.push_back(',');
      auto [end, ec] = std::to_chars(num, num + sizeof(num), sums[i]);
      text.append(num, end);
    }
    text += "]}";
    return text;
  }

  // Reserves `reserve_len` bytes on `txn`; fills *space and *fd.
  int Reserve(ControlChannel* txn, const std::string& rel, uint64_t reserve_len,
              std::vector<std::pair<uint64_t, uint64_t>>* space, int* fd) {
    Phase phase("reserve", rel, reserve_len);
    const uint64_t bs = block_size;
    json reply;
    int rc = txn->Request(json{{"op", "reserve"}, {"length", reserve_len}}, &reply);
    if (rc != 0) return rc;
    if (!reply.is_object() || !reply.contains("extents") || !reply["extents"].is_array() ||
        !reply.contains("data_path") || !reply["data_path"].is_string()) {
      return Fail(EPROTO, "malformed reserve reply: " + reply.dump().substr(0, 200));
    }
    uint64_t reply_bs = bs;
    GetU64(reply, "block_size", &reply_bs);
    if (reply_bs != bs) return Fail(EPROTO, "reserve reply has another block size");
    uint64_t reserved = 0;
    for (const json& e : reply["extents"]) {
      uint64_t off = 0, n = 0;
      if (!e.is_object() || !GetU64(e, "physical_offset", &off) || !GetU64(e, "length", &n) || off % bs != 0 ||
          n % bs != 0 || n == 0) {
        return Fail(EPROTO, "malformed reserved extent: " + e.dump());
      }
      space->emplace_back(off, n);
      reserved += n;
    }
    if (reserved != reserve_len) {
      return Fail(EPROTO,
                  "asked to reserve " + std::to_string(reserve_len) + " bytes, got " + std::to_string(reserved));
    }
    return DataFd(reply["data_path"].get<std::string>(), fd);
  }

  // Space reserved for one step of a write, or why there is none.
  struct Reservation {
    int rc = 0;
    std::string message;
    std::vector<std::pair<uint64_t, uint64_t>> space;  // physical offset, length
    int fd = -1;
  };

  Reservation ReserveStep(ControlChannel* txn, const std::string& rel, uint64_t reserve_len) {
    Reservation r;
    r.rc = Reserve(txn, rel, reserve_len, &r.space, &r.fd);
    if (r.rc != 0) r.message = LastError();
    return r;
  }

  // Commits the step written at file offset `pos` on `txn` (which reserved
  // it), then reserves the next step of `txn` (`next_len` bytes; none if 0).
  Reservation CommitStep(ControlChannel* txn, const std::string& rel, uint64_t pos, uint64_t length, uint64_t size,
                         const std::vector<uint32_t>& sums, uint64_t next_len) {
    {
      Phase phase("commit", rel, length);
      std::string reply;
      json result;
      Reservation r;
      r.rc = txn->RequestText(CommitText(rel, pos, length, size, sums), "commit", &reply);
      if (r.rc == 0) r.rc = txn->ParseReply("commit", reply, &result);
      if (r.rc != 0) {
        r.message = LastError();
        return r;
      }
    }
    return next_len == 0 ? Reservation() : ReserveStep(txn, rel, next_len);
  }

  // Queues the block checksums of a step on the pool: `data_len` bytes at
  // `base`, zero padded to `sums->size()` blocks (the bytes the store gets).
  void HashStep(TaskPool* pool, const char* base, uint64_t data_len, std::vector<uint32_t>* sums, Latch* latch) {
    const uint64_t bs = block_size;
    const uint64_t per_task = std::max<uint64_t>(1, (1u << 20) / bs);  // blocks
    for (uint64_t first = 0; first < sums->size(); first += per_task) {
      const uint64_t last = std::min<uint64_t>(sums->size(), first + per_task);
      latch->Add();
      pool->Submit([=] {
        for (uint64_t b = first; b < last; ++b) {
          const uint64_t at = b * bs;
          if (at + bs <= data_len) {
            (*sums)[b] = BlockChecksum(base + at, bs);
          } else {  // the tail block
            std::vector<char> block(bs, 0);
            std::memcpy(block.data(), base + at, data_len - at);
            (*sums)[b] = BlockChecksum(block.data(), bs);
          }
        }
        latch->Done(0);
      });
    }
  }

  // Writes the file in steps of commit_bytes: reserve, write at queue depth,
  // commit. Steps alternate between two control handles, since a handle
  // commits exactly what it has reserved; while step k is written, a helper
  // thread commits step k-1 on the other handle and reserves step k+1 there,
  // so no round trip to the daemon stands between two steps' writes. The
  // checksums are taken on the pool while the bytes are written.
  int WriteOpen(const std::string& rel, const char* src, size_t len) {
    if (len == 0) return 0;
    const uint64_t bs = block_size;
    const uint64_t step = std::max<uint64_t>(bs, RoundDown(commit_bytes.load(), bs));
    const uint64_t chunk = std::max<uint64_t>(bs, RoundDown(io_bytes.load(), bs));
    const uint64_t steps = (len + step - 1) / step;
    auto step_len = [&](uint64_t k) -> uint64_t {  // reserved bytes of step k (0: none)
      return k < steps ? RoundUp(std::min<uint64_t>(step, len - k * step), bs) : 0;
    };
    std::unique_ptr<ControlChannel> txn[2];  // hold the reservations; closing drops them
    int rc = OpenChannel(&txn[0]);
    if (rc != 0) return rc;
    if (steps > 1 && (rc = OpenChannel(&txn[1])) != 0) return rc;
    std::shared_ptr<TaskPool> pool = Pool();

    // pending[i]: handle i's helper work, whose result is its next step's space.
    std::future<Reservation> pending[2];
    auto settle = [&](int i, Reservation* out) -> int {
      Reservation r = pending[i].valid() ? pending[i].get() : Reservation();
      if (r.rc != 0) return Fail(-r.rc, r.message);
      if (out != nullptr) *out = std::move(r);
      return 0;
    };
    // Waits for both helpers; the first error (and its message, which a
    // later one would overwrite) is the one reported.
    auto settle_all = [&](int first_rc) {
      std::string message = LastError();
      int rc = first_rc;
      for (int i : {0, 1}) {
        int r = settle(i, nullptr);
        if (rc == 0 && r != 0) {
          rc = r;
          message = LastError();
        }
      }
      return rc == 0 ? 0 : Fail(-rc, message);
    };

    Reservation current = ReserveStep(txn[0].get(), rel, step_len(0));
    if (current.rc != 0) return Fail(-current.rc, current.message);
    if (steps > 1) {
      ControlChannel* other = txn[1].get();
      const uint64_t n = step_len(1);
      pending[1] = std::async(std::launch::async, [=, this] { return ReserveStep(other, rel, n); });
    }
    for (uint64_t k = 0; k < steps; ++k) {
      const int slot = static_cast<int>(k % 2);
      if (k > 0 && (rc = settle(slot, &current)) != 0) return settle_all(rc);
      const uint64_t pos = k * step;
      const uint64_t data_len = std::min<uint64_t>(step, len - pos);
      const uint64_t reserve_len = step_len(k);
      const char* base = src + pos;  // data of this step: [0, data_len)
      auto sums = std::make_shared<std::vector<uint32_t>>(reserve_len / bs);
      Latch hashed;
      if (checksums) HashStep(pool.get(), base, data_len, sums.get(), &hashed);  // else unused
      rc = WriteStep(rel, current, base, data_len, reserve_len, chunk);
      hashed.Wait();  // the tasks use this frame, even after an error
      if (rc != 0) return settle_all(rc);
      ControlChannel* channel = txn[slot].get();
      const uint64_t size = pos + data_len;
      const uint64_t next_len = step_len(k + 2);
      pending[slot] = std::async(
          std::launch::async, [=, this] { return CommitStep(channel, rel, pos, reserve_len, size, *sums, next_len); });
    }
    return settle_all(0);
  }

  // Writes one step's bytes (`data_len` at `base`, padded with zeros to
  // `reserve_len`) into the space of `r`, in I/Os of `chunk` bytes.
  int WriteStep(const std::string& rel, const Reservation& r, const char* base, uint64_t data_len, uint64_t reserve_len,
                uint64_t chunk) {
    std::vector<IoOp> ops;
    uint64_t at = 0;  // offset in this step
    for (auto [off, n] : r.space) {
      for (uint64_t done = 0; done < n; done += chunk) {
        IoOp op;
        op.fd = r.fd;
        op.write = true;
        op.offset = off + done;
        op.length = static_cast<uint32_t>(std::min(chunk, n - done));
        op.tag = at;
        if (at + op.length <= data_len && Aligned(base + at)) op.buffer = const_cast<char*>(base + at);
        ops.push_back(op);
        at += op.length;
      }
    }
    IoFill fill = [&](const IoOp& op, char* slot_buf) -> int {
      uint64_t have = std::min<uint64_t>(op.length, data_len - op.tag);
      std::memcpy(slot_buf, base + op.tag, have);
      if (have < op.length) std::memset(slot_buf + have, 0, op.length - have);
      return 0;
    };
    IoDone done = [&](const IoOp& op, const char*) -> int {
      bytes_written.fetch_add(op.length, std::memory_order_relaxed);
      return 0;
    };
    uint64_t completed = 0;
    int rc;
    {
      Phase phase("write", rel, reserve_len);
      rc = RunIo(ops, queue_depth.load(), static_cast<uint32_t>(chunk), fill, done, &completed);
    }
    ios.fetch_add(completed, std::memory_order_relaxed);
    return rc;
  }

  // ---- spill_read_rows ----

  // The cached layout of `rel`, refreshed when the file changed or `force`.
  int CachedLayout(const std::string& rel, bool force, std::shared_ptr<Layout>* out) {
    struct stat st;
    const std::string file_path = MountPath(rel);
    if (stat(file_path.c_str(), &st) != 0) {
      int e = errno;
      return Fail(e, WithErrno("cannot stat " + file_path, e));
    }
    // Layouts leaving the cache are destroyed (their lease descriptors closed:
    // a FUSE round trip) after cache_mu, which is held across fork().
    std::list<std::shared_ptr<Layout>> evicted;
    {
      std::lock_guard lock(cache_mu);
      for (auto it = cache.begin(); it != cache.end(); ++it) {
        if ((*it)->path != rel) continue;
        // Clamped: a huge lease_ms ("never renew") would overflow the clock's nanoseconds.
        const uint64_t max_age = std::min<uint64_t>(lease_ms.load(), uint64_t{1} << 40);
        const bool young =
            max_age == 0 || std::chrono::steady_clock::now() - (*it)->taken < std::chrono::milliseconds(max_age);
        if (!force && young && SameFile((*it)->st, st)) {
          cache_hits.fetch_add(1, std::memory_order_relaxed);
          *out = *it;
          cache.splice(cache.begin(), cache, it);
          return 0;
        }
        evicted.splice(evicted.end(), cache, it);  // stale: its lease goes when the last reader is done
        break;
      }
    }
    std::unique_ptr<ControlChannel> lease;
    int rc = OpenChannel(&lease);
    if (rc != 0) return rc;
    std::shared_ptr<Layout> layout;
    if ((rc = FetchLayout(std::move(lease), rel, &layout)) != 0) return rc;
    layout->st = st;  // taken before the layout: a change in between shows next time
    layout->taken = std::chrono::steady_clock::now();
    std::lock_guard lock(cache_mu);
    layout->generation = next_generation++;
    size_t capacity = layout_cache_capacity.load();
    if (capacity > 0) {
      for (auto it = cache.begin(); it != cache.end(); ++it) {
        if ((*it)->path == rel) {
          evicted.splice(evicted.end(), cache, it);
          break;
        }
      }
      cache.push_front(layout);
      while (cache.size() > capacity) evicted.splice(evicted.end(), cache, std::prev(cache.end()));
    }
    *out = std::move(layout);
    return 0;
  }

  int ReadRowsWith(const Layout& layout, uint64_t row_bytes, const uint64_t* rows, size_t n, char* out) {
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
      size_t i =
          a >= row_bytes
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

    struct Piece {
      const Extent* x;
      uint64_t file_at;
    };
    std::vector<Piece> pieces;
    std::vector<IoOp> ops;
    const auto& xs = layout.extents;
    for (auto [ra, rb] : runs) {
      uint64_t cursor = ra;
      auto it = std::upper_bound(xs.begin(), xs.end(), ra, [](uint64_t v, const Extent& x) { return v < x.end(); });
      for (; it != xs.end() && it->file_offset < rb; ++it) {
        const Extent& x = *it;
        uint64_t a = std::max(ra, x.file_offset);
        uint64_t b = std::min(rb, RoundUp(x.end(), bs));
        if (a > cursor) copy_rows(cursor, a, nullptr);  // a hole
        cursor = b;
        if (x.unwritten) {
          copy_rows(a, b, nullptr);
          continue;
        }
        for (uint64_t at = a; at < b; at += max_op) {
          IoOp op;
          op.fd = layout.data_fd;
          op.offset = x.physical + (at - x.file_offset);
          op.length = static_cast<uint32_t>(std::min(max_op, b - at));
          op.tag = pieces.size();
          pieces.push_back(Piece{&x, at});
          ops.push_back(op);
        }
      }
      if (cursor < rb) copy_rows(cursor, rb, nullptr);
    }
    IoDone done = [&](const IoOp& op, const char* data) -> int {
      const Piece& p = pieces[op.tag];
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

  int ReadRows(const char* path, uint64_t row_bytes, const uint64_t* rows, size_t n, void* out) {
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

  int Forget(const char* path) {
    std::string rel;
    if (path != nullptr) {
      int rc = Normalize(path, &rel);
      if (rc != 0) return rc;
    }
    std::list<std::shared_ptr<Layout>> dropped;  // destroyed after the lock
    std::lock_guard lock(cache_mu);
    for (auto it = cache.begin(); it != cache.end();) {
      auto next = std::next(it);
      if (path == nullptr || (*it)->path == rel) dropped.splice(dropped.end(), cache, it);
      it = next;
    }
    return 0;
  }
};

// ---- the C ABI ----

extern "C" {

spill_client* spill_client_open(const char* mountpoint) {
  ClearError();
  if (mountpoint == nullptr || *mountpoint == '\0') {
    Fail(EINVAL, "empty mountpoint");
    errno = EINVAL;
    return nullptr;
  }
  char* real = realpath(mountpoint, nullptr);
  if (real == nullptr) {
    int e = errno;
    Fail(e, WithErrno(std::string("cannot resolve ") + mountpoint, e));
    errno = e;
    return nullptr;
  }
  std::string canonical = real;
  free(real);
  auto mount = FindMount(canonical);
  auto fail = [](int rc) -> spill_client* {
    errno = -rc;
    return nullptr;
  };
  if (!mount) return fail(Fail(EINVAL, canonical + " is not a mount point"));
  if (mount->fstype != kFsType) {
    return fail(Fail(EINVAL, canonical + " is not a spillfs mount (" + mount->fstype + ")"));
  }
  auto client = std::make_unique<spill_client>();
  client->mountpoint = canonical;
  client->volume = mount->source;
  client->control_path = canonical + "/.spillfs/control";
  int rc = client->OpenChannel(&client->control);
  if (rc != 0) return fail(rc);
  json info;
  if ((rc = client->control->Request(json{{"op", "stat"}}, &info)) != 0) return fail(rc);
  if (!info.is_object() || !GetU64(info, "block_size", &client->block_size)) {
    return fail(Fail(EPROTO, "malformed stat reply from " + client->control_path));
  }
  if (client->block_size == 0 || client->block_size % kDirectAlignment != 0) {
    return fail(Fail(ENOTSUP, "block size " + std::to_string(client->block_size) + " is not a multiple of 4096"));
  }
  if (auto c = info.find("checksums"); c != info.end() && c->is_boolean()) {
    client->checksums = c->get<bool>();
  }
  // An image volume keeps its data in VOLUME/data.img; open it now, so a
  // process that may not is told at once. (A device volume's store is opened
  // at the first layout or reservation, which name it.)
  std::string image = client->volume + "/data.img";
  struct stat st;
  if (stat(image.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    int fd;
    if ((rc = client->DataFd(image, &fd)) != 0) return fail(rc);
  }
  return client.release();
}

int spill_client_close(spill_client* client) {
  ClearError();
  delete client;
  return 0;
}

int spill_client_set(spill_client* client, const char* key, uint64_t value) {
  ClearError();
  if (client == nullptr || key == nullptr) return Fail(EINVAL, "null handle or key");
  client->AdoptAfterFork();
  std::string k = key;
  if (k == "queue_depth" || k == "rows_queue_depth") {
    if (value < 1 || value > kMaxQueueDepth) {
      return Fail(EINVAL, k + " must be 1.." + std::to_string(kMaxQueueDepth));
    }
    (k == "queue_depth" ? client->queue_depth : client->rows_queue_depth) = static_cast<unsigned>(value);
  } else if (k == "io_bytes" || k == "rows_io_bytes") {
    if (value < client->block_size || value % client->block_size != 0 || value > (64u << 20)) {
      return Fail(EINVAL, k + " must be a multiple of the block size, at most 64 MiB");
    }
    (k == "io_bytes" ? client->io_bytes : client->rows_io_bytes) = static_cast<uint32_t>(value);
  } else if (k == "commit_bytes") {
    // A commit carries one checksum per block in a request of at most 16 MiB.
    if (value < client->block_size || value % client->block_size != 0 || value > (4ull << 30)) {
      return Fail(EINVAL, "commit_bytes must be a multiple of the block size, at most 4 GiB");
    }
    client->commit_bytes = value;
  } else if (k == "checksum_threads") {
    if (value > 64) return Fail(EINVAL, "checksum_threads must be 0..64");
    client->checksum_threads = static_cast<unsigned>(value);
  } else if (k == "lease_ms") {
    client->lease_ms = value;
  } else if (k == "verify") {
    client->verify = value != 0;
  } else if (k == "layout_cache") {
    client->layout_cache_capacity = static_cast<size_t>(value);
    std::list<std::shared_ptr<Layout>> dropped;  // destroyed after the lock
    std::lock_guard lock(client->cache_mu);
    auto& cache = client->cache;
    while (cache.size() > value) dropped.splice(dropped.end(), cache, std::prev(cache.end()));
  } else {
    return Fail(EINVAL, "unknown setting " + k);
  }
  return 0;
}

int spill_write(spill_client* client, const char* path, const void* buf, size_t len) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->Write(path, buf, len);
}

int64_t spill_read(spill_client* client, const char* path, void* buf, size_t len, uint64_t offset) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->Read(path, buf, len, offset);
}

int spill_read_rows(spill_client* client, const char* path, uint64_t row_bytes, const uint64_t* rows, size_t n,
                    void* out) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->ReadRows(path, row_bytes, rows, n, out);
}

int spill_forget(spill_client* client, const char* path) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->Forget(path);
}

int spill_client_get_stats(spill_client* client, spill_client_stats* stats) {
  ClearError();
  if (client == nullptr || stats == nullptr) return Fail(EINVAL, "null handle or stats");
  stats->bytes_written = client->bytes_written.load();
  stats->bytes_read = client->bytes_read.load();
  stats->ios = client->ios.load();
  stats->layouts = client->layouts.load();
  stats->layout_cache_hits = client->cache_hits.load();
  stats->checksum_errors = client->checksum_errors.load();
  return 0;
}

const char* spill_last_error(void) { return LastError().c_str(); }

}  // extern "C"
