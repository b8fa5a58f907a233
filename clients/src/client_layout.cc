// spill_client: file layouts (fetched on a control handle that then holds
// the lease), their checksums, and the layout cache of spill_read_rows.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

#include "client_impl.h"
#include "error.h"
#include "spillfs/common/block_checksum.h"

using namespace spillfs::client;
using spillfs::RoundDown;
using spillfs::RoundUp;
using spillfs::BlockChecksum;

// Asks for the layout of `rel` on `lease` (which then holds it).
int spill_client::FetchLayout(std::unique_ptr<ControlChannel> lease, const std::string& rel,
                              std::shared_ptr<Layout>* out) {
  const json request = {{spillfs::control::key::kOp, spillfs::control::op::kLayout}, {"path", rel}};
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
int spill_client::FromDom(const json& result, const std::string& rel, LayoutReply* reply) {
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
int spill_client::Verify(const Layout& layout, const Extent& x, uint64_t file_at, const char* data, uint64_t length) {
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

// The cached layout of `rel`, refreshed when the file changed or `force`.
int spill_client::CachedLayout(const std::string& rel, bool force, std::shared_ptr<Layout>* out) {
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

int spill_client::Forget(const char* path) {
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
