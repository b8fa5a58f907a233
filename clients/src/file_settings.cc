#include "file_settings.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "error.h"
#include "fork_guard.h"
#include "io_ring.h"

namespace spillfs::client {
namespace {

constexpr uint64_t kUnit = 256 << 10;

// Two pools: the plain one, and a shareable one (its slabs in a memfd) for
// memory I/O, whose buffers the daemon maps. Each made at first use.
struct Pool {
  std::shared_ptr<spillfs::cuda::PinnedPool> pool;  // null: made at next use
  uint64_t bytes = 0, slab = 0;                     // what it was made for
  pid_t pid = 0;                                    // the process that made it
};
std::mutex g_pool_mu;
Pool g_pools[2];  // [shareable]
ForkGuard g_pool_guard{&g_pool_mu};

}  // namespace

FileSettings& Settings() {
  static FileSettings settings;
  return settings;
}

int SetSetting(const std::string& k, uint64_t value) {
  FileSettings& s = Settings();
  if (k == "pinned_bytes") {
    if (value == 0) return Fail(EINVAL, "pinned_bytes must be positive");
    s.pinned_bytes = value;  // at least one chunk is made in any case
  } else if (k == "chunk_bytes") {
    if (value < kUnit || value % kUnit != 0 || value > (256ull << 20)) {
      return Fail(EINVAL, "chunk_bytes must be a multiple of 256 KiB, at most 256 MiB");
    }
    s.chunk_bytes = value;
  } else if (k == "io_bytes") {
    if (value < kDirectAlignment || value % kDirectAlignment != 0 || value > (64ull << 20)) {
      return Fail(EINVAL, "io_bytes must be a multiple of 4096, at most 64 MiB");
    }
    s.io_bytes = value;
  } else if (k == "queue_depth") {
    if (value < 1 || value > kMaxQueueDepth)
      return Fail(EINVAL, "queue_depth must be 1.." + std::to_string(kMaxQueueDepth));
    s.queue_depth = static_cast<unsigned>(value);
  } else if (k == "commit_bytes") {
    // A commit carries one checksum per block in a request of at most 16 MiB.
    if (value < kUnit || value % kDirectAlignment != 0 || value > (4ull << 30)) {
      return Fail(EINVAL, "commit_bytes must be a multiple of 4096, 256 KiB to 4 GiB");
    }
    s.commit_bytes = value;
  } else if (k == "commit_depth") {
    if (value < 1 || value > 8) return Fail(EINVAL, "commit_depth must be 1..8");
    s.commit_depth = static_cast<unsigned>(value);
  } else if (k == "direct_path") {
    s.direct_path = value != 0;
  } else if (k == "o_direct") {
    s.o_direct = value != 0;
  } else if (k == "verify") {
    s.verify = value != 0;
  } else if (k == "unit_hashes") {
    s.unit_hashes = value != 0;
  } else if (k == "device_hashes") {
    s.device_hashes = value != 0;
  } else if (k == "hash_threads") {
    if (value > 64) return Fail(EINVAL, "hash_threads must be 0..64");
    s.hash_threads = static_cast<unsigned>(value);
  } else {
    return Fail(EINVAL, "unknown setting " + k);
  }
  return 0;
}

int StagingPool(bool shareable, std::shared_ptr<spillfs::cuda::PinnedPool>* out, uint64_t* chunk_bytes) {
  const uint64_t slab = Settings().chunk_bytes.load();
  const uint64_t bytes = std::max(Settings().pinned_bytes.load(), slab);
  std::lock_guard lock(g_pool_mu);
  Pool& p = g_pools[shareable ? 1 : 0];
  if (p.pool && p.pid != getpid() && shareable) {
    // A forked child: the parent's shareable slabs are MAP_SHARED, so the
    // child's buffers would be the parent's. Left alone (its state is the
    // parent's at the fork, buffers of the parent's requests out), never
    // used again; the child makes its own.
    new std::shared_ptr<spillfs::cuda::PinnedPool>(std::move(p.pool));
  }
  // A pool made for other settings is dropped here; requests still using it
  // keep it until they end.
  if (!p.pool || p.bytes != bytes || p.slab != slab) {
    p.pool.reset();
    // Slabs of several chunks: pinning costs milliseconds a slab, so fewer,
    // larger ones (64 MiB) start the first request sooner.
    const uint64_t alloc = std::max(slab, std::min(bytes, uint64_t{64} << 20) / slab * slab);
    if (shareable) {
      p.pool = spillfs::cuda::PinnedPool::Shareable(bytes, alloc);
      if (!p.pool) {
        const int e = errno;
        return Fail(e, WithErrno("cannot make the staging memory shared with the daemon (memfd)", e));
      }
    } else {
      p.pool = std::make_shared<spillfs::cuda::PinnedPool>(bytes, alloc);
    }
    p.bytes = bytes;
    p.slab = slab;
    p.pid = getpid();
  }
  *chunk_bytes = p.slab;
  *out = p.pool;
  return 0;
}

}  // namespace spillfs::client
