// The C ABI of segment files, unit hashing and the process-wide settings
// (spillfs/client.h). The work: file_impl.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "client_impl.h"
#include "error.h"
#include "file_impl.h"
#include "file_job.h"
#include "file_settings.h"
#include "spillfs/common/block_checksum.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/cuda/hash_kernels.h"
#include "spillfs/cuda/runtime.h"

#ifndef SPILLFS_VERSION
#error "SPILLFS_VERSION must be defined by the build"
#endif

namespace spillfs::client {

spill_file* OpenFile(const char* path, int flags, uint64_t size_hint);  // file_open.cc

namespace {

static_assert(sizeof(spillfs::cuda::Hash128) == 2 * sizeof(uint64_t), "Hash128 is (low, high)");

// Units of one dedup request: 32 hex digits each (and a few bytes a run of
// consecutive units), 2 MiB a batch, far below the control file's 16 MiB.
constexpr size_t kDedupBatch = 65536;

int Start(spill_file* file, const spill_segment* segments, size_t n, uintptr_t stream, spill_request** out,
          bool write) {
  if (file == nullptr || out == nullptr) return Fail(EINVAL, "null file or request pointer");
  *out = nullptr;
  const int need = write ? SPILL_FILE_WRITE : SPILL_FILE_READ;
  if ((file->flags & need) == 0) {
    return Fail(EBADF, file->path + " was not opened for " + (write ? "writing" : "reading"));
  }
  if (file->client) file->client->AdoptAfterFork();
  uint64_t chunk = 0;
  const bool memory_io = file->backend == Backend::kMemoryIo;
  std::shared_ptr<spillfs::cuda::PinnedPool> pool;
  if (int rc = StagingPool(memory_io, &pool, &chunk); rc != 0) return rc;
  Plan plan;
  if (int rc = MakePlan(segments, n, write, chunk, &plan); rc != 0) return rc;
  if (memory_io) {
    for (Piece& p : plan.pieces) p.direct = nullptr;  // the daemon sees only the staging memory
  }
  if (int rc = CheckDevices(plan); rc != 0) return rc;
  std::unique_ptr<SegmentJob> job = write ? MakeWriteJob(file, std::move(plan), std::move(pool), chunk, stream)
                                          : MakeReadJob(file, std::move(plan), std::move(pool), chunk, stream);
  if (int rc = job->Prepare(); rc != 0) return rc;
  if (write) file->Changed();
  auto request = std::make_unique<spill_request>();
  request->file = file;
  spill_request* r = request.get();
  file->requests_in_flight.fetch_add(1);
  try {
    request->worker = std::thread([r, write, job = std::move(job)] {
      r->rc = job->Run(&r->stats);
      if (r->rc != 0) r->message = LastError();
      if (write) r->file->Changed();  // a layout taken meanwhile may show the write half done
      r->file->requests_in_flight.fetch_sub(1);
    });
  } catch (const std::system_error& e) {
    file->requests_in_flight.fetch_sub(1);
    return Fail(EAGAIN, std::string("cannot start a thread for the request: ") + e.what());
  }
  *out = request.release();
  return 0;
}

// The control channel of `file` (opened at first use); 0 or -errno.
int FileControl(spill_file* file, ControlChannel** out) {
  std::lock_guard lock(file->control_mu);
  if (!file->control) {
    int rc = file->client ? file->client->OpenChannel(&file->control)
                          : ControlChannel::Open(spillfs::control::ControlPath(file->mountpoint), &file->control);
    if (rc != 0) return rc;
  }
  *out = file->control.get();
  return 0;
}

// The batches of Dedup, each one request; sets needed[i] and *mapped_end
// (past the last unit mapped).
template <typename UnitOffset>
int DedupBatches(spill_file* file, ControlChannel* control, size_t n_units, const UnitOffset& unit_offset,
                 const uint64_t* hashes, uint8_t* needed, uint64_t* mapped_end) {
  for (size_t first = 0; first < n_units; first += kDedupBatch) {
    const size_t count = std::min(kDedupBatch, n_units - first);
    std::string text = R"({"op":"dedup","path":)" + json(file->rel).dump();
    AppendUnitList(
        &text, count, [&](size_t i) { return unit_offset(first + i); },
        [&](size_t i) { return hashes + 2 * (first + i); });
    text += "}";
    std::string reply;
    json result;
    int rc = control->RequestText(std::move(text), "dedup", &reply);
    if (rc == 0) rc = control->ParseReply("dedup", reply, &result);
    if (rc != 0) return rc;
    // The compact form's reply: "needed" is a string, '1' or '0' a unit.
    auto it = result.find("needed");
    if (it == result.end() || !it->is_string() || it->get_ref<const std::string&>().size() != count) {
      return Fail(EPROTO, "malformed dedup reply: " + reply.substr(0, 200));
    }
    const std::string& flags = it->get_ref<const std::string&>();
    for (size_t i = 0; i < count; ++i) {
      if (flags[i] != '0' && flags[i] != '1') return Fail(EPROTO, "malformed dedup reply: " + reply.substr(0, 200));
      needed[first + i] = static_cast<uint8_t>(flags[i] - '0');
      if (needed[first + i] == 0) *mapped_end = std::max(*mapped_end, unit_offset(first + i) + kHashUnit);
    }
  }
  return 0;
}

// Checkpoint dedup of `n_units` units: at file_offsets[i] where given (a
// multiple of 256 KiB, strictly increasing), else consecutive from
// `file_offset`. One request (a batch of kDedupBatch units) for all.
int Dedup(spill_file* file, uint64_t file_offset, const uint64_t* file_offsets, const uint64_t* hashes, size_t n_units,
          uint8_t* needed) {
  if (file == nullptr) return Fail(EINVAL, "null file");
  if ((file->flags & SPILL_FILE_WRITE) == 0) return Fail(EBADF, file->path + " was not opened for writing");
  if (file->backend != Backend::kDirectPath && file->backend != Backend::kMount &&
      file->backend != Backend::kMemoryIo) {
    return Fail(EOPNOTSUPP, file->path + " is not on a spillfs mount: no dedup");
  }
  if (file_offsets == nullptr && file_offset % kHashUnit != 0) {
    return Fail(EINVAL, "dedup file offset " + std::to_string(file_offset) + " is not a multiple of 256 KiB");
  }
  if (n_units == 0) return 0;
  if (hashes == nullptr || needed == nullptr) return Fail(EFAULT, "null hashes or needed");
  if (file_offsets != nullptr) {
    for (size_t i = 0; i < n_units; ++i) {
      if (file_offsets[i] % kHashUnit != 0) {
        return Fail(EINVAL, "dedup unit " + std::to_string(i) + " at file offset " + std::to_string(file_offsets[i]) +
                                " is not at a multiple of 256 KiB");
      }
      if (i > 0 && file_offsets[i] <= file_offsets[i - 1]) {
        return Fail(EINVAL, "dedup units must be sorted by file offset without overlap: unit " + std::to_string(i) +
                                " at " + std::to_string(file_offsets[i]) +
                                (file_offsets[i] == file_offsets[i - 1] ? " repeats" : " comes after") + " unit " +
                                std::to_string(i - 1) + " at " + std::to_string(file_offsets[i - 1]));
      }
    }
  }
  if (file->backend == Backend::kMemoryIo) {
    // The daemon shares units as it writes them, by the hashes of the bytes
    // it is given (a caller who may not open the data area is not trusted
    // with naming units by hash): every unit is written, none mapped here.
    std::fill(needed, needed + n_units, uint8_t{1});
    return 0;
  }
  auto unit_offset = [&](size_t i) { return file_offsets ? file_offsets[i] : file_offset + i * kHashUnit; };
  if (file->client) file->client->AdoptAfterFork();
  file->Changed();
  ControlChannel* control = nullptr;
  if (int rc = FileControl(file, &control); rc != 0) return rc == -ENOTSUP ? -EOPNOTSUPP : rc;
  // The daemon grows the file over the units it maps: while it may, this
  // counts as a write in flight (a write request ending meanwhile must not
  // cut the file back), and its end sets the size.
  uint64_t mapped_end = 0;
  file->BeginWrite();
  const int rc = DedupBatches(file, control, n_units, unit_offset, hashes, needed, &mapped_end);
  const int sized = file->EndWrite(true, mapped_end, 0);  // mapped_end: of the batches answered
  return rc != 0 ? rc : sized;
}

// 0, or -ENODEV where `device` (>= 0) is no CUDA device this library can use.
int CheckHashDevice(int32_t device) {
  if (spillfs::cuda::Available() && device < spillfs::cuda::DeviceCount()) return 0;
  return Fail(ENODEV, "no usable CUDA device " + std::to_string(device) + " (or the library was built without CUDA)");
}

// 0, or the failure of hashing units on CUDA `device`.
int HashedOnDevice(int32_t device, const Status& s) {
  return s.ok() ? 0 : Fail(s.code(), "unit hashes on CUDA device " + std::to_string(device) + ": " + s.message());
}

int HashUnits(const void* ptr, uint64_t length, int32_t device, uintptr_t stream, uint64_t* out) {
  const uint64_t units = length / kHashUnit;
  if (units == 0) return 0;
  if (ptr == nullptr || out == nullptr) return Fail(EFAULT, "null buffer or output");
  auto* hashes = reinterpret_cast<spillfs::cuda::Hash128*>(out);
  if (device >= 0) {
    if (int rc = CheckHashDevice(device); rc < 0) return rc;
    return HashedOnDevice(device, spillfs::cuda::UnitHashes(ptr, units * kHashUnit, kHashUnit, hashes, stream));
  }
  if (device != -1) return Fail(EINVAL, "device must be -1 (host) or a CUDA device");
  if (spillfs::cuda::Available() && spillfs::cuda::PointerDevice(ptr) >= 0) {
    return Fail(EINVAL, "the buffer is CUDA device memory but was given as host memory");
  }
  unsigned threads = Settings().hash_threads.load();
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u);
  threads = static_cast<unsigned>(std::min<uint64_t>(threads, std::max<uint64_t>(1, units / 64)));
  const char* base = static_cast<const char*>(ptr);
  auto hash = [&](uint64_t from, uint64_t to) {
    for (uint64_t u = from; u < to; ++u) {
      XXH128_hash_t h = ContentHash128(base + u * kHashUnit, kHashUnit);
      hashes[u] = spillfs::cuda::Hash128{h.low64, h.high64};
    }
  };
  std::vector<std::thread> helpers;
  const uint64_t share = (units + threads - 1) / threads;
  for (unsigned t = 1; t < threads; ++t) {
    const uint64_t from = t * share, to = std::min(units, from + share);
    if (from >= to) break;
    try {
      helpers.emplace_back(hash, from, to);
    } catch (const std::system_error&) {
      hash(from, to);  // no thread to be had: here
    }
  }
  hash(0, std::min(units, share));
  for (std::thread& h : helpers) h.join();
  return 0;
}

}  // namespace
}  // namespace spillfs::client

