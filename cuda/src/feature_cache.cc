// FeatureCache (spillfs/cuda/feature_cache.h): memory, the request ring and
// the order of the kernels (feature_kernels.cu). Without CUDA, Create
// answers ENOTSUP and nothing else can be reached.
#include "spillfs/cuda/feature_cache.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#if SPILLFS_HAVE_CUDA
#include "cuda_util.h"
#include "feature_launch.h"
#endif

namespace spillfs::cuda {

#if SPILLFS_HAVE_CUDA

namespace {

cudaStream_t AsStream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Pinned, GPU-mapped host memory and its device alias.
struct Mapped {
  char* host = nullptr;
  char* device = nullptr;
  size_t bytes = 0;

  Status Allocate(size_t n) {
    Free();
    if (n == 0) return Status::OK();
    void* p = nullptr;
    SPILLFS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable));
    host = static_cast<char*>(p);
    bytes = n;
    void* d = nullptr;
    Status s = CudaStatus(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer");
    if (!s.ok()) {
      Free();
      return s;
    }
    device = static_cast<char*>(d);
    return Status::OK();
  }
  void Free() {
    if (host != nullptr) cudaFreeHost(host);
    host = device = nullptr;
    bytes = 0;
  }
};

template <typename T>
Status DeviceAlloc(T** out, size_t count) {
  *out = nullptr;
  if (count == 0) return Status::OK();
  void* p = nullptr;
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, count * sizeof(T)));
  *out = static_cast<T*>(p);
  return Status::OK();
}

}  // namespace

struct FeatureCache::Impl {
  char* lines = nullptr;            // cache_lines x line_bytes
  int32_t* slot_of_line = nullptr;  // lines(), -1: absent
  int32_t* hot_slot_of_line = nullptr;
  uint32_t* stamps = nullptr;              // cache_lines
  unsigned long long* counters = nullptr;  // device, internal::kGatherCounters (idle between gathers)
  char* staging_device = nullptr;          // staging_lines x line_bytes
  Mapped hot, victim, ring, args;
  Mapped counts;                 // internal::kGatherReported, written by the gather kernel
  char* staging_host = nullptr;  // pinned (not mapped)
  size_t ring_capacity = 0;      // entries
  int sm_count = 1;
  size_t last_misses = 0;

  ~Impl() {
    cudaFree(lines);
    cudaFree(slot_of_line);
    cudaFree(hot_slot_of_line);
    cudaFree(stamps);
    cudaFree(counters);
    cudaFree(staging_device);
    if (staging_host != nullptr) cudaFreeHost(staging_host);
    hot.Free();
    victim.Free();
    ring.Free();
    args.Free();
    counts.Free();
  }
};

FeatureCache::FeatureCache(int device, const FeatureCacheShape& shape, std::unique_ptr<Impl> impl)
    : device_(device), shape_(shape), impl_(std::move(impl)) {}

FeatureCache::~FeatureCache() {
  DeviceGuard guard(device_);
  cudaDeviceSynchronize();
  impl_.reset();
}

