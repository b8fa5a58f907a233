#include "spillfs/fuse/fuse_guard.h"

#include <linux/fuse.h>

#include <atomic>
#include <cstdio>

namespace spillfs {
namespace {

thread_local uint64_t t_replies = 0;

// Each kind is logged this many times, then counted in silence.
constexpr uint64_t kLoggedPerKind = 10;
std::atomic<uint64_t> out_of_memory{0};
std::atomic<uint64_t> other_exceptions{0};

}  // namespace

void NoteFuseWrite(const iovec* iov, int count) {
  if (count < 1 || iov[0].iov_len < sizeof(fuse_out_header)) return;
  if (static_cast<const fuse_out_header*>(iov[0].iov_base)->unique != 0) ++t_replies;
}

uint64_t FuseRepliesOnThisThread() { return t_replies; }

void LogEscapedException(const std::exception& e, int error) {
  std::atomic<uint64_t>& seen = error == ENOMEM ? out_of_memory : other_exceptions;
  const uint64_t n = seen.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n > kLoggedPerKind) return;
  // stdio with a fixed format: no allocation, which may be what failed.
  std::fprintf(stderr, "spillfs: a request threw %s (%s); answered %s, the mount goes on%s\n",
               error == ENOMEM ? "std::bad_alloc" : "an exception", e.what(), error == ENOMEM ? "ENOMEM" : "EIO",
               n == kLoggedPerKind ? " (no more of these are logged)" : "");
}

}  // namespace spillfs