using namespace spillfs::client;

extern "C" {

spill_file* spill_file_open(const char* path, int flags, uint64_t size_hint) {
  ClearError();
  return OpenFile(path, flags, size_hint);
}

int spill_file_backend(spill_file* file) {
  ClearError();
  if (file == nullptr) return Fail(EINVAL, "null file");
  return static_cast<int>(file->backend);
}

int spill_file_write_segments(spill_file* file, const spill_segment* segments, size_t n, uintptr_t stream,
                              spill_request** out) {
  ClearError();
  return Start(file, segments, n, stream, out, /*write=*/true);
}

int spill_file_read_segments(spill_file* file, const spill_segment* segments, size_t n, uintptr_t stream,
                             spill_request** out) {
  ClearError();
  return Start(file, segments, n, stream, out, /*write=*/false);
}

int spill_request_wait(spill_request* request, spill_io_stats* stats) {
  ClearError();
  if (request == nullptr) return Fail(EINVAL, "null request");
  if (request->worker.joinable()) request->worker.join();
  if (stats != nullptr) *stats = request->stats;
  const int rc = request->rc;
  if (rc != 0) Fail(-rc, request->message);
  delete request;
  return rc;
}

int spill_file_sync(spill_file* file) {
  ClearError();
  if (file == nullptr) return Fail(EINVAL, "null file");
  if (fsync(file->fd) != 0) {
    int e = errno;
    return Fail(e, WithErrno("fsync of " + file->path, e));
  }
  return 0;
}

int spill_file_truncate(spill_file* file, uint64_t size) {
  ClearError();
  if (file == nullptr) return Fail(EINVAL, "null file");
  if ((file->flags & SPILL_FILE_WRITE) == 0) return Fail(EBADF, file->path + " was not opened for writing");
  if (file->requests_in_flight.load() > 0) return Fail(EBUSY, "a request of " + file->path + " is in flight");
  std::lock_guard lock(file->size_mu);
  if (ftruncate(file->fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    return Fail(e, WithErrno("cannot truncate " + file->path, e));
  }
  file->size = size;
  file->padded_end = 0;
  file->Changed();
  return 0;
}

int spill_file_close(spill_file* file) {
  ClearError();
  if (file == nullptr) return 0;
  if (file->requests_in_flight.load() > 0) return Fail(EBUSY, "a request of " + file->path + " is in flight");
  delete file;
  return 0;
}

int spill_file_dedup(spill_file* file, uint64_t file_offset, const uint64_t* hashes, size_t n_units, uint8_t* needed) {
  ClearError();
  return Dedup(file, file_offset, nullptr, hashes, n_units, needed);
}

int spill_file_dedup_units(spill_file* file, const uint64_t* file_offsets, const uint64_t* hashes, size_t n_units,
                           uint8_t* needed) {
  ClearError();
  if (n_units > 0 && file_offsets == nullptr) return Fail(EFAULT, "null file offsets");
  return Dedup(file, 0, file_offsets, hashes, n_units, needed);
}

int spill_hash_units(const void* ptr, uint64_t length, int32_t device, uintptr_t stream, uint64_t* out) {
  ClearError();
  return HashUnits(ptr, length, device, stream, out);
}

int spill_hash_units_many(const void* const* ptrs, const uint64_t* lengths, size_t n, int32_t device, uintptr_t stream,
                          uint64_t* out) {
  ClearError();
  if (n > 0 && (ptrs == nullptr || lengths == nullptr)) return Fail(EFAULT, "null buffer list");
  if (device < 0) {
    for (size_t i = 0; i < n; ++i) {
      if (int rc = HashUnits(ptrs[i], lengths[i], device, stream, out); rc < 0) return rc;
      out += 2 * (lengths[i] / kHashUnit);
    }
    return 0;
  }
  if (int rc = CheckHashDevice(device); rc < 0) return rc;
  std::vector<spillfs::cuda::DeviceSpan> spans(n);
  for (size_t i = 0; i < n; ++i) spans[i] = {ptrs[i], lengths[i] / kHashUnit * kHashUnit};
  return HashedOnDevice(device,
                        spillfs::cuda::UnitHashesOfSpans(spans.data(), n, kHashUnit,
                                                         reinterpret_cast<spillfs::cuda::Hash128*>(out), stream));
}

const char* spill_version(void) { return SPILLFS_VERSION; }

int spill_config_set(const char* key, uint64_t value) {
  ClearError();
  if (key == nullptr) return Fail(EINVAL, "null key");
  return SetSetting(key, value);
}

}  // extern "C"