Result<std::unique_ptr<FeatureCache>> FeatureCache::Create(int device, const FeatureCacheShape& shape) {
  if (shape.row_bytes == 0 || shape.rows_per_line == 0) return Status::Invalid("row_bytes and rows_per_line > 0");
  if (shape.lines() > static_cast<uint64_t>(INT32_MAX) || shape.cache_lines > static_cast<uint64_t>(INT32_MAX)) {
    return Status::Invalid("more than 2^31 lines");
  }
  if (shape.staging_lines == 0) return Status::Invalid("staging_lines must be positive");
  // The gather kernel counts a warp step's words in 32 bits.
  if (shape.row_bytes > (uint64_t{1} << 26)) return Status::Invalid("rows of more than 64 MiB");
  DeviceGuard guard(device);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  auto impl = std::make_unique<Impl>();
  const size_t lb = shape.line_bytes();
  const size_t n_lines = shape.lines();
  SPILLFS_RETURN_IF_ERROR(DeviceAlloc(&impl->lines, shape.cache_lines * lb));
  SPILLFS_RETURN_IF_ERROR(DeviceAlloc(&impl->slot_of_line, n_lines));
  SPILLFS_RETURN_IF_ERROR(DeviceAlloc(&impl->hot_slot_of_line, n_lines));
  SPILLFS_RETURN_IF_ERROR(DeviceAlloc(&impl->stamps, shape.cache_lines));
  SPILLFS_RETURN_IF_ERROR(DeviceAlloc(&impl->counters, internal::kGatherCounters));
  SPILLFS_RETURN_IF_ERROR(DeviceAlloc(&impl->staging_device, shape.staging_lines * lb));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemset(impl->slot_of_line, 0xff, n_lines * sizeof(int32_t)));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemset(impl->hot_slot_of_line, 0xff, n_lines * sizeof(int32_t)));
  if (shape.cache_lines) SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemset(impl->stamps, 0, shape.cache_lines * 4));
  void* staging = nullptr;
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&staging, shape.staging_lines * lb, cudaHostAllocPortable));
  impl->staging_host = static_cast<char*>(staging);
  SPILLFS_RETURN_IF_ERROR(impl->hot.Allocate(shape.hot_lines * lb));
  SPILLFS_RETURN_IF_ERROR(impl->victim.Allocate(shape.victim_lines * lb));
  SPILLFS_RETURN_IF_ERROR(impl->counts.Allocate(internal::kGatherReported * sizeof(unsigned long long)));
  SPILLFS_RETURN_IF_ERROR(internal::ResetGatherCounters(impl->counters, 0));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&impl->sm_count, cudaDevAttrMultiProcessorCount, device));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return std::unique_ptr<FeatureCache>(new FeatureCache(device, shape, std::move(impl)));
}

char* FeatureCache::host_buffer(HostBuffer which) const {
  switch (which) {
    case kHot:
      return impl_->hot.host;
    case kVictim:
      return impl_->victim.host;
    case kStaging:
      return impl_->staging_host;
  }
  return nullptr;
}

Status FeatureCache::SetHot(const int64_t* lines, size_t n) {
  if (n > shape_.hot_lines) return Status::Invalid("more hot lines than the hot buffer holds");
  for (size_t i = 0; i < n; ++i) {
    if (lines[i] < 0 || static_cast<uint64_t>(lines[i]) >= shape_.lines())
      return Status::Invalid("hot line out of range");
  }
  DeviceGuard guard(device_);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemset(impl_->hot_slot_of_line, 0xff, shape_.lines() * sizeof(int32_t)));
  if (n == 0) return Status::OK();
  SPILLFS_RETURN_IF_ERROR(impl_->args.Allocate(n * sizeof(int64_t)));
  std::memcpy(impl_->args.host, lines, n * sizeof(int64_t));
  SPILLFS_RETURN_IF_ERROR(
      internal::LaunchSetSlots(impl_->hot_slot_of_line, reinterpret_cast<const int64_t*>(impl_->args.device), n, 0));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::OK();
}

