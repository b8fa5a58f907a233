// The C ABI of the GPU feature cache (spill_gpu_cache_*, spillfs/client.h)
// over spillfs::cuda::FeatureCache: what spillfs.gnn.FeatureStore(device=
// "cuda") drives. Errors become -errno with the message in spill_last_error.
// Threading: a cache is used by one thread at a time (the caller's lock).
#include <cerrno>
#include <memory>

#include "error.h"
#include "spillfs/client.h"
#include "spillfs/cuda/feature_cache.h"

using spillfs::client::ClearError;
using spillfs::client::Fail;

struct spill_gpu_cache {
  std::unique_ptr<spillfs::cuda::FeatureCache> cache;
};

namespace {

int Report(const spillfs::Status& s) { return s.ok() ? 0 : Fail(s.code(), s.message()); }

}  // namespace

extern "C" {

spill_gpu_cache* spill_gpu_cache_create(int32_t device, const spill_gpu_cache_shape* shape) {
  ClearError();
  if (shape == nullptr) {
    errno = EINVAL;
    Fail(EINVAL, "null shape");
    return nullptr;
  }
  spillfs::cuda::FeatureCacheShape s;
  s.row_bytes = shape->row_bytes;
  s.rows = shape->rows;
  s.rows_per_line = shape->rows_per_line;
  s.cache_lines = shape->cache_lines;
  s.hot_lines = shape->hot_lines;
  s.victim_lines = shape->victim_lines;
  s.staging_lines = shape->staging_lines;
  auto made = spillfs::cuda::FeatureCache::Create(device, s);
  if (!made.ok()) {
    errno = made.status().code();
    Report(made.status());
    return nullptr;
  }
  auto* out = new spill_gpu_cache;
  out->cache = std::move(made.value());
  return out;
}

int spill_gpu_cache_destroy(spill_gpu_cache* cache) {
  ClearError();
  delete cache;
  return 0;
}

void* spill_gpu_cache_host_buffer(spill_gpu_cache* cache, int which) {
  ClearError();
  if (cache == nullptr || which < 0 || which > 2) return nullptr;
  return cache->cache->host_buffer(static_cast<spillfs::cuda::FeatureCache::HostBuffer>(which));
}

int spill_gpu_cache_set_hot(spill_gpu_cache* cache, const int64_t* lines, size_t n) {
  ClearError();
  if (cache == nullptr) return Fail(EINVAL, "null cache");
  return Report(cache->cache->SetHot(lines, n));
}

int spill_gpu_cache_gather(spill_gpu_cache* cache, const int64_t* index, size_t n, void* out, uint32_t stamp,
                           uintptr_t stream, spill_gpu_gather_counts* counts) {
  ClearError();
  if (cache == nullptr || counts == nullptr) return Fail(EINVAL, "null cache or counts");
  spillfs::cuda::GatherCounts c;
  int rc = Report(cache->cache->Gather(index, n, out, stamp, stream, &c));
  counts->gpu_hits = c.gpu_hits;
  counts->hot_hits = c.hot_hits;
  counts->misses = c.misses;
  return rc;
}

int spill_gpu_cache_misses(spill_gpu_cache* cache, int64_t* rows, int64_t* positions, size_t n) {
  ClearError();
  if (cache == nullptr) return Fail(EINVAL, "null cache");
  return Report(cache->cache->Misses(rows, positions, n));
}

int spill_gpu_cache_stamps(spill_gpu_cache* cache, uint32_t* out) {
  ClearError();
  if (cache == nullptr) return Fail(EINVAL, "null cache");
  return Report(cache->cache->Stamps(out));
}

int spill_gpu_cache_fill(spill_gpu_cache* cache, const spill_gpu_fill* fill, void* out, uint32_t stamp,
                         uintptr_t stream) {
  ClearError();
  if (cache == nullptr || fill == nullptr) return Fail(EINVAL, "null cache or plan");
  spillfs::cuda::FillPlan p;
  p.n_evicted = fill->n_evicted;
  p.evicted_lines = fill->evicted_lines;
  p.evicted_slots = fill->evicted_slots;
  p.victim_slots = fill->victim_slots;
  p.n_staged = fill->n_staged;
  p.staged_lines = fill->staged_lines;
  p.install_slots = fill->install_slots;
  p.n_entries = fill->n_entries;
  p.entry_rows = fill->entry_rows;
  p.entry_positions = fill->entry_positions;
  p.entry_staged = fill->entry_staged;
  return Report(cache->cache->Fill(p, out, stamp, stream));
}

}  // extern "C"
