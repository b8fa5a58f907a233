// The volume's two content hashes, computed over a GPU buffer by kernels, or
// over a host buffer by the same code on the CPU:
//  - UnitHashes: XXH3-128 of each whole dedup unit (256 KiB in spillfs), the
//    daemon's dedup key (ContentHash128 of spillfs/common/block_checksum.h);
//  - BlockChecksums: the low 32 bits of XXH3-64 of each block (4 KiB), the
//    checksum the volume keeps per block (BlockChecksum of the same header).
// A direct-path write from GPU memory can then hash on the GPU, where the
// bytes are, and cost the CPU nothing per byte.
//
// Kernels (long units of a 16-byte-aligned buffer, units a multiple of 64
// bytes): XXH3's 8 accumulator lanes are independent but for lane i taking
// lane i^1's input word, so each unit is split over a few threads that each
// own whole lane pairs (or single lanes, trading words by warp shuffle),
// loading their 16-byte column of each 64-byte stripe ahead of use. Other
// shapes (unaligned buffers, short or odd units, a partial last block) run
// the one-thread reference code of xxh3.h on the GPU.
//
// Error convention: Status; EINVAL for bad arguments or a pointer that is
// not device memory, ENOTSUP in a build without CUDA, ENODEV without a
// device, EIO for other CUDA failures (the message says which call).
// Threading: the functions are thread-safe; concurrent calls on one stream
// are ordered by the stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spillfs/common/status.h"
#include "spillfs/cuda/xxh3.h"

namespace spillfs::cuda {

inline constexpr size_t kDedupUnitBytes = 256 << 10;  // the daemon's dedup unit
inline constexpr size_t kChecksumBlockBytes = 4096;   // the volume's block

// How many hashes each function writes for `length` bytes.
inline size_t UnitCount(size_t length, size_t unit_bytes) { return unit_bytes ? length / unit_bytes : 0; }
inline size_t BlockCount(size_t length, size_t block_bytes) {
  return block_bytes ? (length + block_bytes - 1) / block_bytes : 0;
}

// XXH3-128 of each whole `unit_bytes` unit of `device_ptr[0, length)` into
// out_host[0, UnitCount(length, unit_bytes)); a trailing partial unit is not
// hashed. Runs on `stream` (a cudaStream_t; 0 is the legacy default stream)
// after the work already enqueued there, and returns when the hashes are in
// out_host (it synchronises the stream).
// REQUIRES: device_ptr is device (or managed) memory of one device, `stream`
// belongs to that device; unit_bytes > 0.
Status UnitHashes(const void* device_ptr, size_t length, size_t unit_bytes, Hash128* out_host, uintptr_t stream);

// A piece of GPU memory to hash (UnitHashesOfSpans).
struct DeviceSpan {
  const void* ptr = nullptr;
  size_t length = 0;
};

// UnitHashes of each of spans[0, n), one after another in out_host (span i's
// UnitCount(length, unit_bytes) hashes right after span i-1's): one scratch
// buffer, one copy and one synchronisation of `stream` for all of them, where
// a call a span costs one each (a checkpoint has hundreds of storages).
// REQUIRES: every span in device memory of the device `stream` belongs to;
// unit_bytes > 0.
Status UnitHashesOfSpans(const DeviceSpan* spans, size_t n, size_t unit_bytes, Hash128* out_host, uintptr_t stream);

// The low 32 bits of XXH3-64 of each `block_bytes` block of
// `device_ptr[0, length)` into out_host[0, BlockCount(length, block_bytes));
// a partial last block is hashed over its bytes. Stream and requirements as
// UnitHashes.
Status BlockChecksums(const void* device_ptr, size_t length, size_t block_bytes, uint32_t* out_host, uintptr_t stream);

// The same over host memory, on the calling thread, with the same code (the
// portable scalar loop: about 2.3 GB/s on the 2-core VM). To hash host data
// in production, common/block_checksum.h's functions (libxxhash, AVX2 where
// the CPU has it) give the same values faster; these are the reference the
// kernels are checked against.
// REQUIRES: unit_bytes > 0 (block_bytes > 0).
Status UnitHashesHost(const void* data, size_t length, size_t unit_bytes, Hash128* out);
Status BlockChecksumsHost(const void* data, size_t length, size_t block_bytes, uint32_t* out);

}  // namespace spillfs::cuda