Status FeatureCache::Gather(const int64_t* index, size_t n, void* out, uint32_t stamp, uintptr_t stream,
                            GatherCounts* counts) {
  *counts = GatherCounts{};
  impl_->last_misses = 0;
  if (n == 0) return Status::OK();
  if (index == nullptr || out == nullptr) return Status::Invalid("null index or output");
  DeviceGuard guard(device_);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  if (impl_->ring_capacity < n) {
    // Grown only between batches: the ring's last use has run (Gather waits).
    SPILLFS_RETURN_IF_ERROR(impl_->ring.Allocate(2 * n * sizeof(int64_t)));
    impl_->ring_capacity = n;
  }
  // One wait a gather: the kernel's last block writes the counts into mapped
  // memory and leaves the device counters idle (no memset, no copy).
  cudaStream_t s = AsStream(stream);
  internal::GatherLaunch a;
  a.g = {shape_.row_bytes, shape_.rows_per_line, shape_.line_bytes()};
  a.rows = shape_.rows;
  a.sm_count = impl_->sm_count;
  a.index = index;
  a.n = n;
  a.out = static_cast<char*>(out);
  a.lines = impl_->lines;
  a.slot_of_line = impl_->slot_of_line;
  a.hot_slot_of_line = shape_.hot_lines ? impl_->hot_slot_of_line : nullptr;
  a.hot = impl_->hot.device;
  a.stamps = impl_->stamps;
  a.stamp = stamp;
  a.counters = impl_->counters;
  a.report = reinterpret_cast<unsigned long long*>(impl_->counts.device);
  a.ring = reinterpret_cast<int64_t*>(impl_->ring.device);
  a.ring_capacity = impl_->ring_capacity;
  Status launched = internal::LaunchGather(a, stream);
  if (!launched.ok()) {
    (void)internal::ResetGatherCounters(impl_->counters, stream);  // the check may have run alone
    cudaStreamSynchronize(s);
    return launched;
  }
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  const auto* c = reinterpret_cast<const volatile unsigned long long*>(impl_->counts.host);
  const unsigned long long refused = c[internal::kFirstRefused];
  if (refused != internal::kNoPosition) {
    int64_t value = 0;
    SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemcpy(&value, index + refused, sizeof(value), cudaMemcpyDeviceToHost));
    return Status::Error(ERANGE, "index " + std::to_string(value) + " (position " + std::to_string(refused) +
                                     ") is out of range for " + std::to_string(shape_.rows) + " rows");
  }
  counts->gpu_hits = c[internal::kGpuHits];
  counts->hot_hits = c[internal::kHotHits];
  counts->misses = c[internal::kRingTail];
  impl_->last_misses = counts->misses;
  if (counts->misses > impl_->ring_capacity) return Status::Error(EIO, "request ring overflow");
  return Status::OK();
}

Status FeatureCache::Misses(int64_t* rows, int64_t* positions, size_t n) const {
  if (n > impl_->last_misses) return Status::Invalid("more ring entries asked than the last gather posted");
  const auto* ring = reinterpret_cast<const volatile int64_t*>(impl_->ring.host);
  for (size_t k = 0; k < n; ++k) {
    rows[k] = ring[2 * k];
    positions[k] = ring[2 * k + 1];
  }
  return Status::OK();
}

Status FeatureCache::Stamps(uint32_t* out) const {
  if (shape_.cache_lines == 0) return Status::OK();
  DeviceGuard guard(device_);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  SPILLFS_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out, impl_->stamps, shape_.cache_lines * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  return Status::OK();
}

