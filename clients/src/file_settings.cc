#include "file_settings.h"

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "error.h"
#include "io_ring.h"

namespace spillfs::client {
namespace {

constexpr uint64_t kUnit = 256 << 10;

std::mutex g_pool_mu;
std::shared_ptr<spillfs::cuda::PinnedPool> g_pool;  // null: made at next use
uint64_t g_pool_bytes = 0, g_pool_slab = 0;         // what g_pool was made for

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
  } else if (k == "hash_threads") {
    if (value > 64) return Fail(EINVAL, "hash_threads must be 0..64");
    s.hash_threads = static_cast<unsigned>(value);
  } else {
    return Fail(EINVAL, "unknown setting " + k);
  }
  return 0;
}

std::shared_ptr<spillfs::cuda::PinnedPool> StagingPool(uint64_t* chunk_bytes) {
  const uint64_t slab = Settings().chunk_bytes.load();
  const uint64_t bytes = std::max(Settings().pinned_bytes.load(), slab);
  std::lock_guard lock(g_pool_mu);
  // A pool made for other settings is dropped here; requests still using it
  // keep it until they end.
  if (!g_pool || g_pool_bytes != bytes || g_pool_slab != slab) {
    g_pool.reset();
    // Slabs of several chunks: pinning costs milliseconds a slab, so fewer,
    // larger ones (64 MiB) start the first request sooner.
    const uint64_t alloc = std::max(slab, std::min(bytes, uint64_t{64} << 20) / slab * slab);
    g_pool = std::make_shared<spillfs::cuda::PinnedPool>(bytes, alloc);
    g_pool_bytes = bytes;
    g_pool_slab = slab;
  }
  *chunk_bytes = g_pool_slab;
  return g_pool;
}

}  // namespace spillfs::client