Status FeatureCache::Fill(const FillPlan& plan, void* out, uint32_t stamp, uintptr_t stream) {
  if (plan.n_staged > shape_.staging_lines) return Status::Invalid("more staged lines than staging holds");
  if ((plan.n_evicted > 0 && (plan.evicted_lines == nullptr || plan.evicted_slots == nullptr)) ||
      (plan.n_staged > 0 && plan.staged_lines == nullptr) ||
      (plan.n_entries > 0 &&
       (plan.entry_rows == nullptr || plan.entry_positions == nullptr || plan.entry_staged == nullptr)) ||
      (plan.n_entries > 0 && out == nullptr)) {
    return Status::Invalid("a fill plan's array is missing");
  }
  const uint64_t n_lines = shape_.lines();
  for (size_t k = 0; k < plan.n_evicted; ++k) {
    if (plan.evicted_slots[k] < 0 || static_cast<uint64_t>(plan.evicted_slots[k]) >= shape_.cache_lines ||
        plan.evicted_lines[k] < 0 || static_cast<uint64_t>(plan.evicted_lines[k]) >= n_lines ||
        (plan.victim_slots != nullptr && plan.victim_slots[k] >= static_cast<int64_t>(shape_.victim_lines))) {
      return Status::Invalid("eviction out of range");
    }
  }
  for (size_t k = 0; k < plan.n_staged; ++k) {
    if ((plan.install_slots != nullptr && plan.install_slots[k] >= static_cast<int64_t>(shape_.cache_lines)) ||
        plan.staged_lines[k] < 0 || static_cast<uint64_t>(plan.staged_lines[k]) >= n_lines) {
      return Status::Invalid("install out of range");
    }
  }
  for (size_t k = 0; k < plan.n_entries; ++k) {
    if (plan.entry_staged[k] < 0 || static_cast<size_t>(plan.entry_staged[k]) >= plan.n_staged ||
        plan.entry_rows[k] < 0 || static_cast<uint64_t>(plan.entry_rows[k]) >= shape_.rows) {
      return Status::Invalid("ring entry out of range");
    }
  }
  DeviceGuard guard(device_);
  SPILLFS_RETURN_IF_ERROR(guard.status());
  // The plan's arrays in mapped memory, read by the kernels over PCIe.
  const size_t words = 3 * plan.n_evicted + 2 * plan.n_staged + 3 * plan.n_entries;
  if (impl_->args.bytes < words * sizeof(int64_t)) {
    SPILLFS_RETURN_IF_ERROR(impl_->args.Allocate(words * sizeof(int64_t) * 2));
  }
  auto* host = reinterpret_cast<int64_t*>(impl_->args.host);
  auto* dev = reinterpret_cast<int64_t*>(impl_->args.device);
  size_t at = 0;
  auto put = [&](const int64_t* src, size_t n) -> const int64_t* {
    if (src == nullptr || n == 0) return nullptr;
    std::memcpy(host + at, src, n * sizeof(int64_t));
    const int64_t* d = dev + at;
    at += n;
    return d;
  };
  internal::FillLaunch a;
  a.g = {shape_.row_bytes, shape_.rows_per_line, shape_.line_bytes()};
  a.plan = plan;  // the counts; each array by its device copy:
  a.plan.evicted_lines = put(plan.evicted_lines, plan.n_evicted);
  a.plan.evicted_slots = put(plan.evicted_slots, plan.n_evicted);
  a.plan.victim_slots = put(plan.victim_slots, plan.n_evicted);
  a.plan.staged_lines = put(plan.staged_lines, plan.n_staged);
  a.plan.install_slots = put(plan.install_slots, plan.n_staged);
  a.plan.entry_rows = put(plan.entry_rows, plan.n_entries);
  a.plan.entry_positions = put(plan.entry_positions, plan.n_entries);
  a.plan.entry_staged = put(plan.entry_staged, plan.n_entries);
  a.victim = impl_->victim.device;
  a.staging = impl_->staging_device;
  a.out = static_cast<char*>(out);
  a.lines = impl_->lines;
  a.slot_of_line = impl_->slot_of_line;
  a.stamps = impl_->stamps;
  a.stamp = stamp;
  if (a.plan.n_staged > 0 && a.plan.install_slots == nullptr) a.plan.n_staged = 0;  // nothing installed; scatter only
  cudaStream_t s = AsStream(stream);
  SPILLFS_RETURN_IF_ERROR(internal::LaunchEvict(a, stream));
  if (plan.n_staged > 0) {
    SPILLFS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(impl_->staging_device, impl_->staging_host,
                                                 plan.n_staged * shape_.line_bytes(), cudaMemcpyHostToDevice, s));
  }
  SPILLFS_RETURN_IF_ERROR(internal::LaunchScatterInstall(a, stream));
  SPILLFS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return Status::OK();
}

#else  // !SPILLFS_HAVE_CUDA

struct FeatureCache::Impl {};

namespace {
Status NoCuda() { return Status::Error(ENOTSUP, "spillfs was built without CUDA"); }
}  // namespace

FeatureCache::FeatureCache(int device, const FeatureCacheShape& shape, std::unique_ptr<Impl> impl)
    : device_(device), shape_(shape), impl_(std::move(impl)) {}
FeatureCache::~FeatureCache() = default;
Result<std::unique_ptr<FeatureCache>> FeatureCache::Create(int, const FeatureCacheShape&) { return NoCuda(); }
char* FeatureCache::host_buffer(HostBuffer) const { return nullptr; }
Status FeatureCache::SetHot(const int64_t*, size_t) { return NoCuda(); }
Status FeatureCache::Gather(const int64_t*, size_t, void*, uint32_t, uintptr_t, GatherCounts*) { return NoCuda(); }
Status FeatureCache::Misses(int64_t*, int64_t*, size_t) const { return NoCuda(); }
Status FeatureCache::Stamps(uint32_t*) const { return NoCuda(); }
Status FeatureCache::Fill(const FillPlan&, void*, uint32_t, uintptr_t) { return NoCuda(); }

#endif

}  // namespace spillfs::cuda
